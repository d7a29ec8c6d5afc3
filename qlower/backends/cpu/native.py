"""The fused C kernels (``_native.c``): built once per machine, loaded with ctypes.

The library is compiled with the system C compiler (``-O3 -march=native
-fopenmp``) into a cache directory keyed by the source, the compiler and the
CPU's feature flags, so a binary is never reused on a CPU it wasn't built for.
It links ``libgomp.so.1``, the OpenMP runtime torch has already loaded, so both
share one thread pool (``torch.set_num_threads`` applies to both).

Every native kernel has a pure-torch twin computing the same integers; tests
check that they agree. ``QLOWER_CPU_NATIVE=0`` disables the library, and a
failed build falls back to the torch kernels with a warning.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import warnings
from pathlib import Path

import numpy as np
import torch

import qlower.native_build as native_build

SOURCE = Path(__file__).with_name("_native.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c99")
FLAG_INT32 = 1
FLAG_SCALE = 2

_RESCALE_TYPES = {torch.int8: "i8", torch.int16: "i16", torch.int32: "i32"}

_lock = threading.Lock()
_loaded: NativeKernels | None = None
_tried = False
_failure = ""  # why the last build attempt gave no library


def _ptr(t: torch.Tensor) -> int:
    """The tensor's data address: ctypes passes a plain int to a ``c_void_p`` parameter as the pointer
    (no ``c_void_p`` object per argument: a run makes ~300 such calls)."""
    return t.data_ptr()


class NativeKernels:
    """Typed entry points of the C library; tensors must be contiguous and of the stated dtypes."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))  # CDLL releases the GIL during calls
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        self._rescale = {}
        for tin, a in _RESCALE_TYPES.items():
            for tout, b in _RESCALE_TYPES.items():
                fn = getattr(lib, f"qlw_rescale_{a}_{b}")
                fn.argtypes, fn.restype = [p, i64, i64, p, p, p], i64
                self._rescale[(tin, tout)] = fn
        self._qadd = lib.qlw_qadd_i8
        self._qadd.argtypes, self._qadd.restype = [p, p, i64, p, p], i64
        self._dwconv = lib.qlw_dwconv_i8
        self._dwconv.argtypes, self._dwconv.restype = [p, p, p, p, p, p, p, i64], i64
        lib.qlw_dwconv_has_pairs.restype = i64
        self.dwconv_pairs = lib.qlw_dwconv_has_pairs() == 1  # the int16 tap-pair path (AVX-512BW builds)
        self._im2col = lib.qlw_im2col_i8
        self._im2col.argtypes, self._im2col.restype = [p, p, p], None
        self._maxpool = lib.qlw_maxpool_i8
        self._maxpool.argtypes, self._maxpool.restype = [p, p, p], None
        self._quantize = lib.qlw_quantize_f32_i8
        self._quantize.argtypes, self._quantize.restype = [p, i64, p, p], i64
        self._copy_finite = lib.qlw_copy_finite_f32
        self._copy_finite.argtypes, self._copy_finite.restype = [p, p, i64], i64
        self._to_nhwc = lib.qlw_nchw_to_nhwc_i8
        self._to_nhwc.argtypes, self._to_nhwc.restype = [p, i64, i64, i64, p], None
        self._lut2 = lib.qlw_lut2_i8
        self._lut2.argtypes, self._lut2.restype = [p, p, i64, p, p], None
        self._qgemm = lib.qlw_qgemm_i8
        self._qgemm.argtypes, self._qgemm.restype = [p, i64, i64, i64, p, p, p, p], None
        lib.qlw_has_qgemm.restype = i64
        self.has_qgemm = lib.qlw_has_qgemm() == 1  # built without AVX-512 VNNI, qgemm is an empty stub
        self._qgemm_amx = lib.qlw_qgemm_amx_i8
        self._qgemm_amx.argtypes, self._qgemm_amx.restype = [p, i64, i64, i64, p, p, p, p], None
        lib.qlw_amx_init.restype = i64
        self.has_amx = self.has_qgemm and lib.qlw_amx_init() == 1   # AMX builds whose process Linux gives tiles
        self._dwconv_fast = lib.qlw_dwconv_fast_i8
        self._dwconv_fast.argtypes, self._dwconv_fast.restype = [p, p, p, p, p, p], None
        lib.qlw_has_dwconv_fast.restype = i64
        self.has_dwconv_fast = lib.qlw_has_dwconv_fast() == 1  # AVX-512 VNNI + VBMI builds, else a stub
        self.path = path

    def can_rescale(self, tin: torch.dtype, tout: torch.dtype) -> bool:
        return (tin, tout) in self._rescale

    def rescale(self, x: torch.Tensor, period: int, chan: torch.Tensor, scalars: torch.Tensor,
                out: torch.Tensor) -> int:
        """``out = rescale(x + offset)``, channel parameters repeating every ``period`` values
        (a multiple of the channel count; see _native.c); returns flags."""
        return self._rescale[(x.dtype, out.dtype)](_ptr(x), x.numel(), period, _ptr(chan), _ptr(scalars),
                                                   _ptr(out))

    def qadd(self, a: torch.Tensor, b: torch.Tensor, params: torch.Tensor, out: torch.Tensor) -> int:
        return self._qadd(_ptr(a), _ptr(b), a.numel(), _ptr(params), _ptr(out))

    def dwconv(self, x: torch.Tensor, geometry: torch.Tensor, w: torch.Tensor, w16: torch.Tensor | None,
               chan: torch.Tensor, scalars: torch.Tensor, out: torch.Tensor, requant: bool) -> int:
        """Depthwise conv (+ requantization); ``w16``: the tap-pair packing of conv.py, or None."""
        return self._dwconv(_ptr(x), _ptr(geometry), _ptr(w), None if w16 is None else _ptr(w16), _ptr(chan),
                            _ptr(scalars), _ptr(out), int(requant))

    def dwconv_fast(self, x: torch.Tensor, geometry: torch.Tensor, w16: torch.Tensor, rq: torch.Tensor,
                    bounds: torch.Tensor, out: torch.Tensor) -> None:
        """Depthwise conv + fastrq's requantization to int8 (conv.py ``FastDepthwise``); ``w16``: pair_weights'
        packing of every channel block, ``rq``: fastrq parameters in the kernel's lane order, ``bounds``: a, b."""
        self._dwconv_fast(_ptr(x), _ptr(geometry), _ptr(w16), _ptr(rq), _ptr(bounds), _ptr(out))

    def im2col(self, x: torch.Tensor, geometry: torch.Tensor, cols: torch.Tensor) -> None:
        self._im2col(_ptr(x), _ptr(geometry), _ptr(cols))

    def maxpool(self, x: torch.Tensor, geometry: torch.Tensor, out: torch.Tensor) -> None:
        """int8 NHWC max pooling, padding at int8's minimum; ``geometry``: N, H, W, C, KH, KW, SH, SW, PT, PL,
        OH, OW (int64)."""
        self._maxpool(_ptr(x), _ptr(geometry), _ptr(out))

    def quantize(self, x: torch.Tensor, params: torch.Tensor, out: torch.Tensor) -> bool:
        """float32 ``x`` to int8 ``out`` per tensor, ``params`` float32 (1/scale, zp, qmin, qmax); False when
        a NaN was met."""
        return self._quantize(_ptr(x), x.numel(), _ptr(params), _ptr(out)) == 0

    def qgemm(self, x: torch.Tensor, w: torch.Tensor, n: int, chan: torch.Tensor, scalars: torch.Tensor,
              out: torch.Tensor) -> None:
        """int8 ``x`` [M, K] times VNNI-packed weights, requantized to int8 ``out`` [M, n] (qgemm.py)."""
        self._qgemm(_ptr(x), x.shape[0], x.shape[1], n, _ptr(w), _ptr(chan), _ptr(scalars), _ptr(out))

    def copy_finite(self, dst: np.ndarray, src: np.ndarray) -> bool:
        """Copy C-contiguous float32 ``src`` into ``dst`` (same size); False when ``src`` holds NaN or infinity."""
        if not (src.dtype == dst.dtype == np.float32 and src.size == dst.size and src.flags.c_contiguous
                and dst.flags.c_contiguous and dst.flags.writeable):
            raise ValueError("copy_finite takes two C-contiguous float32 arrays of one size, the first writable")
        return self._copy_finite(dst.ctypes.data, src.ctypes.data, src.size) == 1

    def nchw_to_nhwc(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """int8 ``x`` [N, C, H, W] (contiguous) to ``out`` [N, H, W, C]."""
        n, c, h, w = x.shape
        self._to_nhwc(_ptr(x), n, c, h * w, _ptr(out))

    def qgemm_amx(self, x: torch.Tensor, w: torch.Tensor, n: int, chan: torch.Tensor, scalars: torch.Tensor,
                  out: torch.Tensor) -> None:
        """``qgemm`` on AMX tiles (K % 4 == 0, ``chan``: qgemm.py's ``chan_amx``)."""
        self._qgemm_amx(_ptr(x), x.shape[0], x.shape[1], n, _ptr(w), _ptr(chan), _ptr(scalars), _ptr(out))

    def lut2(self, a: torch.Tensor, b: torch.Tensor, table: torch.Tensor, out: torch.Tensor) -> None:
        """``out[i] = table[(a[i] + 128) * 256 + b[i] + 128]``: int8 ``a``, ``b``, ``out`` of one size, int8 table
        of 65536 entries and 3 more bytes (read, never used: the kernel gathers dwords)."""
        self._lut2(_ptr(a), _ptr(b), a.numel(), _ptr(table), _ptr(out))


def load() -> NativeKernels | None:
    """The native kernels, building them on first use; None when disabled or unavailable
    (``unavailable_reason()`` says why)."""
    global _loaded, _tried, _failure
    if os.environ.get("QLOWER_CPU_NATIVE", "1") == "0":
        return None
    with _lock:
        if not _tried:
            _tried = True
            compiler = native_build.compiler()
            if compiler is None:
                _failure = "no C compiler found ($CC, cc or gcc)"
            else:
                try:
                    _loaded = NativeKernels(native_build.build_library(SOURCE, FLAGS, "cpu-native", compiler))
                except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                    _failure = f"building {SOURCE.name} with {compiler} failed: {e}"
            if _loaded is None:
                warnings.warn(f"qlower cpu: {_failure}; using the (slower) torch kernels", stacklevel=2)
        return _loaded


def unavailable_reason() -> str | None:
    """Why ``load()`` returns None (disabled, no compiler, or the build's error), or None when
    the native kernels are loaded."""
    if os.environ.get("QLOWER_CPU_NATIVE", "1") == "0":
        return "disabled by QLOWER_CPU_NATIVE=0"
    return None if load() is not None else _failure
