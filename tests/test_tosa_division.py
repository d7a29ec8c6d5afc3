"""Division by a constant as multiplies and shifts (qlower/backends/tosa/division.py): the proof's
checker, the Python statement of the form, and the TOSA form on the TOSA reference model, each
compared with truncating division on every edge of int32 and on random values."""

import numpy as np
import pytest

from qlower.backends.tosa import TosaBackend
from qlower.backends.tosa.division import (
    INT32_MAX,
    INT32_MIN,
    Magic,
    division_magic,
    proven_floor,
    truncated_quotient,
)
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph

RNG = np.random.default_rng(25)
DIVISORS = [3, 5, 7, 10, 255, 1000, 4093, 16371, 16379, 16384, 65489, 65526, 65536, 2**22, 2**26, 2**28,
            2**29 - 1, 2**29, 2**30] + [int(d) for d in RNG.integers(3, 2**20, 12)]


def _trunc(a: np.ndarray, d: int) -> np.ndarray:
    a = a.astype(np.int64)
    q = np.abs(a) // abs(d)
    return np.where((a < 0) != (d < 0), -q, q)


def _dividends(d: int, n: int = 3000) -> np.ndarray:
    edges = [INT32_MIN, INT32_MIN + 1, INT32_MAX, INT32_MAX - 1, 0, 1, -1]
    around = [k * d + o for k in (-3, -2, -1, 0, 1, 2, 3, INT32_MAX // d, INT32_MIN // d + 1) for o in (-1, 0, 1)]
    rnd = RNG.integers(INT32_MIN, INT32_MAX, n, endpoint=True).tolist()
    return np.array([x for x in edges + around + rnd if INT32_MIN <= x <= INT32_MAX], np.int64)


@pytest.mark.parametrize("d", DIVISORS)
def test_the_form_truncates_on_every_edge(d):
    magic = division_magic(d)
    assert magic is not None and magic.divisor == d
    a = _dividends(d)
    got = np.array([truncated_quotient(int(x), magic) for x in a])
    np.testing.assert_array_equal(got, _trunc(a, d))


def test_divisors_without_a_form():
    # 2: RESCALE's input bound needs a shift of at least 32, which a 31-bit multiplier can't reach
    assert division_magic(2) is None and division_magic(1) is None and division_magic(0) is None
    assert division_magic(2**31 - 1) is None    # the correction's remainder 2d would leave int32


def test_the_proof_checker_rejects_a_wrong_multiplier():
    """One unit off the proven multiplier (or the offset) must fail the corner check somewhere
    that exhaustive division would also show, for a divisor whose one-rescale form is tight."""
    good = division_magic(7)
    assert not good.correct
    for m, c in ((good.multiplier - 1, good.offset), (good.multiplier + 2, good.offset),
                 (good.multiplier, good.offset + 3)):
        assert not proven_floor(7, m, good.shift, c, INT32_MIN + 6, INT32_MAX)
        bad = Magic(7, m, good.shift, c, correct=False)
        a = _dividends(7, 30000)
        with np.errstate(all="ignore"):
            got = np.array([truncated_quotient(int(x), bad) for x in a])
        assert (got != _trunc(a, 7)).any()


def test_the_proof_checker_agrees_with_brute_force_on_small_ranges():
    """For every (m, s, c) near 2**s / d on a small range, the corner check says yes exactly when
    every integer of the range divides right (brute force)."""
    for d in (3, 6, 7, 10, 12):
        lo, hi = -200, 5000
        x = np.arange(lo, hi + 1, dtype=np.int64)
        for s in (12, 13, 14, 16):
            for m in range((1 << s) // d - 1, (1 << s) // d + 3):
                for c in range(0, d + 1):
                    rescaled = ((x - c) * m + (1 << (s - 1))) >> s
                    exact = bool((rescaled == np.floor_divide(x, d)).all())
                    assert proven_floor(d, m, s, c, lo, hi) == exact, (d, m, s, c)


def _division_graph(d: int, n: int):
    b = GraphBuilder("div")
    q = QuantSpec.per_tensor(1e-3, 0, DType.INT32)
    a = b.input("a", TensorType((1, n), DType.INT32, q))
    c = b.constant(np.full((1, 1), d, np.int32), QuantSpec.per_tensor(1.0, 0, DType.INT32), name="d")
    return verify_graph(b.build([b.op("intdiv", a, c, name="q")]))


@pytest.mark.parametrize("d", [3, 7, 1000, 16371, 65536, 2**28, -9, -4096])
def test_tosa_form_is_exact_on_the_reference_model(d):
    g = _division_graph(d, 4000)
    a = _dividends(abs(d), 4000 - 64)
    a = np.concatenate([a, np.full(4000 - a.size, INT32_MIN)])[None, :].astype(np.int32)
    backend = TosaBackend(divide_by_multiply=True)
    payload = backend.lower(g, "tosa-1.0+int")
    assert "INTDIV" not in payload.meta["tosa_ops"] and "RESCALE" in payload.meta["tosa_ops"]
    (got,) = backend.execute(payload, [a])
    (want,) = run_graph(g, [a])
    np.testing.assert_array_equal(want, _trunc(a, d))
    np.testing.assert_array_equal(got, want)
    # without the option the plain INTDIV stays
    assert "INTDIV" in TosaBackend().lower(g, "tosa-1.0+int").meta["tosa_ops"]


# -- narrow int16 lookups as int8 TABLEs -------------------------------------------------------

@pytest.mark.parametrize("lowest, entries, offset", [
    (-255, np.arange(256) * 128, 255),                                        # softmax's exp: 2 bytes
    (-100, RNG.integers(-2**23, 2**23, 201), 100),                            # 3 bytes, negative entries
    (0, np.full(60, -7), 0),                                                  # constant: 1 byte
    (-100, RNG.integers(2**30, 2**30 + 255, 256), 128),                       # far from 0, codes within the table
])
def test_byte_tables_are_exact_on_the_reference_model(lowest, entries, offset):
    entries = np.asarray(entries, np.int32)
    highest = min(lowest + 200, entries.size - 1 - offset)
    b = GraphBuilder("lookup")
    x = b.input("x", TensorType((1, 700), DType.INT16, QuantSpec(DType.INT16, (0.1,), (0,), lowest, highest)))
    out = QuantSpec.per_tensor(1e-5, 0, DType.INT32)
    g = verify_graph(b.build([b.op("table", x, table=entries, offset=offset, out=out, name="t")]))
    # every declared code, and codes beyond the range (an input may hold them: nearest entry)
    codes = np.concatenate([np.arange(lowest, highest + 1), [-32768, 32767, lowest - 1, highest + 1],
                            RNG.integers(-32768, 32768, 700)])[:700]
    xs = [codes[None, :].astype(np.int16)]
    backend = TosaBackend(byte_tables=True)
    payload = backend.lower(g, "tosa-1.0+int")
    assert "GATHER" not in payload.meta["tosa_ops"] and payload.meta["tosa_ops"]["TABLE"] >= 1
    (got,) = backend.execute(payload, xs)
    (want,) = run_graph(g, xs)
    np.testing.assert_array_equal(want, entries[np.clip(codes + offset, 0, entries.size - 1)][None, :])
    np.testing.assert_array_equal(got, want)
    assert "GATHER" in TosaBackend().lower(g, "tosa-1.0+int").meta["tosa_ops"]


@pytest.mark.parametrize("size, entries", [(257, np.arange(257)), (200, np.arange(200) * 2**23)])
def test_byte_tables_leave_wide_lookups_to_gather(size, entries):
    """More than 256 entries, or entries spanning more than 3 bytes: a GATHER."""
    b = GraphBuilder("wide")
    x = b.input("x", TensorType((1, 8), DType.INT16, QuantSpec(DType.INT16, (1.0,), (0,), 0, size - 1)))
    g = verify_graph(b.build([b.op("table", x, table=entries.astype(np.int32), offset=0,
                                   out=QuantSpec.per_tensor(1.0, 0, DType.INT32))]))
    assert "GATHER" in TosaBackend(byte_tables=True).lower(g, "tosa-1.0+int").meta["tosa_ops"]
