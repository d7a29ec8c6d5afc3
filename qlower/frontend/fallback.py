"""Import of an op without an integer rule as a float fallback (DESIGN.md rule 8).

The op becomes one IR ``aten`` op in PyTorch layout: quantized operands are
dequantized (explicit ``dequantize`` ops), integer tensors (indices, token ids)
pass as plain integers, the aten op's constant arguments are stored as JSON.
Where PT2E quantizes the result, the following quantize node imports as an
explicit ``quantize``, so the rest of the graph stays integer.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.fx import Node
from torch.utils import _pytree as pytree

from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref
from qlower.ir import DType, QuantSpec, TensorType, Value
from qlower.ir.ops_calls import ATEN_DTYPES
from qlower.reference.aten_fallback import Operand, dtype_name, encode_call, fallback_reason, is_core_aten

PLAIN_INT32 = QuantSpec.plain_integer(DType.INT32)


def ir_type(val: torch.Tensor) -> TensorType:
    """How the IR holds a PyTorch tensor crossing a fallback: float32, bool, or plain int32."""
    dtype = ATEN_DTYPES[dtype_name(val.dtype)]
    return TensorType(tuple(int(d) for d in val.shape), dtype, PLAIN_INT32 if dtype.is_integer else None)


def plain_integer_constant(ctx: ImportContext, data: np.ndarray) -> Value:
    data = np.asarray(data)
    if data.size and (data.min() < DType.INT32.min or data.max() > DType.INT32.max):
        raise ctx.unsupported("an integer constant outside the int32 range")
    return ctx.constant(data.astype(np.int32), PLAIN_INT32)


def _operand(ctx: ImportContext, node: Node) -> tuple[Value, str]:
    """A tensor argument in PyTorch layout and the torch dtype the op receives it as (quantize/dequantize
    nodes written by PT2E carry no metadata: what they hold is float32)."""
    ref = ctx.env.get(node)
    if not isinstance(ref, Ref):
        raise ctx.unsupported(f"argument '{node.name}' is not a tensor the float fallback can take")
    val = node.meta.get("val")
    identity = layout.identity(ref.rank)
    plain = ref.spec is not None and ref.spec.is_plain_integer and ref.scale is None
    if ref.is_const and ref.quant is None and ref.data.dtype.kind in "biu":
        if ref.data.dtype.kind == "b":
            return ctx.constant(ref.data.astype(np.bool_)), "bool"
        return plain_integer_constant(ctx, ref.data), dtype_name(val.dtype) if val is not None else "int64"
    if plain or (not ref.is_const and ref.value.dtype is DType.BOOL):
        value = ctx.value_in(ref, identity)
        torch_dtype = dtype_name(val.dtype) if isinstance(val, torch.Tensor) else (
            "bool" if value.dtype is DType.BOOL else "int64")
        return value, torch_dtype
    torch_dtype = dtype_name(val.dtype) if isinstance(val, torch.Tensor) and val.dtype.is_floating_point \
        else "float32"
    return ctx.as_float(ref, identity), torch_dtype


def can_fall_back(node: Node) -> bool:
    target = node.target
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and target.namespace == "aten" and is_core_aten(str(target)))


def import_fallback(ctx: ImportContext, node: Node) -> Ref | tuple[Ref, ...]:
    """``node`` as a float ``aten`` op; its result(s) as Refs in PyTorch layout."""
    target = str(node.target)
    operands: list[Value] = []
    in_dtypes: list[str] = []

    def mark(a: object) -> object:
        if not isinstance(a, Node):
            return a
        value, dtype = _operand(ctx, a)
        operands.append(value)
        in_dtypes.append(dtype)
        return Operand(len(operands) - 1)

    args = pytree.tree_map(mark, node.args)
    kwargs = pytree.tree_map(mark, dict(node.kwargs))
    try:
        text = encode_call(args, kwargs)
    except TypeError as e:
        raise ctx.unsupported(f"{fallback_reason(target)}, but {e}") from None
    val = node.meta.get("val")
    results = list(val) if isinstance(val, (tuple, list)) else [val]
    if not results or not all(isinstance(r, torch.Tensor) for r in results):
        raise ctx.unsupported(f"{fallback_reason(target)}, but its result is not a tensor or a tuple of tensors")
    try:
        out_types = tuple(ir_type(r) for r in results)
        out_dtypes = tuple(dtype_name(r.dtype) for r in results)
    except TypeError as e:
        raise ctx.unsupported(f"{fallback_reason(target)}, but {e}") from None
    values = ctx.emit_multi("aten", tuple(operands), perm=(), target=target, args=text, in_dtypes=tuple(in_dtypes),
                            out_types=out_types, out_dtypes=out_dtypes)
    refs = tuple(Ref.of(v, layout.identity(v.type.rank)) for v in values)
    return refs if isinstance(val, (tuple, list)) else refs[0]
