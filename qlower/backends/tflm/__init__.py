"""TFLM backend: the supported graph as a .tflite that TensorFlow Lite Micro's interpreter runs bit-exact."""

from qlower.backends.tflm.backend import TflmBackend
from qlower.backends.tflm.export import export_tflm

__all__ = ["TflmBackend", "export_tflm"]
