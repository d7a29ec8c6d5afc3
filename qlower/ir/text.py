"""The exact text form of IR values: what ``print_graph(exact=True)`` writes and ``parse_graph`` reads.

The default printer rounds scales to 6 digits and leaves out large constants (for people reading);
the exact form keeps every bit, so a graph printed exactly parses back to an equal graph:
floats as Python's shortest round-tripping ``repr``, every scale and zero point, every constant.

    type      int8[1x4x4x2] {s=0.1 zp=-3 q=[-127,127] axis=0 dynamic=per_row}   (quant parts optional)
    attr      none | true | false | 3 | 0.5 | "text" | int8 (a dtype) | (1, 2) | [1, 2]
              | quant(int8 {s=0.1 zp=0}) | type(int8[2] {...}) | array(float32[2x2], [1.0, 2.0, 3.0, 4.0])
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from qlower.ir.dtypes import DType
from qlower.ir.graph import TensorType
from qlower.ir.quant import QuantSpec


def _num(x: float | int) -> str:
    if isinstance(x, float):
        return repr(x) if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))
    return str(x)


def _nums(values: tuple) -> str:
    return _num(values[0]) if len(values) == 1 else "[" + ",".join(_num(v) for v in values) + "]"


def quant_text(q: QuantSpec, dtype: DType) -> str:
    parts = [f"s={_nums(q.scale)}", f"zp={_nums(q.zero_point)}"]
    if (q.qmin, q.qmax) != (q.dtype.min, q.dtype.max):
        parts.append(f"q=[{q.qmin},{q.qmax}]")
    if q.axis is not None:
        parts.append(f"axis={q.axis}")
    if q.dynamic:
        parts.append(f"dynamic={q.dynamic}")
    if q.dtype is not dtype:   # a spec of another dtype than its tensor's (said, never assumed)
        parts.append(f"dtype={q.dtype.value}")
    return "{" + " ".join(parts) + "}"


def type_text(t: TensorType) -> str:
    dims = "x".join(str(d) for d in t.shape) if t.shape else "scalar"
    return f"{t.dtype.value}[{dims}]" + (f" {quant_text(t.quant, t.dtype)}" if t.quant is not None else "")


def attr_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return _num(float(value))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, DType):
        return value.value
    if isinstance(value, QuantSpec):
        return f"quant({value.dtype.value} {quant_text(value, value.dtype)})"
    if isinstance(value, TensorType):
        return f"type({type_text(value)})"
    if isinstance(value, np.ndarray):
        dims = "x".join(str(d) for d in value.shape) if value.shape else "scalar"
        return f"array({value.dtype.name}[{dims}], [{', '.join(attr_text(v) for v in value.reshape(-1).tolist())}])"
    if isinstance(value, tuple):
        inner = ", ".join(attr_text(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(attr_text(v) for v in value) + "]"
    raise TypeError(f"no exact text for an attribute of type {type(value).__name__}")
