"""The op registry: one table from op kind to operands, attributes and type inference.

Layout is NHWC throughout (DESIGN.md rule 4). Integer values always carry a
QuantSpec, so every op's result type, including an accumulator's derived
scale, follows from its operand types and attributes. The builder infers result
types from this table and the verifier re-infers them to check a graph.

Operand names ending in ``?`` are optional (None when absent), ``*`` variadic.
The definitions live by concern in ``ops_linear`` (conv, FC, matmul, pools, reductions),
``ops_arith`` (elementwise, tables, softmax), ``ops_layout`` (data movement), ``ops_quant``
(quantize, dequantize, cast) and ``ops_calls`` (delegate, aten), on the shared rules of
``type_rules``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from qlower.errors import IRError
from qlower.ir.graph import TensorType
from qlower.registry import Registry

OperandTypes = Sequence[TensorType | None | tuple[TensorType, ...]]
InferFn = Callable[[OperandTypes, dict[str, Any]], tuple[TensorType, ...]]


@dataclass(frozen=True)
class OpDef:
    kind: str
    operands: tuple[str, ...]
    attrs: dict[str, Any]          # name -> default (REQUIRED when it has none)
    infer: InferFn
    doc: str = ""
    results: int = 1  # -1: as many as the attributes say (delegate)

    def operand_is_optional(self, i: int) -> bool:
        return self.operands[i].endswith("?")

    def operand_is_variadic(self, i: int) -> bool:
        return self.operands[i].endswith("*")


REQUIRED = object()
OPS: Registry[str, OpDef] = Registry("IR op definitions")


def register(kind: str, operands: tuple[str, ...], results: int = 1, **attrs: Any):
    def wrap(fn: InferFn) -> InferFn:
        OPS.add(kind, OpDef(kind, operands, attrs, fn, (fn.__doc__ or "").strip(), results))
        return fn
    return wrap


def op_def(kind: str) -> OpDef:
    try:
        return OPS[kind]
    except KeyError:
        raise IRError(f"unknown op kind '{kind}'") from None


def normalize_attrs(kind: str, attrs: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults, reject unknown or missing attributes."""
    d = op_def(kind)
    unknown = set(attrs) - set(d.attrs)
    if unknown:
        raise IRError(f"{kind}: unknown attribute(s) {sorted(unknown)}; known: {sorted(d.attrs)}")
    out = {}
    for name, default in d.attrs.items():
        if name in attrs:
            out[name] = attrs[name]
        elif default is REQUIRED:
            raise IRError(f"{kind}: missing attribute '{name}'")
        else:
            out[name] = default
    return out


def infer_types(kind: str, operand_types: OperandTypes, attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    d = op_def(kind)
    if len(operand_types) != len(d.operands):
        raise IRError(f"{kind}: expected {len(d.operands)} operands {d.operands}, got {len(operand_types)}")
    for i, t in enumerate(operand_types):
        if t is None and not d.operand_is_optional(i):
            raise IRError(f"{kind}: operand '{d.operands[i]}' is required")
        if isinstance(t, tuple) != d.operand_is_variadic(i):
            raise IRError(f"{kind}: operand '{d.operands[i]}' must {'' if d.operand_is_variadic(i) else 'not '}be a tuple")
    return d.infer(operand_types, attrs)


# the op definitions register themselves in OPS when imported (at the end: they use ``register``)
from qlower.ir import ops_arith, ops_calls, ops_layout, ops_linear, ops_quant  # noqa: E402,F401
