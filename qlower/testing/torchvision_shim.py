"""Import torchvision's Python code when its native extension cannot load (test and benchmark builders only).

timm and ultralytics import torchvision at import time. The torchvision wheels that match torch 2.13 on the
package index are CUDA builds: their ``torchvision/_C.so`` links ``libc10_cuda.so``, which the CPU torch does not
ship, so the extension fails to load and ``torchvision/__init__.py`` then fails in ``_meta_registrations``, which
registers fake kernels for ``torchvision::nms`` and friends - operators only ``_C.so`` defines. The models built
here (timm backbones, YOLO's layers) never call those native operators in their forward pass, so an empty
``_meta_registrations`` is enough for the rest of torchvision's Python to import. qlower itself never imports this
module, nor torchvision.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

_META = "torchvision._meta_registrations"


def _native_extension_loads() -> bool:
    """Whether torchvision's ``_C`` extension loads beside this torch (checked without importing torchvision)."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return True  # not installed: the real import raises the usual ModuleNotFoundError
    import torch
    folder = Path(spec.origin).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        library = folder / f"_C{suffix}"
        if library.exists():
            try:
                torch.ops.load_library(str(library))
            except OSError:
                return False
            return True
    return False


def import_torchvision() -> types.ModuleType:
    """Import torchvision; when its native extension can't load, without the fake kernels of its native ops.

    Idempotent. With a torchvision whose ``_C`` loads, this is a plain ``import torchvision``.
    """
    if "torchvision" not in sys.modules and _META not in sys.modules and not _native_extension_loads():
        # the real module would raise "operator torchvision::nms does not exist" registering fake kernels of
        # operators that only the unloadable _C.so defines; nothing the builders run needs them
        sys.modules[_META] = types.ModuleType(_META)
    import torchvision
    return torchvision
