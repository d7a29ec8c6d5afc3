"""LiteRT backend: the supported graph as one .tflite, run by the stock LiteRT (TensorFlow Lite) interpreter."""

from qlower.backends.litert.backend import LiteRtBackend
from qlower.backends.litert.export import export_tflite

__all__ = ["LiteRtBackend", "export_tflite"]
