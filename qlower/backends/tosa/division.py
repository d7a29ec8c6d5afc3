"""Integer division by a constant as multiplies and shifts, for accelerators without a divider.

Vela runs no INTDIV on Ethos-U55/U65 (nor the EQUAL/SELECT of its zero guard), so each
``intdiv`` by a constant split a transformer's LayerNorm into host pieces. This module
finds, for a constant divisor ``d >= 2``, TOSA operators that compute ``trunc(a / d)``
exactly for *every* int32 ``a`` (the operand's type says nothing narrower), using only
RESCALE, ADD, SUB, MUL and MAXIMUM/MINIMUM.

The core is ``floor(x / d)`` as one RESCALE of ``x - c`` (multiplier ``m`` in [2**30,
2**31), shift ``s``, TOSA's round-half-up ``(v*m + 2**(s-1)) >> s``). Write ``x = q*d + r``
(``0 <= r < d``), ``N = 2**s`` and ``E = d*m - N``; then

    (x - c)*m + N/2 - q*N = q*E + (r - c)*m + N/2,

so the RESCALE yields ``q + k`` exactly when that expression lies in ``[k*N, (k+1)*N)``.
It is linear in ``q`` and ``r``, so over a box of ``q`` and ``r`` it takes its extremes at
the box's corners: four exact integer evaluations prove the RESCALE for a whole range of
``x`` (``proven_floor``). Two forms use it:

- *one rescale* (``Magic.correct == False``): the RESCALE is ``floor(x/d)`` itself for
  ``x`` in ``[MIN + d - 1, MAX]`` (powers of two always, and many other divisors);
  ``trunc(a/d) = floor(max(a, 0)/d) + floor((min(a, 0) + d - 1)/d)``, the second term
  being ``ceil(min(a, 0)/d)``, i.e. truncation of the negative part;
- *with a correction* otherwise: the RESCALE gives ``q0`` in ``{q - 1, q}`` for ``x`` in
  ``[0, MAX]``, the remainder ``r0 = x - q0*d`` is in ``[0, 2d)`` (no overflow:
  ``q0*d`` is in ``[-d, x]``), and ``q = q0 + clamp(r0 - d + 1, 0, 1)``; then
  ``trunc(a/d) = G(max(a, 0)) - G(-max(min(a, 0), -MAX))``. Only ``a = -2**31`` is
  clamped to ``-MAX``, which changes nothing because this form is used only when ``d`` is
  not a power of two (``floor(MAX/d) == floor(2**31/d)`` unless ``d`` divides ``2**31``).

Every intermediate is checked to stay within int32 and within RESCALE's input bound.
"""

from __future__ import annotations

from dataclasses import dataclass

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_DIVISOR = 2**29   # the correction form needs 2*d within int32 with room


@dataclass(frozen=True)
class Magic:
    """``floor((x - offset) * multiplier + 2**(shift-1)) >> shift``: floor(x / divisor), or within
    one below it when ``correct`` (then a remainder step fixes it)."""

    divisor: int
    multiplier: int
    shift: int
    offset: int
    correct: bool


def _expression_range(d: int, m: int, s: int, c: int, lo: int, hi: int) -> tuple[int, int]:
    """Extremes of ``q*E + (r - c)*m + N/2`` over ``x = q*d + r`` in ``[lo, hi]`` (corners of the
    ``q`` x ``r`` box that covers that range)."""
    n = 1 << s
    e = d * m - n
    values = [q * e + (r - c) * m + n // 2 for q in (lo // d, hi // d) for r in (0, d - 1)]
    return min(values), max(values)


def proven_floor(d: int, m: int, s: int, c: int, lo: int, hi: int, below: int = 0) -> bool:
    """Whether the RESCALE of ``x - c`` by ``(m, s)`` is ``floor(x/d) - k`` with ``k`` in
    ``[0, below]`` for every ``x`` in ``[lo, hi]``, and its input stays within int32 and within
    TOSA's ``apply_scale_32`` bound ``[-2**(s-1), 2**(s-1))``."""
    n = 1 << s
    least, most = _expression_range(d, m, s, c, lo, hi)
    bound = min(1 << (s - 1), 2**31)
    inputs_ok = INT32_MIN <= lo - c and hi - c <= INT32_MAX and -bound <= lo - c and hi - c < bound
    return inputs_ok and least >= -below * n and most < n


def _candidates(d: int):
    """(m, s, c) with ``m`` normalised as qlower's requantization writes it (``[2**30, 2**31)``),
    ``m`` one of the two integers around ``2**s / d``, ``c`` around ``2**(s-1) / m`` (which cancels
    RESCALE's rounding term) or ``d`` (a floor that may be one low)."""
    for s in range(62, 1, -1):
        base = (1 << s) // d
        for m in (base + 1, base):
            if not 2**30 <= m < 2**31:
                continue
            centre = (1 << (s - 1)) // m
            for c in (centre, centre + 1, centre - 1, d):
                yield m, s, c


def division_magic(d: int) -> Magic | None:
    """The cheapest proven form of ``trunc(a / d)`` over all int32 ``a`` (module docstring), or
    None when ``d`` is out of range (``d < 2`` or above ``MAX_DIVISOR`` for the correction form)."""
    if d < 2:
        return None
    for m, s, c in _candidates(d):
        if proven_floor(d, m, s, c, INT32_MIN + d - 1, INT32_MAX):
            return Magic(d, m, s, c, correct=False)
    if d > MAX_DIVISOR or d & (d - 1) == 0:
        return None
    for m, s, c in _candidates(d):
        if proven_floor(d, m, s, c, 0, INT32_MAX, below=1):
            return Magic(d, m, s, c, correct=True)
    return None


def _floor_by_magic(x: int, g: Magic) -> int:
    v = x - g.offset
    return (v * g.multiplier + (1 << (g.shift - 1))) >> g.shift


def truncated_quotient(a: int, g: Magic) -> int:
    """``trunc(a / g.divisor)`` computed the way the TOSA form does (Python ints, every step
    checked to stay within int32): the executable statement of the form, for tests."""
    def i32(v: int) -> int:
        if not INT32_MIN <= v <= INT32_MAX:
            raise OverflowError(f"{v} leaves int32")
        return v

    d = g.divisor
    if not g.correct:
        return i32(_floor_by_magic(max(a, 0), g) + _floor_by_magic(i32(min(a, 0) + d - 1), g))

    def floor(x: int) -> int:
        q0 = i32(_floor_by_magic(x, g))
        r0 = i32(x - i32(q0 * d))
        return i32(q0 + min(max(i32(r0 + 1 - d), 0), 1))

    return i32(floor(max(a, 0)) - floor(i32(0 - max(min(a, 0), -INT32_MAX))))
