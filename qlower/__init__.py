"""qlower: PyTorch → int8 programs for CPUs and Arm NPUs, verified stage by stage."""

from qlower.api import compile, verify
from qlower.frontend.config import QuantConfig
from qlower.program import Program
from qlower.program.fileformat import load

__version__ = "0.1.0"
__all__ = ["Program", "QuantConfig", "compile", "load", "verify"]
