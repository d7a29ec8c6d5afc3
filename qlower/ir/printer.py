"""A stable text form of graphs, for golden tests and for users debugging (``exact=True``: the
form ``qlower.ir.parser`` reads back, see ``qlower.ir.text``).

    graph main(%x: int8[1x8x8x3] {s=0.1 zp=-3}) {
      %w = constant int8[4x3x3x3] {s=[..] zp=0 axis=0}
      %conv = conv2d(%x, %w, none) {stride=(1, 1), ...} : int32[1x8x8x4] {...}
      return %conv
    }
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qlower.ir.graph import Graph, Op, Operand
from qlower.ir.opdefs import op_def
from qlower.ir.text import attr_text, type_text


def _fmt_attr(value: Any) -> str:
    if isinstance(value, np.ndarray):
        if value.size <= 8:
            return f"{value.dtype}{list(value.shape)}{value.reshape(-1).tolist()}"
        return f"{value.dtype}{list(value.shape)}"
    if hasattr(value, "value") and value.__class__.__name__ == "DType":
        return value.value
    return str(value)


def _fmt_operand(o: Operand) -> str:
    if o is None:
        return "none"
    if isinstance(o, tuple):
        return "(" + ", ".join(f"%{v.name}" for v in o) + ")"
    return f"%{o.name}"


def _shown(op: Op) -> list[tuple[str, object]]:
    """The attributes to print: a flag whose default is off (add's ``wrap``) only when set, since its
    absence reads as that default and the parser fills defaults in."""
    defaults = op_def(op.kind).attrs
    return [(k, v) for k, v in sorted(op.attrs.items()) if not (v is False and defaults.get(k) is False)]


def print_op(op: Op, show_types: bool = True, exact: bool = False) -> str:
    """One op as text; ``exact``: every bit of every attribute and type (``qlower.ir.parser`` reads it)."""
    results = ", ".join(f"%{r.name}" for r in op.results)
    if exact:
        args = ", ".join(_fmt_operand(o) for o in op.operands)
        attrs = ", ".join(f"{k}={attr_text(v)}" for k, v in _shown(op))
        return (f"{results} = {op.kind}({args})" + (" {" + attrs + "}" if attrs else "")
                + " : " + ", ".join(type_text(r.type) for r in op.results))
    if op.kind == "constant":
        data = op.attrs["data"]
        body = f"constant {_fmt_attr(data)}" if data.size <= 8 else "constant"
        return f"{results} = {body} : {op.result.type}"
    args = ", ".join(_fmt_operand(o) for o in op.operands)
    attrs = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in _shown(op))
    text = f"{results} = {op.kind}({args})"
    if attrs:
        text += " {" + attrs + "}"
    if show_types:
        text += " : " + ", ".join(str(r.type) for r in op.results)
    return text


def print_graph(graph: Graph, show_types: bool = True, exact: bool = False) -> str:
    """The graph as text; ``exact``: the form ``qlower.ir.parser.parse_graph`` reads back to an equal
    graph (every scale, zero point and constant in full, every type shown)."""
    params = ", ".join(f"%{v.name}: {type_text(v.type) if exact else v.type}" for v in graph.inputs)
    lines = [f"graph {graph.name}({params}) {{"]
    lines += ["  " + print_op(op, show_types, exact) for op in graph.ops]
    lines.append("  return " + ", ".join(f"%{v.name}" for v in graph.outputs))
    lines.append("}")
    return "\n".join(lines)
