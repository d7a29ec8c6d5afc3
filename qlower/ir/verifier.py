"""The verifier: DESIGN.md's rules that can be checked on a graph, as a table.

Each rule is one function that yields messages; ``verify_graph`` runs them all and
raises one VerificationError listing every broken rule. Type-derivation rules
(accumulator scales, shapes, broadcasting, optional operands, concat domains)
are checked by re-inferring every op's result types from the registry, so the
rule and the builder can never drift apart.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator

import numpy as np

from qlower.errors import IRError, VerificationError
from qlower.ir.dtypes import DType
from qlower.ir.graph import Graph, Op, TensorType, Value
from qlower.ir.opdefs import OPS, infer_types, normalize_attrs
from qlower.registry import Registry

Rule = Callable[[Graph], Iterator[str]]
RULES: Registry[str, Rule] = Registry("IR verifier rules")


def rule(name: str):
    return RULES.register(name)


def _where(v: Value) -> str:
    return f"%{v.name}" + (f" ({v.origin.describe()})" if v.origin else "")


@rule("ssa")
def _ssa(graph: Graph) -> Iterator[str]:
    """Every value is defined once, before it is used; outputs are defined."""
    defined: set[Value] = set()
    for v in graph.inputs:
        if v in defined:
            yield f"{_where(v)} is a graph input twice"
        defined.add(v)
    for op in graph.ops:
        for v in op.input_values():
            if v not in defined:
                yield f"{op.kind} producing {_where(op.results[0])} uses {_where(v)}, which is not defined before it"
        for r in op.results:
            if r in defined:
                yield f"{_where(r)} is defined twice"
            defined.add(r)
    for v in graph.outputs:
        if v not in defined:
            yield f"graph output {_where(v)} is not defined"


def _is_complete(t: object) -> bool:
    return (isinstance(t, TensorType) and isinstance(t.dtype, DType)
            and all(isinstance(d, int) and d >= 0 for d in t.shape))


@rule("complete-types")
def _complete_types(graph: Graph) -> Iterator[str]:
    """Every value has a shape of non-negative ints and a DType."""
    for v in graph.values():
        t = v.type
        if not isinstance(t, TensorType) or not isinstance(t.dtype, DType):
            yield f"{_where(v)} has no complete type: {t!r}"
        elif any(not isinstance(d, int) or d < 0 for d in t.shape):
            yield f"{_where(v)} has an invalid shape {t.shape}"


def _typed_values(graph: Graph) -> Iterator[Value]:
    """Values with complete types (the others are complete-types' to report)."""
    return (v for v in graph.values() if _is_complete(v.type))


@rule("integers-are-quantized")
def _integers_quantized(graph: Graph) -> Iterator[str]:
    """Integer values hold codes and carry a QuantSpec of their dtype; floats carry none."""
    for v in _typed_values(graph):
        t = v.type
        if t.dtype.is_integer and t.quant is None:
            yield f"{_where(v)} is {t.dtype.value} but carries no QuantSpec"
        elif t.quant is not None and (t.dtype.is_float or t.dtype is DType.BOOL):
            yield f"{_where(v)} is {t.dtype.value} but carries a QuantSpec {t.quant}"
        elif t.quant is not None and t.quant.dtype is not t.dtype:
            yield f"{_where(v)} is {t.dtype.value} but its QuantSpec says {t.quant.dtype.value}"


@rule("quant-spec-valid")
def _quant_valid(graph: Graph) -> Iterator[str]:
    """Scales positive and finite; ranges within the dtype; per-channel specs match their axis."""
    for v in _typed_values(graph):
        q = v.type.quant
        if q is None:
            continue
        lo, hi = q.dtype.min, q.dtype.max
        if q.scale and not (all(map(math.isfinite, q.scale)) and min(q.scale) > 0):
            yield f"{_where(v)} has a non-positive or non-finite scale {q.scale}"
        if not lo <= q.qmin <= q.qmax <= hi:
            yield f"{_where(v)} has range [{q.qmin}, {q.qmax}] outside {q.dtype.value}"
        if q.zero_point and not lo <= min(q.zero_point) <= max(q.zero_point) <= hi:
            yield f"{_where(v)} has a zero point outside {q.dtype.value}: {q.zero_point}"
        if len(q.zero_point) != len(q.scale):
            yield f"{_where(v)} has {len(q.scale)} scales but {len(q.zero_point)} zero points"
        if q.axis is None:
            if len(q.scale) != 1:
                yield f"{_where(v)} has {len(q.scale)} scales but no channel axis"
        elif not 0 <= q.axis < v.type.rank:
            yield f"{_where(v)} has channel axis {q.axis} outside rank {v.type.rank}"
        elif len(q.scale) != v.type.shape[q.axis]:
            yield f"{_where(v)} has {len(q.scale)} scales for {v.type.shape[q.axis]} channels on axis {q.axis}"


@rule("types-match-registry")
def _types_match(graph: Graph) -> Iterator[str]:
    """Each op's attributes are known and its result types are exactly what the registry infers
    (accumulator scale s_in * s_w, shapes, broadcasting, optional operands, shared domains)."""
    for op in graph.ops:
        if op.kind not in OPS:
            yield f"unknown op kind '{op.kind}' producing {_where(op.results[0])}"
            continue
        if not all(_is_complete(v.type) for v in (*op.input_values(), *op.results)):
            continue
        try:
            missing = sorted(set(normalize_attrs(op.kind, dict(op.attrs))) - set(op.attrs))
            if missing:
                yield (f"{op.kind} producing {_where(op.results[0])} lacks attribute(s) {missing}: "
                       "build ops with GraphBuilder, which fills in defaults")
                continue
            operand_types = [tuple(v.type for v in o) if isinstance(o, tuple) else (None if o is None else o.type)
                             for o in op.operands]
            expected = infer_types(op.kind, operand_types, dict(op.attrs))
        except IRError as e:
            yield f"{op.kind} producing {_where(op.results[0])}: {e}"
            continue
        if len(expected) != len(op.results):
            yield f"{op.kind} has {len(op.results)} results, the registry says {len(expected)}"
            continue
        for r, t in zip(op.results, expected):
            if r.type != t:
                yield f"{op.kind} result {_where(r)} has type {r.type}, the registry infers {t}"


# -- what every target can run: the reference's static conditions, one rule for all -------------
#
# A graph that type inference accepts can still ask for what the reference refuses at run time
# or what a target's kernel would compute differently (a clamp bound that an int8 kernel stores
# wrapped, a negative dilation, a bias that takes the int32 accumulator past its range). Every
# condition the reference would check on the graph alone is checked here, once, so that all
# targets refuse such a graph together (at compile, at save and at load). The reference's
# kernels call the same functions (``gemm_exact_problem``).

INT32 = DType.INT32
_EXACT_FLOAT_BOUND = 2**53


def max_centered(t: TensorType) -> int:
    """The largest ``|code - zero point|`` a quantized type admits (over its dtype's whole range)."""
    q = t.quant
    return max(max(abs(t.dtype.min - zp), abs(t.dtype.max - zp)) for zp in q.zero_point)


def span(t: TensorType) -> int:
    """The largest ``|code - zero point|`` a quantized value holds (its [qmin, qmax])."""
    q = t.quant
    return max(max(abs(q.qmin - zp), abs(q.qmax - zp)) for zp in q.zero_point)


def gemm_exact_problem(a: TensorType, b: TensorType, k: int) -> str | None:
    """Why the reference can't prove a float64 sum of k products of these codes exact (it computes
    integer GEMMs as float64 GEMMs: exact while every partial sum is an integer below 2**53)."""
    if a.quant is None or b.quant is None:
        return None
    if k * max_centered(a) * max_centered(b) >= _EXACT_FLOAT_BOUND:
        return (f"a sum of {k} products of {a.dtype.value} x {b.dtype.value} codes can't be proven exact "
                "in float64")
    return None


Consts = dict  # Value -> the data of the constant op making it


def _constant_data(v: Value | None, consts: Consts):
    """The data of a value made by a ``constant`` op, else None."""
    data = consts.get(v) if v is not None else None
    return data if isinstance(data, np.ndarray) else None


def _ints_at_least(op: Op, lo: int, *names: str) -> Iterator[str]:
    for name in names:
        vals = op.attrs.get(name)
        if isinstance(vals, int) and not isinstance(vals, bool):
            vals = (vals,)
        if isinstance(vals, (tuple, list)) and any(not isinstance(e, int) or e < lo for e in vals):
            yield f"{name} {tuple(vals)} must hold integers >= {lo}"


def _within_dtype(x: object, t: TensorType, what: str) -> Iterator[str]:
    """An attribute applied to integer codes: an integer within the dtype (a kernel stores it as one)."""
    if not t.dtype.is_integer:
        return
    if not isinstance(x, int) or isinstance(x, bool):
        yield f"{what} {x!r} must be an integer for {t.dtype.value} codes"
    elif not t.dtype.min <= x <= t.dtype.max:
        yield f"{what} {x} is outside {t.dtype.value} [{t.dtype.min}, {t.dtype.max}]"


_L1_CACHE: dict[tuple[int, tuple[int, ...]], tuple[weakref.ref, np.ndarray]] = {}


def _l1_per_channel(data: np.ndarray, zero_point: tuple[int, ...]) -> np.ndarray:
    """sum |w - w_zp| per output channel (axis 0), int64; kept per weight array (the verifier runs after
    every pass, the weights rarely change)."""
    key = (id(data), tuple(zero_point))
    hit = _L1_CACHE.get(key)
    if hit is not None and hit[0]() is data:
        return hit[1]
    codes = np.abs(data.astype(np.int64) - np.asarray(zero_point, np.int64).reshape((-1,) + (1,) * (data.ndim - 1)))
    l1 = codes.reshape(codes.shape[0], -1).sum(axis=1) if data.ndim else codes.reshape(1)
    if len(_L1_CACHE) > 4096:
        _L1_CACHE.clear()
    try:
        _L1_CACHE[key] = (weakref.ref(data), l1)
    except TypeError:   # an array that can't be referenced weakly: not kept
        pass
    return l1


def _accumulator_fits(op: Op, consts: Consts) -> Iterator[str]:
    """conv2d / fully_connected on codes with a constant weight: no input can take the sum of products
    plus the bias beyond the int32 accumulator (the reference refuses such a sum, an int32 kernel wraps
    it). The bound per output channel: sum |w - w_zp| * the input's largest |x - x_zp|, plus |bias|."""
    x, w = op.operands[0], op.operands[1]
    bias = op.operands[2] if len(op.operands) > 2 else None
    if x.type.quant is None or w.type.quant is None:
        return
    wdata = _constant_data(w, consts)
    if wdata is None:
        return
    worst = _l1_per_channel(wdata, w.type.quant.zero_point) * span(x.type)
    if bias is not None:
        bdata = _constant_data(bias, consts)
        if bdata is None:
            return
        worst = worst + np.abs(bdata.astype(np.int64).reshape(-1))
    if worst.size and int(worst.max()) > INT32.max:
        yield (f"its sum of products plus bias can reach {int(worst.max()):,}, beyond the int32 accumulator "
               f"(output channel {int(worst.argmax())})")


def _gemm(op: Op, consts: Consts) -> Iterator[str]:
    a, b = op.operands[0].type, op.operands[1].type
    k = {"conv2d": math.prod(b.shape[1:]), "fully_connected": b.shape[-1] if b.shape else 0,
         "matmul": a.shape[-1] if a.shape else 0}[op.kind]
    problem = gemm_exact_problem(a, b, k)
    if problem:
        yield problem
    if op.kind != "matmul":
        yield from _accumulator_fits(op, consts)
    elif a.quant is not None and b.quant is not None and k * span(a) * span(b) > INT32.max:
        # no constant operand to bound the sum by: the codes' ranges do (the reference refuses such a sum
        # at run time, an int32 kernel such as TFLite's BATCH_MATMUL wraps it)
        yield (f"its sum of {k:,} products of codes up to {span(a):,} x {span(b):,} can reach "
               f"{k * span(a) * span(b):,}, beyond the int32 accumulator")


def _conv2d(op: Op, consts: Consts) -> Iterator[str]:
    yield from _ints_at_least(op, 1, "stride", "dilation", "groups")
    yield from _ints_at_least(op, 0, "pad")
    yield from _gemm(op, consts)


def _pool(op: Op, consts: Consts) -> Iterator[str]:
    yield from _ints_at_least(op, 1, "kernel", "stride")
    yield from _ints_at_least(op, 0, "pad")


def _clamp(op: Op, consts: Consts) -> Iterator[str]:
    t = op.operands[0].type
    yield from _within_dtype(op.attrs["min"], t, "min")
    yield from _within_dtype(op.attrs["max"], t, "max")


def _pad(op: Op, consts: Consts) -> Iterator[str]:
    yield from _ints_at_least(op, 0, "pads")
    yield from _within_dtype(op.attrs["value"], op.operands[0].type, "value")


def _table(op: Op, consts: Consts) -> Iterator[str]:
    out, table = op.attrs["out"], op.attrs["table"]
    if isinstance(table, np.ndarray) and table.size and table.dtype.kind in "iu" and out.dtype.is_integer \
            and (int(table.min()) < out.dtype.min or int(table.max()) > out.dtype.max):
        yield f"its table holds values outside {out.dtype.value}"


def _intdiv(op: Op, consts: Consts) -> Iterator[str]:
    data = _constant_data(op.operands[1], consts)
    if data is not None and np.any(np.asarray(data) == 0):
        yield "divides by a constant zero"


def _gather(op: Op, consts: Consts) -> Iterator[str]:
    data, axis = _constant_data(op.operands[1], consts), op.attrs["axis"]
    shape = op.operands[0].type.shape
    if data is not None and data.size and isinstance(axis, int) and -len(shape) <= axis < len(shape):
        size = shape[axis]
        if int(data.min()) < 0 or int(data.max()) >= size:
            yield f"its constant indices reach outside the axis of size {size}"


# op kind -> the conditions it must meet beyond its types (each yields what is wrong)
RUNNABLE: dict[str, Callable[[Op, Consts], Iterator[str]]] = {
    "conv2d": _conv2d, "fully_connected": _gemm, "matmul": _gemm,
    "avg_pool2d": _pool, "max_pool2d": _pool,
    "clamp": _clamp, "pad": _pad, "table": _table, "intdiv": _intdiv, "gather": _gather,
}


@rule("runnable")
def _runnable(graph: Graph) -> Iterator[str]:
    """What every target can run: attribute ranges, bounds within the codes' dtype, sums within the
    accumulator, constant divisors and indices (``RUNNABLE``; the reference's static conditions)."""
    consts = {op.results[0]: op.attrs.get("data") for op in graph.ops if op.kind == "constant" and op.results}
    for op in graph.ops:
        check = RUNNABLE.get(op.kind)
        if check is None or not all(_is_complete(v.type) for v in (*op.input_values(), *op.results)):
            continue
        try:
            messages = list(check(op, consts))
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:   # attributes of any shape
            messages = [f"its attributes can't be checked ({type(e).__name__}: {str(e)[:80]})"]
        for m in messages:
            yield f"{op.kind} producing {_where(op.results[0])}: {m}"


def verify_graph(graph: Graph, after: str | None = None) -> Graph:
    """Raise VerificationError naming every broken rule; return the graph when it is valid."""
    problems = [f"[{name}] {msg}" for name, fn in RULES.items() for msg in fn(graph)]
    if problems:
        head = f"graph '{graph.name}' is invalid" + (f" after {after}" if after else "")
        raise VerificationError(head + ":\n  " + "\n  ".join(problems[:20])
                                + (f"\n  … and {len(problems) - 20} more" if len(problems) > 20 else ""))
    return graph
