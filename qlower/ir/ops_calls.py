"""Op definitions that call out of the graph: delegate (a compiled partition) and aten (a float fallback)."""

from __future__ import annotations

from qlower.ir.dtypes import DType
from qlower.ir.graph import TensorType
from qlower.ir.opdefs import REQUIRED, register
from qlower.ir.type_rules import (
    fail,
)


@register("delegate", ("inputs*",), results=-1, partition=REQUIRED, in_types=REQUIRED, out_types=REQUIRED)
def _delegate(ops, attrs):
    """A call into a compiled partition; its boundary types are what the backend reads and
    writes (DESIGN.md rule 6), so the operands must have exactly ``in_types``."""
    (xs,) = ops
    want = tuple(attrs["in_types"])
    if tuple(xs) != want:
        raise fail("delegate", f"partition '{attrs['partition']}' reads {[str(t) for t in want]}, "
                                f"got {[str(t) for t in xs]}")
    return tuple(attrs["out_types"])


# PyTorch dtype names a float fallback may exchange with the IR, and the IR dtype that holds each
# (wider integers are narrowed to int32 with a range check at run time; other floats to float32).
ATEN_DTYPES = {"float32": DType.FLOAT32, "float64": DType.FLOAT32, "float16": DType.FLOAT32,
               "bfloat16": DType.FLOAT32, "bool": DType.BOOL, "int64": DType.INT32, "int32": DType.INT32,
               "int16": DType.INT32, "int8": DType.INT32, "uint8": DType.INT32}


def _aten_operand_type(t: TensorType, torch_dtype: str, what: str) -> None:
    if torch_dtype not in ATEN_DTYPES:
        raise fail("aten", f"{what}: unsupported dtype {torch_dtype!r}; known: {sorted(ATEN_DTYPES)}")
    if t.dtype is not ATEN_DTYPES[torch_dtype]:
        raise fail("aten", f"{what}: a {torch_dtype} tensor is held as {ATEN_DTYPES[torch_dtype].value}, got {t}")
    if t.dtype.is_integer and (t.quant is None or not t.quant.is_plain_integer):
        raise fail("aten", f"{what}: integer tensors are plain integers (scale 1, zero point 0), got {t}")


@register("aten", ("inputs*",), results=-1, target=REQUIRED, args=REQUIRED, in_dtypes=REQUIRED,
          out_types=REQUIRED, out_dtypes=REQUIRED)
def _aten(ops, attrs):
    """A float fallback: the PyTorch core ATen op ``target`` (e.g. ``aten.abs.default``) called with
    ``args`` (JSON; tensor operands are ``{"input": i}``) on the operands as PyTorch tensors of
    ``in_dtypes``. Quantized values reach it dequantized; its results are ``out_types``."""
    (xs,) = ops
    in_dtypes, out_types, out_dtypes = tuple(attrs["in_dtypes"]), tuple(attrs["out_types"]), tuple(attrs["out_dtypes"])
    if not isinstance(attrs["target"], str) or not attrs["target"].startswith("aten."):
        raise fail("aten", f"target must name an aten op ('aten.NAME.OVERLOAD'), got {attrs['target']!r}")
    if not isinstance(attrs["args"], str):
        raise fail("aten", "args must be a JSON string")
    if len(in_dtypes) != len(xs) or len(out_dtypes) != len(out_types) or not out_types:
        raise fail("aten", f"{len(xs)} operands with {len(in_dtypes)} dtypes, {len(out_types)} results with "
                            f"{len(out_dtypes)} dtypes")
    for i, (t, d) in enumerate(zip(xs, in_dtypes)):
        _aten_operand_type(t, d, f"operand {i}")
    for i, (t, d) in enumerate(zip(out_types, out_dtypes)):
        if not isinstance(t, TensorType):
            raise fail("aten", f"result {i} must be a TensorType")
        _aten_operand_type(t, d, f"result {i}")
    return out_types
