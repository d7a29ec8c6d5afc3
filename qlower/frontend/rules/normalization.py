"""Normalisation in integers: a BatchNorm that was not folded into a conv, LayerNorm, GroupNorm, InstanceNorm.

In eval mode a BatchNorm is ``y = a[c] * x + b[c]`` with ``a = w / sqrt(var + eps)`` and
``b = bias - mean * a`` (float64 at import). On per-tensor codes ``x = s (q - zp)``:

1. ``d = q - zp`` as int32 (exact ``rescale``);
2. ``mul`` by int32 codes ``A[c] = round(a[c] s / t)`` held at scale ``t / s``, with
   ``t = (max|d|·s·max|a| + max|b|) / 2**29``: the product has one per-tensor scale ``t``;
3. ``add`` ``b`` as int32 codes at ``t``; the sum stays below ``2**30``;
4. ``rescale`` to the output domain (the only rounding at the output's step).

Steps 2 and 3 round by at most ``(max|d| + 1) t / 2``, about ``2**-22`` of the value range, far
below an output step: the result is within 1 step of fake-quant. Every scale is per tensor, so the
ops run in whatever layout the input has (no per-channel RESCALE, which TOSA only has along the
last axis).

LayerNorm (``native_layer_norm``, the core op PyTorch's decomposition leaves; on ``unsupported`` it
runs in float on the host) is integer too, from existing exact IR ops only (see ``layer_norm``): int32
sums, a compare-free normalisation, a reciprocal-square-root table, so every backend is bit-exact with
the reference; a static error bound (half an output step) decides when it is used. GroupNorm and
InstanceNorm (see below) reuse it where their layout allows.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
import torch

from qlower.errors import UnsupportedOpError
from qlower.frontend import channel_affine as _op  # noqa: F401  (defines torch.ops.qlower.channel_affine)
from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.quantizer import packet
from qlower.frontend.rules import register
from qlower.frontend.rules.elementwise import _float_ref, _int32_codes, _static_quantized
from qlower.ir import DType, QuantSpec

HEADROOM_BITS = 29


def channel_affine(ctx: ImportContext, input: Ref, scale: np.ndarray, shift: np.ndarray) -> Ref:
    """``scale[c] * x + shift[c]`` along PyTorch dim 1 of per-tensor codes ``input``, in integers."""
    x = _float_ref(ctx, input)
    q = x.spec
    c = x.torch_shape[1]
    shape = (1, c) + (1,) * (x.rank - 2)
    scale, shift = np.asarray(scale, np.float64).reshape(shape), np.asarray(shift, np.float64).reshape(shape)
    if not (np.isfinite(scale).all() and np.isfinite(shift).all()):
        raise ctx.unsupported("a BatchNorm with non-finite scale or shift (zero variance and eps?)")
    s = q.scale[0]
    widest = max(q.qmax - q.zero_point[0], q.zero_point[0] - q.qmin)
    span = widest * s * float(np.abs(scale).max()) + float(np.abs(shift).max())
    t = (span or 1.0) / 2**HEADROOM_BITS
    multiplier = Ref.constant(_int32_codes(ctx, scale * s / t, 1.0), QuantSpec.per_tensor(t / s, 0, DType.INT32))
    perm, (vx, vm) = ctx.broadcast([x, multiplier])
    product = ctx.emit("mul", ctx.rescale(vx, QuantSpec.per_tensor(s, 0, DType.INT32), perm), vm, perm=perm)
    p = product.quant.scale[0]
    offset = Ref.constant(_int32_codes(ctx, shift, p), QuantSpec.per_tensor(p, 0, DType.INT32))
    _, (vb,) = ctx.broadcast([offset], perm=perm)
    return ctx.requant(ctx.emit("add", product, vb, perm=perm), perm)


@register(torch.ops.qlower.channel_affine)
def unfolded_batch_norm(ctx: ImportContext, node, input: Ref, scale: Ref, shift: Ref, **_):
    if _static_quantized(_float_ref(ctx, input)):
        try:
            return channel_affine(ctx, input, scale.data, shift.data)
        except UnsupportedOpError:
            pass  # this op has no core-ATen float fallback: float IR ops below
    shape = (1, -1) + (1,) * (input.rank - 2)
    mul = Ref.constant(scale.data.reshape(shape).astype(np.float32))
    add = Ref.constant(shift.data.reshape(shape).astype(np.float32))
    perm, (x, m) = ctx.broadcast([input, mul], floats=True)
    _, (a,) = ctx.broadcast([add], perm=perm, floats=True)
    return Ref.of(ctx.emit("add", ctx.emit("mul", x, m, perm=perm), a, perm=perm), perm)


# -- LayerNorm ------------------------------------------------------------------------------

TABLE_BITS = 14        # the normalised U/2**16 lies in [2**12, 2**14): the rsqrt table's index
RSQRT_ONE = 2**30      # table entries: 2**30 / sqrt(index + 1/2)
MAX_ERROR_STEPS = 0.5  # static bound on the error before the output's rounding
U_LIMIT = 2**30        # every U (the scaled variance) stays below this
Y_CODES = 2**15        # the normalised value's int32 codes lie in [-Y_CODES, Y_CODES]


def _plain(ctx: ImportContext, value: int, rank: int, spec: QuantSpec):
    return ctx.constant(np.full((1,) * rank, value, np.int32), spec)


@dataclass(frozen=True)
class _Plan:
    """The integer LayerNorm's constants for one width (see ``layer_norm``)."""

    coarse: float    # K_c: U = K_c·X for a large G (a power of 4; below 1 when eps dominates: see _plan)
    j: int           # a small G (<= limit) is held 4**j times finer: U = K_c·4**j·X (j = 0: one path)
    limit: int
    u_min: float     # the smallest U of a row that isn't constant (then D = 0 and U doesn't matter)
    shift: int       # of the product D·2**k·table
    y_max: float     # |y| beyond this saturates the output; the codes of y span [-y_max, y_max]
    error: float     # bound on |result - exact| in output value units, before the output's rounding


def _u_min(n: int, ne: float, coarse: int, j: int, limit: int) -> float:
    """Smallest U of a non-constant row: ``V >= N - 1`` so ``X >= (N - 1)/N + N·E``; the coarse path
    only takes ``G > limit``, so ``X > limit + N·E`` there; U is within 1.5 of ``K·X``."""
    fine = coarse * 4**j * ((n - 1) / n + ne)
    if coarse < 1:   # X >= N·E on every row; U within 1.75 of K_c·X
        return coarse * ne - 1.75
    return min(fine, coarse * (limit + ne)) - 1.5 if j else coarse * ((n - 1) / n + ne) - 1.5


def _plan(ctx: ImportContext, n: int, span: int, ne: float, w: np.ndarray, b: np.ndarray,
          out: QuantSpec) -> _Plan:
    g_max = n * (span * span / 4 + 1)   # G <= T = N·var + N·(mean - m0)² with var <= (span/2)²
    if g_max + 2 >= U_LIMIT:
        raise ctx.unsupported(f"layer_norm over {n} elements of {span + 1} codes: the sum of squares "
                              f"({g_max:.3g}) leaves no int32 headroom")
    coarse = 1.0
    while coarse * (g_max + ne) + 3 >= U_LIMIT:  # eps dominates (N·E huge): U = G // 4**c + round(N·E / 4**c)
        coarse /= 4
    while coarse >= 1 and 4 * coarse * (g_max + ne + 2) < U_LIMIT:
        coarse *= 4
    best = (0, -1)
    for j in range(1 if coarse >= 1 else 16, 16):
        fine = coarse * 4**j
        limit = int((U_LIMIT - 2) // fine - ne - 1)
        if limit < 0 or fine * n >= 2**31:   # fine·b (b < N) must fit int32
            break
        if _u_min(n, ne, coarse, j, limit) > _u_min(n, ne, coarse, *best):
            best = (j, limit)
    j, limit = best
    u_min = _u_min(n, ne, coarse, j, limit)
    u_error = 1.5 if coarse >= 1 else 1.75   # U's roundings (below 1: G // 4**c, and b/N·K_c < 1/4 dropped)
    slack = 1.01 / np.sqrt(max(1.0 - u_error / max(u_min, 2.0), 1e-3))
    # |D·2**(j+k)| < N·2**15 / sqrt(K_c); with j = 0 also |D| <= N·span over 2**k <= 2**15 / sqrt(U_min)
    a_max = n * 2**15 * slack / np.sqrt(coarse)
    if not j:
        a_max = min(a_max, n * span * 2**15 * 1.01 / np.sqrt(max(u_min, 1.0)))
    if a_max >= 2**31:
        raise ctx.unsupported(f"layer_norm over {n} elements: D·2**k leaves no int32 headroom")
    # output values beyond [lo, hi] saturate: |y·w| past max(hi - b, b - lo) changes nothing
    s_out, zp = out.scale[0], out.zero_point[0]
    lo, hi = s_out * (out.qmin - zp - 1), s_out * (out.qmax - zp + 1)
    reach = np.maximum(hi - b, b - lo).reshape(-1)
    wa = np.broadcast_to(np.abs(w), b.shape).reshape(-1)
    live = wa > 0
    y_max = float(np.sqrt(n))
    if live.any():
        y_max = min(y_max, 1.01 * float(np.max(np.maximum(reach[live], 0) / wa[live])) + 1e-6)
    yw = float(np.max(np.minimum(y_max * wa, 1.01 * np.maximum(reach, 0) + 1e-6)))
    shift = max(0, int(np.ceil(np.log2(n * 2.0**8 * slack / np.sqrt(coarse)))))
    s_scaled = np.sqrt(coarse) * 2.0**shift / (2.0**38 * np.sqrt(n))
    w_max = float(wa.max())
    t2 = (y_max * w_max + float(np.abs(b).max()) or 1.0) / 2**29
    relative = u_error / 2 / max(u_min - u_error, 1e-30) + 2.0**-TABLE_BITS + 2.0**-22
    error = (relative * yw + w_max * 0.5 * (s_scaled + y_max / Y_CODES)
             + (Y_CODES / 2 + 1) * t2)
    return _Plan(coarse, j, limit, u_min, shift, y_max, error)


def layer_norm(ctx: ImportContext, x: Ref, dims: int, weight: np.ndarray | None, bias: np.ndarray | None,
               eps: float, out: QuantSpec) -> Ref:
    """LayerNorm over the last ``dims`` PyTorch dims of per-tensor codes, from existing integer IR ops only
    (int32 throughout: TOSA has no int64); ``weight`` / ``bias`` (None: 1 / 0) hold one value per element
    of those dims (their size).

    With ``d = q - zp`` over the ``N`` normalised elements (codes span ``S = qmax - qmin``), ``S1 = Σd``,
    ``m0 = trunc(S1 / N)``, ``e = d - m0`` (``|e| <= S``), ``r = S1 - N·m0`` (``|r| < N``),
    ``T = Σe²`` (``< N·(S²/4 + 1)``: int32 for N up to about 66,000 int8 elements), ``a = r² // N``,
    ``b = r² - a·N`` and ``G = T - a``: the variance's numerator ``V = N·Σd² - (Σd)² = N·G - b``
    exactly (shift invariance), never formed itself (it needs N²·S² of range). With
    ``E = eps / s²`` and ``D = N·d - S1``::

        y = (x - mean) / sqrt(var + eps) = D / (sqrt(N) · sqrt(X)),  X = G - b/N + N·E

    ``U = K·G + round(K·N·E) - floor(K·b / N)`` is within 1.5 of ``K·X``; ``K = K_c`` (the largest power of 4
    keeping U below 2**30; when eps dominates, ``N·E`` near or past 2**30, ``K_c = 4**-c`` and
    ``U = G // 4**c + round(N·E / 4**c)``, within 1.75), or ``K_c·4**j`` for ``G <= limit`` (so that the roundings stay small against a
    small variance; a non-constant row has ``V >= N - 1``, so ``X >= (N-1)/N + N·E``). U is normalised to
    ``W = U·4**k`` in ``[2**28, 2**30)`` by four compare-free steps (``intdiv`` / ``clamp`` / ``mul`` /
    ``add``), the reciprocal square root read from a table at ``W / 2**16``, and ``D·2**(j+k)·table``
    (below ``N·2**15 / sqrt(K_c)``: int32) gives y; y saturates at ``y_max``, past which every output
    saturates anyway, and the affine part uses int32 codes at one scale, as ``channel_affine``.

    Error bound, in output units, before the output's rounding (``_plan``): the rsqrt is off by at most
    ``0.75 / U_min`` (U's roundings) ``+ 2**-14`` (table index) ``+ 2**-22`` (table entries) relative,
    times ``|y·w|`` (at most ``sqrt(N)·|w|``, and what the output range can show); plus half a step of the
    two roundings of y and the affine codes' rounding. It must be below half an output step, else the op
    runs in float. Every step is an IR op that each backend computes exactly as the reference.

    int16 codes (A16W8) stay float, for three reasons each of which alone rules this recipe out: one
    squared deviation ``e²`` reaches ``S² = 65535² ≈ 2**32`` (int32 can't hold ``mul(e, e)`` of a
    single element), the sum ``T`` needs ``32 + log2 N`` bits and the IR's integers, like TOSA 1.0's,
    stop at int32 (no int64 accumulator to move to); and an int16 output step is ``2**-16`` of the
    output range while the reciprocal square root's table index alone is ``2**-14`` relative, i.e.
    several output steps at ``|y·w|`` of a few units, so even splitting ``e`` into high and low bytes
    (exact partial sums, one coarse variance) would miss the half-step bound. ``_plan`` refuses it with
    "leaves no int32 headroom" (``g_max = N·(S²/4 + 1) >= 2**30`` for every N) and the op runs in float.
    """
    q = x.spec
    rank, s = x.rank, q.scale[0]
    shape = x.torch_shape
    n = int(np.prod(shape[rank - dims:]))
    full = (1,) * (rank - dims) + tuple(shape[rank - dims:])
    w = np.ones(full) if weight is None else np.asarray(weight, np.float64)
    b = np.zeros(full) if bias is None else np.asarray(bias, np.float64)
    w, b = (a if a.ndim == rank else a.reshape(full) for a in (w, b))  # rank-sized: broadcast as they are
    ne = n * eps / (s * s)
    plan = _plan(ctx, n, q.qmax - q.qmin, ne, w, b, out)
    if plan.error >= MAX_ERROR_STEPS * out.scale[0]:
        raise ctx.unsupported(f"integer layer_norm over {n} elements would be {plan.error / out.scale[0]:.2f} "
                              "output steps from exact")

    perm = layout.identity(rank)
    axes = list(range(rank - dims, rank))
    i32 = QuantSpec.per_tensor(s, 0, DType.INT32)
    one = QuantSpec.per_tensor(1.0, 0, DType.INT32)

    def plain(value: int, spec: QuantSpec = one):
        return _plain(ctx, value, rank, spec)

    def mul(a, c):
        return ctx.emit("mul", a, c, perm=perm)

    def add(a, c):
        return ctx.emit("add", a, c, perm=perm)

    def sub(a, c):
        return ctx.emit("sub", a, c, perm=perm)

    def intdiv(a, c):
        return ctx.emit("intdiv", a, c, perm=perm)

    def clamp(a, lo, hi):
        return ctx.emit("clamp", a, perm=perm, min=lo, max=hi)

    def total(v):
        for axis in axes:
            v = ctx.emit("reduce_sum", v, perm=perm, axis=axis)
        return v

    d = ctx.rescale(ctx.value_in(x, perm), i32, perm)
    s1 = total(d)
    big_d = sub(mul(d, plain(n)), s1)
    m0 = intdiv(s1, plain(n))
    r = sub(s1, mul(m0, plain(n)))
    e = sub(d, m0)
    t = total(mul(e, e))
    rr = mul(r, r)
    a = intdiv(rr, plain(n))
    frac = sub(rr, mul(a, plain(n)))           # b = r² mod N
    g = sub(t, a)

    def scaled_u(gv, k: float):                # K·G + round(K·N·E) - floor(K·b / N)
        if k < 1:                              # G // 4**c + round(N·E / 4**c): K·b/N < 1/4 left out
            return add(intdiv(gv, plain(int(round(1 / k)), one)), plain(int(round(k * ne)), gv.quant))
        k = int(k)
        u = add(mul(gv, plain(k)), plain(int(round(k * ne)), gv.quant))
        return sub(u, intdiv(mul(frac, plain(k)), plain(n)))

    u = scaled_u(g, plan.coarse)
    power = None
    if plan.j:  # G up to the limit: U = K_c·4**j·X, and the result's 2**j is in ``power``
        small_u = scaled_u(clamp(g, 0, plan.limit), int(plan.coarse) * 4**plan.j)
        large = clamp(intdiv(g, plain(plan.limit + 1, g.quant)), 0, 1)
        u = add(small_u, mul(sub(u, small_u), large))
        small = sub(plain(1, large.quant), large)
        power = add(mul(small, plain(2**plan.j - 1)), plain(1, small.quant))
    # normalise: for step in 8, 4, 2, 1: if U < 2**(30 - 2·step): U ·= 4**step, 2**k ·= 2**step
    for step in (8, 4, 2, 1):
        limit = 2 ** (30 - 2 * step)
        at_least = clamp(intdiv(u, plain(limit, u.quant)), 0, 1)
        below = sub(plain(1, at_least.quant), at_least)
        grown = mul(clamp(u, 0, limit - 1), plain(4**step))
        u = add(u, mul(sub(grown, u), below))
        factor = add(mul(below, plain(2**step - 1)), plain(1, below.quant))
        power = factor if power is None else mul(power, factor)
    index = intdiv(u, plain(2**16, u.quant))
    index16 = ctx.rescale(index, QuantSpec(DType.INT16, (1.0,), (0,), 0, 2**TABLE_BITS - 1), perm)
    codes = np.arange(2**TABLE_BITS, dtype=np.float64)
    table = np.where(codes > 0, np.rint(RSQRT_ONE / np.sqrt(codes + 0.5)), 0).astype(np.int32)
    # y = D·2**(j+k)·table·sqrt(K_c) / (2**38·sqrt(N)): the table's scale makes the product's scale that of y
    rsqrt = ctx.emit("table", index16, perm=perm, table=table, offset=0,
                     out=QuantSpec.per_tensor(np.sqrt(plan.coarse) / (2.0**38 * np.sqrt(n) * s), 0, DType.INT32))
    scaled = ctx.emit("mul", mul(big_d, power), rsqrt, perm=perm, shift=plan.shift)
    y = ctx.rescale(scaled, QuantSpec.per_tensor(plan.y_max / Y_CODES, 0, DType.INT32, -Y_CODES, Y_CODES), perm)
    # affine: y·w + b with w codes at t2 / s_y and b codes at the product's scale (about t2)
    s_y = y.quant.scale[0]
    t2 = (plan.y_max * float(np.abs(w).max()) + float(np.abs(b).max()) or 1.0) / 2**29
    w_codes = _int32_codes(ctx, w * s_y / t2, 1.0)
    w_ref = Ref.constant(w_codes, QuantSpec.per_tensor(t2 / s_y, 0, DType.INT32))
    product = ctx.emit("mul", y, ctx.place_constant(w_ref, perm), perm=perm)
    p = product.quant
    b_ref = Ref.constant(_int32_codes(ctx, b, p.scale[0]), p)
    result = ctx.emit("add", product, ctx.place_constant(b_ref, perm), perm=perm)
    return Ref.of(ctx.rescale(result, out, perm), perm)


def _normalised_result(ctx: ImportContext, node, input: Ref, weight, bias) -> tuple[Ref, QuantSpec]:
    """Checks shared by the norms (ops with results (out, mean, rstd)): only ``out`` is used, quantized in
    one domain; the input holds per-tensor codes; weight and bias are constants. Returns (input, out spec)."""
    name = str(node.target)
    for user in node.users:
        if packet(user) is not None or user.target is not operator.getitem or user.args[1] != 0:
            raise ctx.unsupported(f"{name} whose mean / rstd results are used")
    x = _float_ref(ctx, input)
    if not _static_quantized(x):
        raise ctx.unsupported(f"integer {name} needs per-tensor quantized codes in")
    out = {ctx.out_spec(user) for user in node.users}
    if len(out) != 1 or None in out:
        raise ctx.unsupported(f"integer {name} needs its result quantized (one domain)")
    for r in (weight, bias):
        if r is not None and not r.is_float_const:
            raise ctx.unsupported(f"{name} with a weight or bias computed at run time")
    return x, out.pop()


def _data(r: Ref | None) -> np.ndarray | None:
    return None if r is None else r.data


@register(torch.ops.aten.native_layer_norm)
def native_layer_norm(ctx: ImportContext, node, input: Ref, normalized_shape, weight, bias, eps, **_):
    """LayerNorm (as PyTorch's decomposition leaves it) in integers; only its first result may be used.
    Anything this can't do raises ``unsupported``: the op is core ATen, so it then runs in float."""
    x, out = _normalised_result(ctx, node, input, weight, bias)
    return layer_norm(ctx, x, len(normalized_shape), _data(weight), _data(bias), float(eps), out), None, None


def _per_channel_norm(ctx: ImportContext, x: Ref, groups: int, weight, bias, eps: float, out: QuantSpec) -> Ref:
    """Normalise ``x`` [N, C, *spatial] over each group of ``C / groups`` channels and all spatial
    positions (a LayerNorm of the [N, groups, C / groups · spatial] view), then ``w[c]``, ``b[c]``."""
    shape = x.torch_shape
    n, c = shape[0], shape[1]
    plane = int(np.prod(shape[2:]))
    identity = layout.identity(x.rank)
    view = (n, groups, c // groups * plane)
    grouped = Ref.of(ctx.emit("reshape", ctx.value_in(x, identity), perm=(0, 1, 2), shape=view), (0, 1, 2))

    def spread(a):  # w[c] for every element of the view
        return None if a is None else np.repeat(np.asarray(a, np.float64).reshape(groups, c // groups, 1),
                                                plane, axis=2).reshape((1,) + view[1:])
    y = layer_norm(ctx, grouped, 1, spread(weight), spread(bias), eps, out)
    return Ref.of(ctx.emit("reshape", y.value, perm=identity, shape=tuple(shape)), identity)


@register(torch.ops.aten.native_group_norm)
def native_group_norm(ctx: ImportContext, node, input: Ref, weight, bias, N, C, HxW, group, eps, **_):  # noqa: N803
    x, out = _normalised_result(ctx, node, input, weight, bias)
    return _per_channel_norm(ctx, x, int(group), _data(weight), _data(bias), float(eps), out), None, None


@register(torch.ops.aten._native_batch_norm_legit.no_stats)
def instance_norm(ctx: ImportContext, node, input: Ref, weight, bias, training, momentum, eps, **_):
    """Batch statistics without running ones: what InstanceNorm becomes ([1, N·C, ...] view). A LayerNorm
    per channel when the batch is 1; otherwise (true batch statistics) it runs in float."""
    x, out = _normalised_result(ctx, node, input, weight, bias)
    if x.torch_shape[0] != 1:
        raise ctx.unsupported("batch-statistics normalisation over a batch of more than 1 (not an InstanceNorm)")
    c = x.torch_shape[1]
    return _per_channel_norm(ctx, x, c, _data(weight), _data(bias), float(eps), out), None, None
