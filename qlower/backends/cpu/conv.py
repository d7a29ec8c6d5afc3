"""conv2d, fully_connected and matmul kernels (NHWC input, OHWI weights).

* groups == 1 convolutions and fully_connected are GEMMs (gemm.py): a pointwise
  conv reads the input as an [M, C] matrix, others go through im2col, whose
  padding taps hold the input zero point (so they contribute exactly 0). Followed
  by an int8 rescale, they run as one native GEMM + requantization where
  qgemm.py proves it exact (AVX-512 VNNI machines; AMX tiles where Linux grants them).
* depthwise and grouped convolutions run "direct": the native int32 depthwise
  kernel (exact while ``max|x - x_zp| * max_o sum|w_o - w_zp| < 2**31``, so every
  partial sum fits int32; on AVX-512BW it multiplies tap pairs in int16, which needs
  int8 zero points and weights that fit int16: ``pair_weights``; followed by a rescale that fastrq.py
  proves, the VNNI kernel ``fast_depthwise_parameters`` describes), or torch's
  float convolution on zero-point-centered operands, in float32 when
  ``max|x - x_zp| * max_o sum|w_o - w_zp|`` <= 2**24 and in float64 otherwise: the
  same subset-sum argument as in gemm.py makes every partial sum exact.
* Float (non-quantized) GEMMs accumulate in float64 like the reference and round
  to float32 once; they agree with it to float64 rounding, not bit for bit.

Every integer kernel returns the exact int32 accumulator (bias included), or, when
fused with the following rescale (and clamp), the requantized codes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from qlower.backends.cpu import fastrq, gemm, qgemm, weights_cache
from qlower.backends.cpu.context import BuildContext, Kernel, builder
from qlower.backends.cpu.quantization import Requantizer, RescaleParams
from qlower.backends.cpu.tensor_utils import INT32_MAX, check_int32, execution_error
from qlower.errors import UnsupportedOpError
from qlower.ir import DType, Op


@dataclass(frozen=True)
class ConvGeometry:
    n: int
    h: int
    w: int
    c: int
    o: int
    kh: int
    kw: int
    ci: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pb: int
    pl: int
    pr: int
    oh: int
    ow: int
    groups: int

    @staticmethod
    def of(op: Op) -> ConvGeometry:
        (n, h, w, c), (o, kh, kw, ci) = op.operands[0].shape, op.operands[1].shape
        (sh, sw), (dh, dw), (pt, pb, pl, pr) = op.attrs["stride"], op.attrs["dilation"], op.attrs["pad"]
        _, oh, ow, _ = op.result.shape
        return ConvGeometry(n, h, w, c, o, kh, kw, ci, sh, sw, dh, dw, pt, pb, pl, pr, oh, ow, op.attrs["groups"])

    @property
    def pointwise(self) -> bool:
        return self.kh == self.kw == 1 and not (self.pt or self.pb or self.pl or self.pr)

    @property
    def depthwise(self) -> bool:
        return self.ci == 1 and self.groups == self.c

    def native_array(self, x_zp: int) -> torch.Tensor:
        """The geometry array ``g`` of the native kernels (_native.c); its last slot is unused."""
        return torch.tensor([self.n, self.h, self.w, self.c, self.kh, self.kw, self.sh, self.sw, self.dh, self.dw,
                             self.pt, self.pl, self.oh, self.ow, x_zp, 1], dtype=torch.int64)


def im2col(x: torch.Tensor, g: ConvGeometry, x_zp: int) -> torch.Tensor:
    """[N*OH*OW, KH*KW*C] patches of NHWC ``x``; taps in the padding hold ``x_zp``."""
    if any((g.pt, g.pb, g.pl, g.pr)):
        x = F.pad(x, (0, 0, g.pl, g.pr, g.pt, g.pb), value=x_zp)
    x = x.contiguous()
    s_n, s_h, s_w, s_c = x.stride()
    patches = x.as_strided((g.n, g.oh, g.ow, g.kh, g.kw, g.c),
                           (s_n, s_h * g.sh, s_w * g.sw, s_h * g.dh, s_w * g.dw, s_c))
    return patches.reshape(g.n * g.oh * g.ow, g.kh * g.kw * g.c)


class _IntGemmOp:
    """Shared weight handling of the integer conv/fully_connected kernels."""

    def __init__(self, op: Op, ctx: BuildContext) -> None:
        x, w, b = op.operands
        self.op, self.ctx = op, ctx
        self.x_dtype, self.x_zp = x.dtype, x.quant.zero_point[0]
        self.w_quant, self.b_quant = w.quant, (b.quant if b is not None else None)
        self.out_shape = op.result.shape
        w_data, b_data = ctx.constant(w), ctx.constant(b)
        self.static = w_data is not None and (b is None or b_data is not None)
        self.packed = self.pack(w_data, b_data, cache=True) if self.static else None

    def pack(self, w: np.ndarray, b: np.ndarray | None, cache: bool):
        raise NotImplementedError

    def weights(self, w: torch.Tensor, b: torch.Tensor | None):
        if self.packed is not None:
            return self.packed
        return self.pack(w.numpy(), None if b is None else b.numpy(), cache=False)


class GemmConv(_IntGemmOp):
    """groups == 1 conv2d, or fully_connected (``fc=True``), on an integer GEMM engine."""

    def __init__(self, op: Op, ctx: BuildContext, fc: bool = False) -> None:
        self.fc = fc
        self.g = None if fc else ConvGeometry.of(op)
        super().__init__(op, ctx)
        # padding taps hold the zero point, so it must be a code of the input's dtype
        self.pad_dtype = None if fc or self.x_dtype.min <= self.x_zp <= self.x_dtype.max else torch.int32
        self.use_native_im2col = (ctx.native is not None and not fc and not self.g.pointwise
                                  and self.x_dtype is DType.INT8 and self.pad_dtype is None)
        if self.use_native_im2col:
            self.geometry = self.g.native_array(self.x_zp)

    def pack(self, w, b, cache):
        w2d = w.reshape(w.shape[0], -1)
        return gemm.pack(w2d, self.w_quant, b, self.b_quant, self.x_dtype, self.x_zp, self.ctx.gemm_engine,
                         cache=cache)

    def cols(self, x: torch.Tensor, width: int | None = None) -> torch.Tensor:
        """The GEMM's [M, K] input; ``width`` > K (native im2col only): rows of ``width`` columns, 0 past K."""
        if self.fc:
            return x.reshape(-1, x.shape[-1])
        g = self.g
        if g.pointwise:
            if g.sh > 1 or g.sw > 1:
                x = x[:, ::g.sh, ::g.sw, :]
            return x.reshape(g.n * g.oh * g.ow, g.c)
        if self.use_native_im2col:
            k = g.kh * g.kw * g.c
            geometry = self.geometry
            if width is not None and width > k:
                geometry = geometry.clone()
                geometry[15] = width
            cols = torch.empty((g.n * g.oh * g.ow, max(k, width or 0)), dtype=torch.int8)
            self.ctx.native.im2col(x.contiguous(), geometry, cols)
            return cols
        return im2col(x if self.pad_dtype is None else x.to(self.pad_dtype), g, self.x_zp)

    def __call__(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        p = self.weights(w, b)
        return gemm.accumulate(p, self.cols(x), self.op).reshape(self.out_shape)

    def with_requant(self, params: RescaleParams, rescale_op: Op, clamp: tuple[int, int] | None) -> Kernel:
        """``clamp(rescale(conv(x)))`` in one kernel: the GEMM's offset is folded into the rescale."""
        rank = len(self.out_shape)

        def requantizer(p: gemm.PackedGemm) -> Requantizer:
            offset = p.offset if p.w_zp is None else None  # else the accumulator is finished first
            return Requantizer(params, rank, DType.INT32, rescale_op, self.ctx.native, offset=offset,
                               acc_op=self.op, clamp=clamp)
        static_rq = requantizer(self.packed) if self.packed is not None else None
        native = self.ctx.native
        rows = int(np.prod(self.out_shape[:-1]))
        fused = (qgemm.pack(self.packed, params, rank, clamp, rows=rows, amx=native.has_amx)
                 if self.packed is not None and native is not None and native.has_qgemm else None)
        # the AMX kernel steps K by 4: im2col pads the columns of a K % 4 != 0 conv (a 3-channel stem) with zeros
        k = self.packed.k if self.packed is not None else 0
        width = -(-k // 4) * 4 if k % 4 and self.use_native_im2col else None
        amx = (fused is not None and fused.chan_amx is not None and native.has_amx and rows >= qgemm.AMX_MIN_M
               and (k % 4 == 0 or width is not None))

        def run(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
            p = self.weights(w, b)
            cols = self.cols(x, width if amx and p is self.packed else None)
            if fused is not None and p is self.packed:
                out = torch.empty(self.out_shape, dtype=torch.int8)
                if amx:
                    native.qgemm_amx(cols.contiguous(), fused.weights, fused.n, fused.chan_amx, fused.scalars, out)
                else:
                    native.qgemm(cols.contiguous(), fused.weights, fused.n, fused.chan, fused.scalars, out)
                return out
            raw = gemm.raw_sum(p, cols) if p.w_zp is None else gemm.accumulate(p, cols, self.op)
            rq = static_rq if p is self.packed else requantizer(p)
            return rq(raw.reshape(self.out_shape))
        return run


@dataclass(frozen=True)
class PackedDirect:
    """Weights of a depthwise/grouped conv for the native kernel or torch's float convolution."""

    mode: str                      # "native", "float32" or "float64"
    weight: torch.Tensor           # native: int32 [KH*KW, O]; float: centered [O, CI, KH, KW]
    bias: np.ndarray               # int64 [O]
    bias_t: torch.Tensor           # int64 [O]
    acc_bound: int
    weight16: torch.Tensor | None = None   # native: the tap-pair packing (pair_weights) or None


def pair_weights(taps: np.ndarray) -> np.ndarray | None:
    """The native depthwise kernels' int16 packing of centered weights ``taps`` [T, O] in ceil(O / 32) blocks
    of 32 channels, the last one zero-filled (_native.c, dw_pairs_32 reads the full blocks, dw_fast_block all),
    or None when a weight doesn't fit int16.

    Taps go in pairs (an odd count gets a zero tap); for each block of 32 channels and pair (a, b), 32 int16
    for the low and 32 for the high halves of the 128-bit lanes: position 8l + 2j (+1) holds tap a's (b's)
    weight of channel 8l + j (low) or 8l + 4 + j (high), l, j < 4, as vpunpck{l,h}wd interleaves the codes."""
    t, o = taps.shape
    nb, p = -(-o // 32), -(-t // 2)
    if nb == 0 or np.abs(taps).max(initial=0) > 32767:
        return None
    padded = np.zeros((2 * p, nb * 32), np.int16)
    padded[:t, :o] = taps
    # [pair, ab, block, l, half, j] -> [block, pair, half, l, j, ab]
    return np.ascontiguousarray(padded.reshape(p, 2, nb, 4, 2, 4).transpose(2, 0, 4, 3, 5, 1))


# the channel of each accumulator lane of dw_fast_block, per block of 32: vpunpcklwd's then vpunpckhwd's
FAST_DW_LANES = np.array([8 * l + j for l in range(4) for j in range(4)]
                         + [8 * l + 4 + j for l in range(4) for j in range(4)])


def fast_depthwise_parameters(p: PackedDirect, x_zp: int, params: RescaleParams,
                              clamp: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fastrq parameters (in dw_fast_block's lane order) and clamp bounds of the native fast depthwise
    kernel, or None where it does not apply.

    The kernel sums raw codes ``sum x * w`` (padding taps read ``x_zp``): ``|x| <= 128 <= max|x - x_zp|``,
    so every partial sum is within the bound ``_pack`` proved for the centered sums (int32), and
    ``bias - x_zp * sum w`` (per channel, exact in int64) is the offset that makes it the true accumulator."""
    if p.mode != "native" or p.weight16 is None or not fastrq.applies(params, 4, p.acc_bound):
        return None
    taps = p.weight.numpy().astype(np.int64)   # [T, O], centered
    o = taps.shape[1]
    offset = p.bias - x_zp * taps.sum(axis=0)
    blocks = -(-o // 32)
    lanes = (np.arange(blocks)[:, None] * 32 + FAST_DW_LANES[None, :]).reshape(-1)
    lanes = np.where(lanes < o, lanes, -1)
    rq = torch.from_numpy(np.ascontiguousarray(fastrq.parameters(offset, params, lanes)))
    return rq, torch.tensor(fastrq.clamp_bounds(params, clamp), dtype=torch.int64)


class DirectConv(_IntGemmOp):
    """Depthwise (any channel multiplier) and grouped integer convolutions."""

    def __init__(self, op: Op, ctx: BuildContext) -> None:
        self.g = ConvGeometry.of(op)
        super().__init__(op, ctx)
        self.mult = self.g.o // self.g.c if self.g.depthwise else 1

    def pack(self, w, b, cache):
        def build() -> PackedDirect:
            return self._pack(w, b)
        if not cache:
            return build()
        key = weights_cache.make_key("conv2d-direct", w, self.w_quant, b, self.b_quant, x_dtype=self.x_dtype.value,
                                     x_zp=self.x_zp, groups=self.g.groups, engine=self.ctx.gemm_engine or "auto",
                                     native=self.ctx.native is not None, layout="taps-by-channel+padded-pairs",
                                     f32_ieee=gemm.float32_is_ieee())
        return weights_cache.get_or_pack(key, build)

    def _pack(self, w: np.ndarray, b: np.ndarray | None) -> PackedDirect:
        g = self.g
        w_zp = np.broadcast_to(np.asarray(self.w_quant.zero_point, dtype=np.int64), (g.o,))
        wc = w.astype(np.int64) - w_zp[:, None, None, None]
        amax = gemm.input_amax(self.x_dtype, self.x_zp)
        l1 = int(np.abs(wc).reshape(g.o, -1).sum(axis=1).max())
        bias = np.zeros(g.o, np.int64) if b is None else b.astype(np.int64).reshape(g.o)
        acc_bound = amax * l1 + int(np.abs(bias).max(initial=0))
        if amax * l1 >= gemm.F64_EXACT:
            raise UnsupportedOpError(f"conv2d %{self.op.result.name}: sums of up to {amax * l1} can't be "
                                     "computed exactly (more than 2**53)")
        forced = self.ctx.gemm_engine
        weight16 = None
        native_ok = (self.ctx.native is not None and g.depthwise and self.x_dtype is DType.INT8
                     and amax * l1 <= INT32_MAX and forced in (None, "int8"))
        if native_ok:
            taps = wc.reshape(g.o, g.kh * g.kw).T.astype(np.int32)  # [KH*KW, O]
            weight = torch.from_numpy(np.ascontiguousarray(taps))
            # the pair path reads padding taps from a row of x_zp codes and centers in int16: int8 zero points
            pairs = pair_weights(taps) if self.ctx.native.dwconv_pairs and -128 <= self.x_zp <= 127 else None
            weight16 = None if pairs is None else torch.from_numpy(pairs)
            mode = "native"
        else:
            f32 = amax * l1 <= gemm.F32_EXACT and forced != "float64" and gemm.float32_is_ieee()
            dtype = np.float32 if f32 else np.float64
            weight = torch.from_numpy(np.ascontiguousarray(wc.transpose(0, 3, 1, 2).astype(dtype)))
            mode = "float32" if f32 else "float64"
        return PackedDirect(mode, weight, bias, torch.from_numpy(bias.copy()), acc_bound, weight16)

    def _native_input(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        return x if self.mult == 1 else x.repeat_interleave(self.mult, dim=3)

    def _native_geometry(self) -> torch.Tensor:
        return replace(self.g, c=self.g.o).native_array(self.x_zp)

    def _torch_conv(self, p: PackedDirect, x: torch.Tensor) -> torch.Tensor:
        g = self.g
        dtype = p.weight.dtype
        xc = (x.to(dtype) - float(self.x_zp)).permute(0, 3, 1, 2)  # exact: integer codes
        if g.pt != g.pb or g.pl != g.pr:
            xc = F.pad(xc, (g.pl, g.pr, g.pt, g.pb))
            padding = (0, 0)
        else:
            padding = (g.pt, g.pl)
        y = F.conv2d(xc, p.weight, None, (g.sh, g.sw), padding, (g.dh, g.dw), g.groups)
        acc = y.permute(0, 2, 3, 1).to(torch.int64 if p.acc_bound > INT32_MAX else torch.int32)
        return acc + (p.bias_t if p.acc_bound > INT32_MAX else p.bias_t.to(torch.int32))

    def __call__(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        p = self.weights(w, b)
        if p.mode == "native":
            out = torch.empty(self.out_shape, dtype=torch.int32)
            chan = torch.zeros((7, self.g.o), dtype=torch.int64)
            chan[0] = p.bias_t  # only the offsets (the bias) are read without requantization
            chan = chan.reshape(-1)
            flags = self.ctx.native.dwconv(self._native_input(x), self._native_geometry(), p.weight, p.weight16, chan,
                                           torch.zeros(6, dtype=torch.int64), out, requant=False)
            if flags:
                raise execution_error(self.op, "overflows int32 (accumulator out of range)")
            return out.contiguous()
        acc = self._torch_conv(p, x)
        if p.acc_bound > INT32_MAX:
            check_int32(self.op, acc)
        return acc.to(torch.int32).contiguous()

    def _native_params(self, p: PackedDirect, params: RescaleParams, rescale_op: Op,
                       clamp: tuple[int, int] | None) -> tuple[Requantizer, torch.Tensor]:
        rq = Requantizer(params, 4, DType.INT32, rescale_op, None, offset=p.bias, acc_op=self.op, clamp=clamp)
        return rq, rq.chan_row.reshape(-1).contiguous()

    def with_requant(self, params: RescaleParams, rescale_op: Op, clamp: tuple[int, int] | None) -> Kernel:
        fused_native = params.out_dtype is DType.INT8 and (params.axis is None or params.axis == 3)
        rq_static = None
        if self.packed is not None and self.packed.mode == "native" and fused_native:
            rq_static = self._native_params(self.packed, params, rescale_op, clamp)
        plain = Requantizer(params, 4, DType.INT32, rescale_op, self.ctx.native, clamp=clamp)
        geometry = self._native_geometry()
        native = self.ctx.native
        fast = (fast_depthwise_parameters(self.packed, self.x_zp, params, clamp)
                if self.packed is not None and native is not None and native.has_dwconv_fast else None)

        def run(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
            p = self.weights(w, b)
            if fast is not None and p is self.packed:
                out = torch.empty(self.out_shape, dtype=torch.int8)
                native.dwconv_fast(self._native_input(x), geometry, p.weight16, fast[0], fast[1], out)
                return out
            if p.mode == "native" and fused_native:
                rq, chan = rq_static if p is self.packed else self._native_params(p, params, rescale_op, clamp)
                out = torch.empty(self.out_shape, dtype=torch.int8)
                flags = self.ctx.native.dwconv(self._native_input(x), geometry, p.weight, p.weight16, chan,
                                               rq.scalars, out, requant=True)
                if flags:
                    rq._raise(flags)
                return out
            return plain(self(x, w, b))
        return run


def int_conv_kernel(op: Op, ctx: BuildContext) -> GemmConv | DirectConv:
    if op.kind == "fully_connected":
        return GemmConv(op, ctx, fc=True)
    return GemmConv(op, ctx) if op.attrs["groups"] == 1 else DirectConv(op, ctx)


def _float_conv(op: Op, ctx: BuildContext) -> Kernel:
    g = ConvGeometry.of(op)

    def run(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        xd = x.to(torch.float64).permute(0, 3, 1, 2)
        if g.pt != g.pb or g.pl != g.pr:
            xd, padding = F.pad(xd, (g.pl, g.pr, g.pt, g.pb)), (0, 0)
        else:
            padding = (g.pt, g.pl)
        y = F.conv2d(xd, w.to(torch.float64).permute(0, 3, 1, 2), None, (g.sh, g.sw), padding, (g.dh, g.dw), g.groups)
        y = y.permute(0, 2, 3, 1)
        if b is not None:
            y = y + b.to(torch.float64)
        return y.to(torch.float32).contiguous()
    return run


@builder("conv2d", "fully_connected")
def _conv(op: Op, ctx: BuildContext) -> Kernel:
    if op.result.type.quant is not None:
        return int_conv_kernel(op, ctx)
    if op.kind == "conv2d":
        return _float_conv(op, ctx)

    def fc(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.matmul(x.to(torch.float64), w.to(torch.float64).T)
        if b is not None:
            y = y + b.to(torch.float64)
        return y.to(torch.float32)
    return fc


@builder("matmul")
def _matmul(op: Op, ctx: BuildContext) -> Kernel:
    """Batched matmul of two runtime tensors: a float64 GEMM on centered codes, exact while
    ``K * max|a - a_zp| * max|b - b_zp| < 2**53`` (the reference's rule; it refuses otherwise, and so does this)."""
    at, bt = op.operands[0].type, op.operands[1].type
    if op.result.type.quant is None:
        return lambda a, b: torch.matmul(a.to(torch.float64), b.to(torch.float64)).to(torch.float32)
    za, zb = at.quant.zero_point[0], bt.quant.zero_point[0]
    k = at.shape[-1]
    bound = k * gemm.input_amax(at.dtype, za) * gemm.input_amax(bt.dtype, zb)

    def run(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if bound >= gemm.F64_EXACT:
            raise execution_error(op, f"a sum of {k} products of {at.dtype.value} x {bt.dtype.value} codes "
                                      "can't be proven exact in float64")
        acc = torch.matmul(a.to(torch.float64) - float(za), b.to(torch.float64) - float(zb)).to(torch.int64)
        if bound > INT32_MAX:
            check_int32(op, acc)
        return acc.to(torch.int32)
    return run
