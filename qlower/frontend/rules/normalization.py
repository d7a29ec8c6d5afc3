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


def _plain(ctx: ImportContext, value: int, rank: int, spec: QuantSpec):
    return ctx.constant(np.full((1,) * rank, value, np.int32), spec)


def _fine_scale(m: int, e: float) -> tuple[int, int, float]:
    """How much finer (``4**j``) small variances are held (see layer_norm): ``(j, V limit, bound on U)``.

    Holding E as ``round(M·E)`` moves the normalised value by at most ``sqrt(N) / (4 U)``: ``U`` is at
    least ``M_f·E`` on the fine path and ``M·(limit + 1)`` on the coarse one; ``j`` maximises the smaller.
    """
    best = (0, -1, m * e - 0.5)
    for j in range(1, 16):
        fine = m * 4**j
        limit = int((2**30 - 1) // fine - e - 2)
        if limit < 0:
            break
        smallest = min(fine * e - 0.5, m * (limit + 1.0))
        if smallest > best[2]:
            best = (j, limit, smallest)
    return best


def _layer_norm_error(n: int, m: int, u_min: float, w_max: float, t2: float) -> float:
    """Bound (in output value units) on |integer LayerNorm - exact| before the output rounding; see layer_norm."""
    normalised = (np.sqrt(n) / (4 * max(u_min, 1e-30))              # E held as an integer
                  + np.sqrt(n) * (2.0**-(TABLE_BITS) + 2.0**-22)    # index truncation, table rounding
                  + 0.5 * np.sqrt(m) / 2**22 + 0.5 * np.sqrt(n) / 2**15)  # two rescale roundings
    return w_max * normalised + (2**15 + 1) * t2                    # weight and bias codes at t2


def layer_norm(ctx: ImportContext, x: Ref, dims: int, weight: np.ndarray | None, bias: np.ndarray | None,
               eps: float, out: QuantSpec) -> Ref:
    """LayerNorm over the last ``dims`` PyTorch dims of per-tensor codes, from existing integer IR ops only;
    ``weight`` / ``bias`` (None: 1 / 0) hold one value per element of those dims (their size).

    With ``d = q - zp`` over the ``N`` normalised elements: ``D = N·d - Σd``, ``V = N·Σd² - (Σd)²``, and
    ``(x - mean) / sqrt(var + eps) = D / sqrt(V + E)`` with ``E = N² eps / s²``. ``U = M·V + round(M·E)``
    (``M`` the largest power of 4 that keeps ``U`` below ``2**30``; a small ``V`` is held ``4**j`` times
    finer, so that rounding ``E`` stays negligible, see ``_fine_scale``) is normalised to ``W = U·4**k`` in
    ``[2**28, 2**30)`` by four compare-free steps (``intdiv`` / ``clamp`` / ``mul`` / ``add``), the
    reciprocal square root read from a table at ``W / 2**16``, and ``D·2**k·table`` gives the normalised
    value at a fixed scale; the affine part uses int32 codes at one scale, as ``channel_affine``. Every
    step is an IR op that each backend computes exactly as the reference; the static error bound is
    checked against half an output step.
    """
    q = x.spec
    rank, s, zp = x.rank, q.scale[0], q.zero_point[0]
    shape = x.torch_shape
    n = int(np.prod(shape[rank - dims:]))
    widest = max(q.qmax - zp, zp - q.qmin)
    bound = n * n * widest * widest
    e = n * n * eps / (s * s)
    m = 1
    while 4 * m * (bound + e + 1) < 2**30:
        m *= 4
    if m * (bound + e + 1) >= 2**30:
        raise ctx.unsupported(f"layer_norm over {n} elements: N²·max|d|² = {bound} leaves no int32 headroom")
    full = (1,) * (rank - dims) + tuple(shape[rank - dims:])
    w = np.ones(full) if weight is None else np.asarray(weight, np.float64)
    b = np.zeros(full) if bias is None else np.asarray(bias, np.float64)
    w, b = (a if a.ndim == rank else a.reshape(full) for a in (w, b))  # rank-sized: broadcast as they are
    span = np.sqrt(n) * float(np.abs(w).max()) + float(np.abs(b).max())
    t2 = (span or 1.0) / 2**29
    j, limit, u_min = _fine_scale(m, e)
    error = _layer_norm_error(n, m, u_min, float(np.abs(w).max()), t2)
    if error >= MAX_ERROR_STEPS * out.scale[0]:
        raise ctx.unsupported(f"integer layer_norm would be {error / out.scale[0]:.2f} output steps from exact "
                              f"(eps term N²·eps/s² = {e:.3g} is too small)")

    perm = layout.identity(rank)
    axes = list(range(rank - dims, rank))
    i32 = QuantSpec.per_tensor(s, 0, DType.INT32)
    one = QuantSpec.per_tensor(1.0, 0, DType.INT32)
    d = ctx.rescale(ctx.value_in(x, perm), i32, perm)

    def total(v):
        for axis in axes:
            v = ctx.emit("reduce_sum", v, perm=perm, axis=axis)
        return v

    s1 = total(d)
    big_d = ctx.emit("sub", ctx.emit("mul", d, _plain(ctx, n, rank, one), perm=perm), s1, perm=perm)
    s2 = total(ctx.emit("mul", d, d, perm=perm))
    v = ctx.emit("sub", ctx.emit("mul", s2, _plain(ctx, n, rank, one), perm=perm),
                 ctx.emit("mul", s1, s1, perm=perm), perm=perm)
    u = ctx.emit("mul", v, _plain(ctx, m, rank, one), perm=perm)
    u = ctx.emit("add", u, _plain(ctx, int(round(m * e)), rank, u.quant), perm=perm)
    power = None
    if j:  # V up to the limit: U = M·4**j·V + round(M·4**j·E), and the result's 2**j is in ``power``
        fine = m * 4**j
        small_u = ctx.emit("mul", ctx.emit("clamp", v, perm=perm, min=0, max=limit),
                           _plain(ctx, fine, rank, one), perm=perm)
        small_u = ctx.emit("add", small_u, _plain(ctx, int(round(fine * e)), rank, small_u.quant), perm=perm)
        large = ctx.emit("clamp", ctx.emit("intdiv", v, _plain(ctx, limit + 1, rank, v.quant), perm=perm),
                         perm=perm, min=0, max=1)
        u = ctx.emit("add", small_u, ctx.emit("mul", ctx.emit("sub", u, small_u, perm=perm), large, perm=perm),
                     perm=perm)
        small = ctx.emit("sub", _plain(ctx, 1, rank, large.quant), large, perm=perm)
        power = ctx.emit("add", ctx.emit("mul", small, _plain(ctx, 2**j - 1, rank, one), perm=perm),
                         _plain(ctx, 1, rank, small.quant), perm=perm)
    # normalise: for step in 8, 4, 2, 1: if U < 2**(30 - 2·step): U ·= 4**step, 2**k ·= 2**step
    for step in (8, 4, 2, 1):
        limit = 2 ** (30 - 2 * step)
        at_least = ctx.emit("clamp", ctx.emit("intdiv", u, _plain(ctx, limit, rank, u.quant), perm=perm),
                            perm=perm, min=0, max=1)
        below = ctx.emit("sub", _plain(ctx, 1, rank, at_least.quant), at_least, perm=perm)
        grown = ctx.emit("mul", ctx.emit("clamp", u, perm=perm, min=0, max=limit - 1),
                         _plain(ctx, 4**step, rank, one), perm=perm)
        u = ctx.emit("add", u, ctx.emit("mul", ctx.emit("sub", grown, u, perm=perm), below, perm=perm), perm=perm)
        factor = ctx.emit("add", ctx.emit("mul", below, _plain(ctx, 2**step - 1, rank, one), perm=perm),
                          _plain(ctx, 1, rank, below.quant), perm=perm)
        power = factor if power is None else ctx.emit("mul", power, factor, perm=perm)
    index = ctx.emit("intdiv", u, _plain(ctx, 2**16, rank, u.quant), perm=perm)
    index16 = ctx.rescale(index, QuantSpec(DType.INT16, (1.0,), (0,), 0, 2**TABLE_BITS - 1), perm)
    codes = np.arange(2**TABLE_BITS, dtype=np.float64)
    table = np.where(codes > 0, np.rint(RSQRT_ONE / np.sqrt(codes + 0.5)), 0).astype(np.int32)
    # y = D·2**k·table·sqrt(M) / 2**38: the table's scale makes the product's scale that of y
    rsqrt = ctx.emit("table", index16, perm=perm, table=table, offset=0,
                     out=QuantSpec.per_tensor(np.sqrt(m) / (2.0**38 * s), 0, DType.INT32))
    scaled = ctx.emit("mul", ctx.emit("mul", big_d, power, perm=perm), rsqrt, perm=perm, shift=16)
    y = ctx.rescale(scaled, QuantSpec.per_tensor(np.sqrt(n) / 2**15, 0, DType.INT32), perm)
    # affine: y·w + b with w codes at t2 / s_y and b codes at the product's scale (about t2)
    s_y = y.quant.scale[0]
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
