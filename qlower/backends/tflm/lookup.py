"""An op's result as a function of one integer, looked up with TFLM's kernels.

Where the IR's arithmetic needs what TFLM lacks (64-bit products), a result
that depends on one integer ``x`` known to lie in ``[lo, hi]`` (a code, a
window sum) is computed by the reference's own functions for every ``x`` at
export and looked up on the device:

- up to 2**16 values: one GATHER (int8, or float32 and a CAST for wider
  results: TFLM gathers only int8 and float32);
- up to 2**22 values: buckets of 2**k consecutive ``x`` (at most 2**16 of
  them; as wide as keeps the tables small), each with its value at the start,
  the one ``x`` in it where the value changes and by how much: ``base[c] + (x >= change[c]) * jump[c]``, with
  ``c = (x - lo) / 2**k`` (an int32 DIV of a non-negative number). A requantized
  sum changes at most once within a bucket narrower than one output step; the
  form is checked against the full table on every ``x`` and refused otherwise.
"""

from __future__ import annotations

import numpy as np
from tflite.BuiltinOperator import BuiltinOperator as B

from qlower.backends.litert.emit import NotExact, options, tflite_quant
from qlower.backends.litert.export import _tfl_dtype
from qlower.backends.litert.ranges import MAX_TABLE
from qlower.ir import Op

FLOAT_EXACT = 2**24    # integers a float32 holds exactly
WIDE_TABLE = 1 << 22   # the most values a bucketed lookup takes


def lookup(ex, op: Op, table: np.ndarray, lo: int, index: int | None = None) -> None:
    """Bind ``op``'s result to ``table[x - lo]`` for the int32 tensor ``index`` (``op``'s first operand's
    codes by default), whose values lie in ``[lo, lo + table.size)``."""
    b, name = ex.b, op.result.name
    idx = ex.plain(op.operands[0]) if index is None else index
    if lo:
        idx = b.binary_const(B.SUB, idx, np.int32(lo), f"{name}/index")
    out, quant = _tfl_dtype(op.result.type), tflite_quant(op.result.type)
    if table.size > MAX_TABLE:
        ex.bind(op.result, b.cast(_bucketed(ex, op, np.asarray(table, np.int64), idx), out, name, quant))
    elif out == "int8":
        tab = b.const(f"{name}/table", np.asarray(table).astype(np.int8), "int8", quant)
        ex.result(op, B.GATHER, [tab, idx], options("GatherOptions", Axis=0))
    else:
        ex.bind(op.result, b.cast(_gather_f32(ex, table, idx, op.result.shape, f"{name}/f32"), out, name, quant))


def _gather_f32(ex, values: np.ndarray, idx: int, shape, name: str) -> int:
    if np.abs(values).max(initial=0) >= FLOAT_EXACT:
        raise NotExact("a table of values float32 can't hold exactly (TFLM gathers only int8 and float32)")
    tab = ex.b.const(f"{name}/table", np.asarray(values).astype(np.float32), "float32")
    return ex.b.op(B.GATHER, [tab, idx], name, shape, "float32", opts=options("GatherOptions", Axis=0))


def _bucketed(ex, op: Op, table: np.ndarray, idx: int) -> int:
    """float32 ``table[idx]`` for ``idx`` in ``[0, table.size)`` (module doc); NotExact when a bucket
    holds two changes."""
    if table.size > WIDE_TABLE:
        raise NotExact(f"a lookup of {table.size} values (at most {WIDE_TABLE} here)")
    k = max(int(np.ceil(np.log2(table.size / MAX_TABLE))), 0)
    if not _one_change(table, 1 << k):
        raise NotExact(f"the looked-up values change twice within {1 << k} consecutive integers")
    while k < 30 and _one_change(table, 1 << (k + 1)):
        k += 1   # the widest buckets that still hold one change each: the smallest tables (flash)
    width = 1 << k
    padded = _buckets(table, width)
    base = padded[:, 0]
    changes = np.diff(padded, axis=1) != 0
    at = np.where(changes.any(axis=1), changes.argmax(axis=1) + 1, width)
    jump = padded[np.arange(len(padded)), np.minimum(at, width - 1)] - base
    change = np.arange(len(padded), dtype=np.int64) * width + at   # absolute index of the change
    x = np.arange(table.size)
    if not np.array_equal(base[x // width] + (x >= change[x // width]) * jump[x // width], table):
        raise NotExact("the bucketed lookup does not reproduce its table")   # (never: checked for any table)
    b, name, shape = ex.b, op.result.name, op.result.shape
    c = b.op(B.DIV, [idx, b.const(f"{name}/width", np.int32(width), "int32")], f"{name}/bucket", shape, "int32",
             opts=options("DivOptions"))
    at_c = b.cast(_gather_f32(ex, change, c, shape, f"{name}/change"), "int32", f"{name}/change_i32")
    step = b.cast(b.binary(B.GREATER_EQUAL, idx, at_c, f"{name}/past", dtype="bool"), "float32",
                  f"{name}/step")
    y = b.binary(B.MUL, step, _gather_f32(ex, jump, c, shape, f"{name}/jump"), f"{name}/rise")
    return b.binary(B.ADD, _gather_f32(ex, base, c, shape, f"{name}/base"), y, f"{name}/value")


def _buckets(table: np.ndarray, width: int) -> np.ndarray:
    return np.concatenate([table, np.full(-table.size % width, table[-1])]).reshape(-1, width)


def _one_change(table: np.ndarray, width: int) -> bool:
    return width <= table.size and bool(np.all((np.diff(_buckets(table, width), axis=1) != 0).sum(axis=1) <= 1))
