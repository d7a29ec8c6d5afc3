"""Exact integer GEMMs ``acc[m, n] = sum_k (x[m, k] - x_zp) * (w[n, k] - w_zp[n]) + bias[n]``.

Three engines compute the same integers:

* ``int8`` — ``torch._int_mm`` (int8 x int8 -> int32, oneDNN/VNNI) on the raw
  codes, then ``acc = raw - w_zp * rowsum(x) - x_zp * colsum(w) + K * x_zp * w_zp + bias``
  (the last three terms folded into one per-channel ``offset`` at pack time).
  Exact: ``|raw| <= K * 128 * 128 < 2**31`` for ``K <= 131071``. Used only after a
  known-answer self-test passes on this machine (and, on x86, only with VNNI, whose
  dot products don't saturate like the older ``vpmaddubsw`` sequence).
* ``float32`` — float32 GEMMs on zero-point-centered operands, the reduction
  split into K-chunks such that ``max|x - x_zp| * max_n sum_{k in chunk} |w[n, k] - w_zp[n]| <= 2**24``.
  Every partial sum a GEMM forms (in any order, with or without FMA) is a sum of a
  subset of one chunk's products, hence an integer of magnitude <= 2**24, exactly
  representable in float32: nothing is ever rounded. Chunks are summed in int64.
  (For zp-centered int8 activations and int8 weights, ``|product| <= 255 * 128``, so any
  chunk of up to 514 columns qualifies, and far longer ones for typical weights.)
* ``float64`` — the same argument with 2**53: one float64 GEMM, exact for any
  realistic K.

The default is the fastest exact engine; a plan may force one (tests do, to
check all three against the reference). The float32 engine (and float32 direct
convolutions) are used only while torch computes float32 GEMMs and convolutions in
IEEE float32 (``float32_is_ieee``): a bf16/tf32 precision setting would round.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

import numpy as np
import torch

import qlower.native_build as native_build
from qlower.backends.cpu import weights_cache
from qlower.backends.cpu.tensor_utils import INT32_MAX, check_int32
from qlower.errors import UnsupportedOpError
from qlower.ir import DType, Op, QuantSpec

INT_MM_MAX_K = (2**31 - 1) // (128 * 128)
F32_EXACT = 2**24
F64_EXACT = 2**53
MAX_F32_CHUNKS = 8


@functools.cache
def int_mm_exact() -> bool:
    """Whether ``torch._int_mm`` is exact on this machine (feature check + known-answer test)."""
    if not hasattr(torch, "_int_mm"):
        return False
    if platform.machine().lower() in ("x86_64", "amd64"):
        if not {"avx512_vnni", "avx_vnni", "amx_int8"} & native_build.cpu_flags():
            return False
    rng = np.random.default_rng(1234)
    try:
        for m, k, n in ((64, 64, 64), (1, 300, 17), (37, 513, 65), (130, 1024, 96)):
            for a_vals, b_vals in (((127,), (-128,)), ((-128,), (-128,)), ((127, -128), (127, -128)), (None, None)):
                a = rng.integers(-128, 128, (m, k)) if a_vals is None else rng.choice(a_vals, (m, k))
                b = rng.integers(-128, 128, (k, n)) if b_vals is None else rng.choice(b_vals, (k, n))
                got = torch._int_mm(torch.from_numpy(a.astype(np.int8)), torch.from_numpy(b.astype(np.int8)))
                if not np.array_equal(got.numpy().astype(np.int64), a.astype(np.int64) @ b.astype(np.int64)):
                    return False
    except RuntimeError:
        return False
    return True


def float32_is_ieee() -> bool:
    """Whether torch's float32 matmuls and convolutions currently run in full IEEE float32."""
    if torch.get_float32_matmul_precision() != "highest":
        return False
    mkldnn = torch.backends.mkldnn
    for backend in (mkldnn, getattr(mkldnn, "matmul", None), getattr(mkldnn, "conv", None)):
        if getattr(backend, "fp32_precision", "none") not in ("none", "ieee"):
            return False
    return True


def _f32_chunks(w_abs: np.ndarray, amax: int) -> list[tuple[int, int]] | None:
    """Split K so that ``amax * max_n sum_chunk |w|`` <= 2**24; None if one column alone exceeds it."""
    n, k = w_abs.shape
    limit = F32_EXACT // max(amax, 1)
    if k == 0:
        return [(0, 0)]
    if n and int(w_abs.max()) > limit:
        return None
    cs = np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(w_abs, axis=1)], axis=1)
    chunks, a = [], 0
    while a < k:
        reach = (cs[:, a + 1:] - cs[:, a:a + 1]).max(axis=0) if n else np.zeros(k - a, np.int64)
        b = a + int(np.searchsorted(reach, limit, side="right"))
        chunks.append((a, b))
        a = b
    return chunks


@dataclass(frozen=True)
class PackedGemm:
    """Weights as one engine wants them, plus the integer facts needed to finish the accumulator.

    ``raw`` sums are turned into accumulators by ``acc = raw + offset`` (and
    ``- w_zp * rowsum(x)`` when ``w_zp`` is set, int8 engine only).
    """

    engine: str
    k: int
    n: int
    x_zp: int
    w: torch.Tensor                   # int8 [K, N] raw codes, or centered float32/float64 [K, N]
    chunks: tuple[tuple[int, int], ...]
    offset: np.ndarray                # int64 [N]
    offset_t: torch.Tensor            # int64 [N]
    offset_i32: torch.Tensor | None   # int32 [N] when raw + offset provably can't overflow int32
    w_zp: torch.Tensor | None         # int64 [N]
    raw_bound: int                    # bound on |raw|
    acc_bound: int                    # bound on |acc|

    @property
    def raw_dtype(self) -> torch.dtype:
        return torch.int32 if self.raw_bound <= INT32_MAX else torch.int64


def input_amax(x_dtype: DType, x_zp: int) -> int:
    return max(abs(x_dtype.min - x_zp), abs(x_dtype.max - x_zp))


def choose_engine(x_dtype: DType, x_zp: int, w_dtype: DType, k: int, f32_chunks: int | None,
                  forced: str | None) -> str:
    can = {
        "int8": (x_dtype is DType.INT8 and w_dtype is DType.INT8 and -128 <= x_zp <= 127
                 and k <= INT_MM_MAX_K and int_mm_exact()),
        "float32": f32_chunks is not None and float32_is_ieee(),
        "float64": True,
    }
    if forced is not None and can[forced]:
        return forced
    if can["int8"]:
        return "int8"
    if can["float32"] and f32_chunks <= MAX_F32_CHUNKS:   # exact only while float32 GEMMs are IEEE
        return "float32"
    return "float64"


def pack(w2d: np.ndarray, w_quant: QuantSpec, bias: np.ndarray | None, bias_quant: QuantSpec | None,
         x_dtype: DType, x_zp: int, forced: str | None, kind: str = "gemm", cache: bool = True) -> PackedGemm:
    """Pack ``w2d`` ([N, K] codes) for ``x`` codes of ``x_dtype`` with zero point ``x_zp``.

    Goes through the weights cache (keyed by weights, bias or its absence, and
    every parameter folded into the packing) unless ``cache`` is False.
    """
    def build() -> PackedGemm:
        return _pack(w2d, w_quant, bias, x_dtype, x_zp, forced)
    if not cache:
        return build()
    key = weights_cache.make_key(kind, w2d, w_quant, bias, bias_quant, x_dtype=x_dtype.value, x_zp=x_zp,
                                 engine=forced or "auto", f32_ieee=float32_is_ieee())
    return weights_cache.get_or_pack(key, build)


def _pack(w2d: np.ndarray, w_quant: QuantSpec, bias: np.ndarray | None, x_dtype: DType, x_zp: int,
          forced: str | None) -> PackedGemm:
    n, k = w2d.shape
    w_zp = np.broadcast_to(np.asarray(w_quant.zero_point, dtype=np.int64), (n,))
    wc = w2d.astype(np.int64) - w_zp[:, None]
    w_abs = np.abs(wc)
    amax = input_amax(x_dtype, x_zp)
    l1 = int(w_abs.sum(axis=1).max()) if n and k else 0
    b = np.zeros(n, np.int64) if bias is None else bias.astype(np.int64).reshape(n)
    bmax = int(np.abs(b).max()) if n else 0
    if amax * l1 >= F64_EXACT:
        raise UnsupportedOpError(f"GEMM with K={k} can't be computed exactly (sums may reach {amax * l1})")
    chunks = _f32_chunks(w_abs, amax)
    engine = choose_engine(x_dtype, x_zp, DType.from_numpy(w2d.dtype), k, None if chunks is None else len(chunks),
                           forced)
    acc_bound = amax * l1 + bmax
    any_wzp = bool(np.any(w_zp))
    if engine == "int8":
        colsum = w2d.astype(np.int64).sum(axis=1)
        offset = b - x_zp * colsum + k * x_zp * w_zp
        w = torch.from_numpy(np.ascontiguousarray(w2d.T.astype(np.int8)))
        raw_bound = k * 128 * 128
        fits = (not any_wzp and acc_bound <= INT32_MAX and int(np.abs(offset).max(initial=0)) <= INT32_MAX)
        chunk_list = ((0, k),)
    else:
        offset = b
        dtype = np.float32 if engine == "float32" else np.float64
        w = torch.from_numpy(np.ascontiguousarray(wc.T.astype(dtype)))
        raw_bound = amax * l1
        fits = acc_bound <= INT32_MAX
        chunk_list = tuple(chunks) if engine == "float32" else ((0, k),)
    return PackedGemm(engine, k, n, x_zp, w, chunk_list, offset, torch.from_numpy(offset.copy()),
                      torch.from_numpy(offset.astype(np.int32)) if fits else None,
                      torch.from_numpy(w_zp.copy()) if (engine == "int8" and any_wzp) else None,
                      raw_bound, acc_bound)


def raw_sum(p: PackedGemm, cols: torch.Tensor) -> torch.Tensor:
    """``cols`` ([M, K] codes) times the packed weights: int32 when ``|raw|`` provably fits, else int64."""
    if p.engine == "int8":
        # oneDNN reads the strides as given: a size-1 dim may carry any stride and still count as
        # contiguous (a [N, H, W, 1] view of NCHW codes), and then _int_mm reads garbage
        if cols.stride() != (cols.shape[1], 1):
            cols = cols.clone(memory_format=torch.contiguous_format)
        return torch._int_mm(cols, p.w)
    dtype = p.w.dtype
    xc = cols.to(dtype) - float(p.x_zp)  # exact: integer codes
    if len(p.chunks) == 1:
        return torch.matmul(xc, p.w).to(p.raw_dtype)  # an exact integer-valued result
    total = torch.zeros((cols.shape[0], p.n), dtype=torch.int64)
    for a, b in p.chunks:
        total += torch.matmul(xc[:, a:b], p.w[a:b]).to(torch.int64)
    return total.to(p.raw_dtype)


def accumulate(p: PackedGemm, cols: torch.Tensor, op: Op) -> torch.Tensor:
    """The int32 accumulator (bias included); raises like the reference if it overflows int32."""
    raw = raw_sum(p, cols)
    if p.offset_i32 is not None and raw.dtype == torch.int32:
        return raw.add_(p.offset_i32)  # raw is ours; the sum provably fits int32
    acc = raw.to(torch.int64) + p.offset_t
    if p.w_zp is not None:
        acc -= cols.to(torch.int64).sum(dim=1, keepdim=True) * p.w_zp
    if p.acc_bound > INT32_MAX:
        check_int32(op, acc)
    return acc.to(torch.int32)
