"""Element types of IR values."""

from __future__ import annotations

import enum

import numpy as np


class DType(enum.Enum):
    """Element type of a tensor. Integer types hold quantized codes (see QuantSpec)."""

    BOOL = "bool"
    INT8 = "int8"
    UINT8 = "uint8"
    INT16 = "int16"
    INT32 = "int32"
    FLOAT32 = "float32"

    @property
    def is_float(self) -> bool:
        return self is DType.FLOAT32

    @property
    def is_integer(self) -> bool:
        return self in _INT_RANGES

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(self.value)

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @property
    def min(self) -> int:
        return _INT_RANGES[self][0]

    @property
    def max(self) -> int:
        return _INT_RANGES[self][1]

    @staticmethod
    def from_numpy(dtype: np.dtype | type) -> DType:
        name = np.dtype(dtype).name
        try:
            return DType(name)
        except ValueError:
            raise TypeError(f"no qlower dtype for numpy dtype {name}") from None

    def __repr__(self) -> str:
        return self.value


_INT_RANGES: dict[DType, tuple[int, int]] = {
    DType.INT8: (-128, 127),
    DType.UINT8: (0, 255),
    DType.INT16: (-32768, 32767),
    DType.INT32: (-(2**31), 2**31 - 1),
}
