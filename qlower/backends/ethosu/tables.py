"""An int16 lookup on an Ethos-U: TOSA's interpolated 513-entry TABLE where it stays within a step.

The frontend writes a function of int16 codes (hardswish, sigmoid, ... under A16W8) as an exact
65,536-entry ``table``: fake-quant's own codes. TOSA has no such table for int16, so it lowers as a
GATHER, which Vela runs slowly (MobileNetV3-small A16W8 on U85: most of its cycles). TOSA's int16
TABLE holds a knot every 128 codes and interpolates linearly between them (``table_interp``, an
int32 in 1/128 steps), and a RESCALE rounds it to the output codes.

That is another function, so it is a rewrite of the program's form (``InterpolatedTables``,
declared within one step per rewritten table, as means.py): the NPU stays bit-exact with the
interpolated form, which may be a step from the canonical program. It is taken only when it is proven within one step of the exact table for *every* int16
code (all 65,536 are computed: the function has no other inputs), so the reference stays within
a step of fake-quant; and only where Vela costs it lower than the GATHER for the target.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from qlower.backends.ethosu.vela import VelaConfig
from qlower.ir import DType, Graph, GraphBuilder, Op, QuantSpec, TensorType, Value, rebuild
from qlower.ir.ops_arith import INTERP_ENTRIES
from qlower.ir.rewrite import Rewrite, Rewritten
from qlower.reference import run_graph

CODES = np.arange(-32768, 32768, dtype=np.int64)
MAX_STEPS = 1   # the furthest the interpolated codes may be from the exact table's


def _on_every_code(x_quant: QuantSpec, form) -> np.ndarray:
    """What the reference computes, for every int16 code, of ``form(builder, x)`` (one output)."""
    b = GraphBuilder("codes")
    x = b.input("x", TensorType((CODES.size,), DType.INT16, x_quant))
    return run_graph(b.build([form(b, x)]), [CODES.astype(np.int16)])[0].astype(np.int64)


def _knots(exact: np.ndarray, offset: int) -> np.ndarray | None:
    """513 int16 knots whose linear interpolation best fits ``exact - offset`` (least squares over
    all 65,536 codes, rounded and held within int16; the caller proves the result). None when the
    codes leave int16."""
    centered = (exact - offset).astype(np.float64)
    if centered.min() < DType.INT16.min or centered.max() > DType.INT16.max:
        return None
    v = CODES + 32768
    seg, hi = v >> 7, (v & 127) / 128.0
    lo = 1.0 - hi
    n = INTERP_ENTRIES
    ata = np.zeros((n, n))
    np.add.at(ata, (seg, seg), lo * lo)
    np.add.at(ata, (seg + 1, seg + 1), hi * hi)
    np.add.at(ata, (seg, seg + 1), lo * hi)
    np.add.at(ata, (seg + 1, seg), lo * hi)
    atb = np.bincount(seg, lo * centered, n) + np.bincount(seg + 1, hi * centered, n)
    knots = np.linalg.solve(ata, atb)
    return np.clip(np.rint(knots), DType.INT16.min, DType.INT16.max).astype(np.int64)


@dataclass(frozen=True)
class Interpolation:
    knots: np.ndarray   # int16[513]: the output codes minus ``offset``
    offset: int         # the output zero point, or the codes' midpoint (added back by an int32 ADD)


def _interpolated(b: GraphBuilder, x: Value, form: Interpolation, out: QuantSpec, like: Value | None = None) -> Value:
    """``x``'s codes through the interpolated table, rescaled to ``out`` (named as ``like``, the
    table's result it stands for, so that reports find the layer)."""
    fine = QuantSpec.per_tensor(out.scale[0] / 128, 0, DType.INT32)
    origin = like.origin if like is not None else None
    hint = like.name if like is not None else None
    acc = b.op("table_interp", x, table=form.knots.astype(np.int16), out=fine,
               name=f"{hint}_interp" if hint else None, origin=origin)
    shift = form.offset - out.zero_point[0]
    if shift:
        const = b.constant(np.full((1,) * x.type.rank, 128 * shift, np.int32), fine, name=f"{hint or 'table'}_offset")
        acc = b.op("add", acc, const, name=f"{hint}_offset" if hint else None, origin=origin)
    return b.op("rescale", acc, out=out, name=hint, origin=origin)


@functools.lru_cache(maxsize=64)
def _proven(x_quant: QuantSpec, table_bytes: bytes, offset: int, out: QuantSpec) -> Interpolation | None:
    """An interpolation within MAX_STEPS of the table for every int16 code, or None: knots of the
    codes themselves, else of the codes minus their midpoint (room for the ends' slopes)."""
    table = np.frombuffer(table_bytes, np.int16)
    exact = _on_every_code(x_quant, lambda b, x: b.op("table", x, table=table, offset=offset, out=out))
    for middle in (out.zero_point[0], int(exact.min() + exact.max()) // 2):
        knots = _knots(exact, middle)
        if knots is None:
            continue
        form = Interpolation(knots, middle)
        interpolated = _on_every_code(x_quant, lambda b, x, form=form: _interpolated(b, x, form, out))
        if np.abs(interpolated - exact).max() <= MAX_STEPS:
            return form
    return None


def candidates(graph: Graph) -> list[Op]:
    """The int16 -> int16 per-tensor tables of ``graph``."""
    return [op for op in graph.ops if op.kind == "table" and op.operands[0].type.dtype is DType.INT16
            and op.result.type.dtype is DType.INT16 and not op.operands[0].type.quant.is_per_channel
            and not op.attrs["out"].is_per_channel]


def _alone(op: Op, form: Interpolation | None) -> Graph:
    b = GraphBuilder("table")
    x = b.input("x", op.operands[0].type)
    if form is None:
        y = b.op("table", x, table=op.attrs["table"], offset=op.attrs["offset"], out=op.attrs["out"])
    else:
        y = _interpolated(b, x, form, op.attrs["out"])
    return b.build([y])


def interpolated_tables(graph: Graph, config: VelaConfig) -> Graph:
    """``graph`` with each int16 table that has a proven interpolated form Vela costs lower in it."""
    return InterpolatedTables(lambda op, form: cheaper(op, form, config)).apply(graph).graph


def cheaper(op: Op, form: Interpolation, config: VelaConfig) -> bool:
    """Whether Vela costs ``op`` lower in its interpolated ``form`` than as the GATHER."""
    from qlower.backends.ethosu.backend import graph_cycles

    gathered, interpolated = graph_cycles(_alone(op, None), config), graph_cycles(_alone(op, form), config)
    return interpolated is not None and (gathered is None or interpolated < gathered)


def proven_form(op: Op) -> Interpolation | None:
    """The interpolated form of an int16 table proven within MAX_STEPS of it on every code, or None."""
    table = np.ascontiguousarray(op.attrs["table"], np.int16)
    if not np.array_equal(table, op.attrs["table"]):
        return None   # entries beyond int16 (the cache key is the table as int16 bytes)
    return _proven(op.operands[0].type.quant, table.tobytes(), int(op.attrs["offset"]), op.attrs["out"])


class InterpolatedTables(Rewrite):
    """The rewrite of int16 tables into TOSA's interpolated TABLE where one is proven within a step
    on every code and ``choose(op, form)`` says so (Vela costs it lower)."""

    name = "ethosu.interpolated_table"
    steps = MAX_STEPS
    what = ("an int16 lookup as TOSA's interpolated 513-entry TABLE (proven within a step on all 65,536 "
            "codes) where Vela costs it lower than a GATHER")

    def __init__(self, choose: Callable[[Op, Interpolation], bool]):
        self.choose = choose

    def apply(self, graph: Graph) -> Rewritten:
        chosen: dict[Op, Interpolation] = {}
        for op in candidates(graph):
            form = proven_form(op)
            if form is not None and self.choose(op, form):
                chosen[op] = form
        if not chosen:
            return Rewritten(graph)

        def rewrite(b: GraphBuilder, op: Op, operands) -> tuple[Value, ...] | None:
            if op not in chosen:
                return None
            return (_interpolated(b, operands[0], chosen[op], op.attrs["out"], like=op.result),)

        return Rewritten(rebuild(graph, rewrite), tuple(op.result.name for op in chosen))
