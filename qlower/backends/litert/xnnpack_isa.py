"""Which x86 GEMM kernels LiteRT's XNNPACK runs in this process: AMX tiles or AVX-512 VNNI.

XNNPACK decides once per process, when its first delegate starts: on a CPU with AMX it asks Linux
for the tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM)``) and, if granted, runs every int8 GEMM and
convolution on 16x64 tiles (K in 64-byte blocks), else on 7x16 VNNI kernels. Tiles win on wide
layers (ResNet-18 about 1.8x faster) and lose on narrow ones, where N and K are padded to 64
(MobileNetV2 about 6% slower). Both compute the same integers and the same float32 requantization
(the tests run the programs both ways against the reference), so the choice changes speed only.

qlower makes it per program: lowering stores ``prefers_amx`` (a cost model of the program's GEMM
shapes) in the payload, and the first XNNPACK interpreter qlower builds in a process applies it; the
environment variable ``QLOWER_XNNPACK_AMX`` (``1`` or ``0``) overrides every program's preference.
To withhold tiles, that interpreter is built on a thread of its own whose requests for them a seccomp
filter refuses: only XNNPACK's request is refused, the rest of the process (the cpu backend's AMX
kernels included) keeps the tiles. A later program that prefers the other kernels runs on the ones
XNNPACK started with (the same numbers), with one warning per process.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import platform
import threading
import warnings
from collections.abc import Callable
from typing import TypeVar

import qlower.native_build as native_build
from qlower.errors import ConfigError
from qlower.ir import DType, Graph

ENV = "QLOWER_XNNPACK_AMX"
# how many padded MACs a tile computes in the time a VNNI kernel computes one: every zoo model (32 rows, sizes
# 32-224) falls on its measured side at 1 thread for any value in [1.36, 1.93] (resnet18 at 64 wins on AMX,
# convnext_block loses); 1.6 is that interval's middle (benchmarks/xnnpack_isa.py)
AMX_SPEEDUP = 1.6
AMX_TILE = (16, 64, 64)    # XNNPACK's qs8_qc8w AMX kernel: 16 rows, 64 columns, K in 64-byte blocks
VNNI_TILE = (7, 16, 8)     # its AVX-512 VNNI kernel: 7 rows, 16 columns, K in steps of 8

T = TypeVar("T")


def gemm_shapes(graph: Graph) -> list[tuple[int, int, int]]:
    """(M, N, K) of each int8 GEMM XNNPACK runs on its GEMM kernels: convolutions that are not depthwise
    (a grouped one is one GEMM per group) and fully connected layers."""
    shapes = []
    for op in graph.ops:
        if op.kind not in ("conv2d", "fully_connected") or op.operands[0].dtype != DType.INT8:
            continue
        w, out = op.operands[1].type, op.results[0].type
        if op.kind == "fully_connected":
            shapes.append((math.prod(out.shape[:-1]), w.shape[0], w.shape[1]))
            continue
        groups = op.attrs["groups"]
        o, kh, kw, ci = w.shape
        if groups > 1 and ci == 1 and o == groups:   # depthwise: XNNPACK's dwconv kernels, not a GEMM
            continue
        n, oh, ow, _ = out.shape
        shapes.extend([(n * oh * ow, o // groups, kh * kw * ci)] * groups)
    return shapes


def _padded(shapes: list[tuple[int, int, int]], tile: tuple[int, int, int]) -> int:
    return sum(math.prod(-(-d // t) * t for d, t in zip(s, tile)) for s in shapes)


def prefers_amx(graph: Graph) -> bool:
    """Whether XNNPACK's AMX kernels should run this graph's GEMMs faster than its VNNI kernels: the MACs
    each kernel computes with its tile padding, AMX's counted at 1/AMX_SPEEDUP. True when there is no GEMM
    (XNNPACK's own default)."""
    shapes = gemm_shapes(graph)
    if not shapes:
        return True
    return _padded(shapes, AMX_TILE) / AMX_SPEEDUP <= _padded(shapes, VNNI_TILE)


def _wanted(preference: bool) -> tuple[bool, str]:
    forced = os.environ.get(ENV)
    if forced is None or forced == "":
        return preference, "the program's cost model"
    if forced not in ("0", "1"):
        raise ConfigError(f"{ENV}={forced!r}: expected 1 (XNNPACK may use AMX tiles) or 0 (it may not)")
    return forced == "1", f"{ENV}={forced}"


@functools.cache
def cpu_has_amx() -> bool:
    """Whether this CPU has AMX int8 tiles (Linux x86-64; False elsewhere)."""
    return platform.system() == "Linux" and platform.machine() == "x86_64" and "amx_int8" in native_build.cpu_flags()


# --- the filter: refuse arch_prctl(ARCH_REQ_XCOMP_PERM, ...) on the calling thread only --------------------
_SYS_ARCH_PRCTL, _ARCH_GET_XCOMP_PERM, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1022, 0x1023, 18
_AUDIT_ARCH_X86_64 = 0xC000003E
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_EPERM = 0x7FFF0000, 0x00050000 | 1
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
_PROGRAM = (                        # seccomp_data: nr at 0, arch at 4, args[0] (low word) at 16
    (_LD_W_ABS, 0, 0, 4), (_JEQ_K, 0, 5, _AUDIT_ARCH_X86_64),
    (_LD_W_ABS, 0, 0, 0), (_JEQ_K, 0, 3, _SYS_ARCH_PRCTL),
    (_LD_W_ABS, 0, 0, 16), (_JEQ_K, 0, 1, _ARCH_REQ_XCOMP_PERM),
    (_RET_K, 0, 0, _RET_EPERM),
    (_RET_K, 0, 0, _RET_ALLOW),
)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _refuse_tiles_on_this_thread() -> bool:
    """Install the filter on the calling thread (and the threads it starts); False when Linux won't."""
    libc = ctypes.CDLL(None, use_errno=True)
    program = (_SockFilter * len(_PROGRAM))(*(_SockFilter(*f) for f in _PROGRAM))
    fprog = _SockFprog(len(_PROGRAM), program)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return False
    return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0   # the filter answers


def tiles_permitted() -> bool:
    """Whether Linux has given this process AMX tile state (ARCH_GET_XCOMP_PERM; False where it can't say)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    mask = ctypes.c_uint64(0)
    if ctypes.CDLL(None, use_errno=True).syscall(_SYS_ARCH_PRCTL, _ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:
        return False
    return bool(mask.value >> _XFEATURE_XTILEDATA & 1)


def _on_thread_without_tiles(make: Callable[[], T]) -> tuple[T, bool]:
    box: dict[str, object] = {}

    def body() -> None:
        try:
            box["refused"] = _refuse_tiles_on_this_thread()
            box["value"] = make()
        except BaseException as e:   # handed to the caller's thread
            box["error"] = e
    t = threading.Thread(target=body, name="qlower-xnnpack-start")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]   # type: ignore[misc]
    return box["value"], bool(box["refused"])   # type: ignore[return-value]


class _Started:
    """What XNNPACK started with in this process (set once, by the first XNNPACK interpreter qlower builds)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = False
        self.tiles: bool | None = None      # AMX kernels in use (None: not started by qlower yet)
        self.reason = ""
        self.warned = False


_started = _Started()


def start(make: Callable[[], T], prefers: bool) -> T:
    """``make()`` (building an XNNPACK interpreter); the first call in the process starts XNNPACK with or
    without AMX as ``prefers`` (or ``QLOWER_XNNPACK_AMX``) asks. Later calls just build; one whose
    preference XNNPACK's start doesn't match warns once (its numbers are the same)."""
    wanted, why = _wanted(prefers)
    if not _started.done:
        with _started.lock:
            if not _started.done:
                has = cpu_has_amx()
                if has and not wanted:
                    value, refused = _on_thread_without_tiles(make)
                    tiles = not refused
                    reason = why + ("" if refused else " (Linux refused the seccomp filter: tiles stay)")
                else:   # XNNPACK asks for the tiles itself; Linux may still refuse them
                    value = make()
                    tiles, reason = has and tiles_permitted(), why if has else "this CPU has no AMX"
                _started.tiles, _started.reason, _started.done = tiles, reason, True
                return value
    if cpu_has_amx() and wanted != _started.tiles and not _started.warned:
        _started.warned = True
        mine, theirs = ("AMX tiles", "AVX-512 VNNI kernels") if wanted else ("AVX-512 VNNI kernels", "AMX tiles")
        warnings.warn(f"XNNPACK started in this process on its {theirs} ({_started.reason}); this program's cost "
                      f"model prefers its {mine}, but it runs on the {theirs}: the same numbers, maybe slower. Run "
                      f"it in a process of its own, or set {ENV}.", RuntimeWarning, stacklevel=4)
    return make()


def state() -> dict:
    """What XNNPACK started with in this process: ``started``, ``amx_tiles`` (None before), ``why``."""
    return {"started": _started.done, "amx_tiles": _started.tiles, "why": _started.reason or None}
