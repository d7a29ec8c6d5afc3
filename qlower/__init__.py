"""qlower: PyTorch → int8 programs for CPUs and Arm NPUs, verified stage by stage."""

import qlower._quiet  # noqa: F401  (first: filters import-time noise of torchao)

# Load the verify package before binding the verify function: a package's first import
# sets it as an attribute of qlower, which would otherwise hide ``qlower.verify(...)``.
import qlower.verify as _verify_package  # noqa: F401,I001
from qlower.api import compile, verify
from qlower.backends.registry import targets
from qlower.frontend.config import QuantConfig
from qlower.program import Program
from qlower.program.fileformat import load

__version__ = "0.1.0"
__all__ = ["Program", "QuantConfig", "compile", "load", "targets", "verify"]
