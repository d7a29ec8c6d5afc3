"""Arm Vela: TOSA 1.0 flatbuffer bytes -> Ethos-U command stream.

Vela 5.2's C++ core (``ethosu.regor``) compiles a TOSA flatbuffer from memory
in about a millisecond, so qlower calls it directly rather than through the
``vela`` command line and files, in worker processes of its own
(``vela_worker.py``, bounded by ``QLOWER_TOSA_WORKERS`` like the reference
model's): a segfault there is a ``CompileError`` naming the signal, and Vela's
C stdio never touches this process's file descriptors, whatever other threads
do. This module is the only place that talks to Vela; it guarantees:

* Only bytes carrying the TOSA file identifier reach ``regor.compile``:
  handing it bytes in the wrong format crashes Vela (segfault: a worker, not the caller), so
  the format is checked by magic bytes first and anything else is a
  ``CompileError``.
* Every failure surfaces as a ``VelaRejection`` (a ``CompileError``) carrying
  Vela's own message and, where Vela names them, the rejected operator types.
* IO descriptions are what Vela reports it reads and writes (element size,
  region, byte offset); Vela's raw output has no names or dtypes, so those come
  from the TOSA graph's block inputs/outputs, which Vela keeps in order.

Accelerator configurations (MACs, system config, memory mode) are validated by
Vela's own ``ArchitectureFeatures`` against its bundled ``vela.ini``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import io
import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from qlower.backends.derived import DerivedCache, digest
from qlower.backends.workers import WorkerDied, WorkerPool, close_at_exit
from qlower.errors import CompileError, ConfigError

TOSA_MAGIC = b"TOSA"    # flatbuffer file identifier, bytes 4..8
TFLITE_MAGIC = b"TFL3"

# Every accelerator configuration Vela 5.2 knows (architecture_features.Accelerator).
ACCELERATORS: tuple[str, ...] = (
    "ethos-u55-32", "ethos-u55-64", "ethos-u55-128", "ethos-u55-256",
    "ethos-u65-256", "ethos-u65-512",
    "ethos-u85-128", "ethos-u85-256", "ethos-u85-512", "ethos-u85-1024", "ethos-u85-2048",
)
# Vela's defaults when no system config / memory mode is given: its command line's "internal-default"
# (ArchitectureFeatures._set_default_sys_config / _set_default_mem_mode; tests/test_ethosu_vela.py checks)
DEFAULT_SYSTEM: dict[str, tuple[str, str]] = {
    "ethos-u55": ("Ethos_U55_High_End_Embedded", "Shared_Sram"),
    "ethos-u65": ("Ethos_U65_Client_Server", "Dedicated_Sram_384KB"),
    "ethos-u85": ("Ethos_U85_SYS_DRAM_Mid", "Dedicated_Sram_384KB"),
}

OPTIMISE_GOALS = ("Performance", "Size")   # Vela's --optimise choices

T = TypeVar("T")


def detect_format(buf: bytes) -> str | None:
    """``"TOSA"`` or ``"TFLITE"`` from the flatbuffer file identifier, None for anything else."""
    if len(buf) >= 8 and buf[4:8] == TOSA_MAGIC:
        return "TOSA"
    if len(buf) >= 8 and buf[4:8] == TFLITE_MAGIC:
        return "TFLITE"
    return None


_PRINTS_LOCK = threading.Lock()


def quietly(fn: Callable[[], T]) -> tuple[T | None, BaseException | None, str]:
    """Run ``fn`` (pure-Python Vela: its configuration parser prints warnings) with ``print`` captured;
    returns (result, exception, text). File descriptors are never touched: Vela's native core runs
    in its worker processes, which own theirs."""
    out = io.StringIO()
    result: T | None = None
    exc: BaseException | None = None
    with _PRINTS_LOCK, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - Vela raises its own CliOptionError and ValueError
            exc = e
    return result, exc, out.getvalue()


# -- accelerator configuration ----------------------------------------------------------------

@dataclass(frozen=True)
class VelaConfig:
    """One accelerator in one system: what ``regor.compile`` needs besides the model."""

    accelerator: str        # e.g. "ethos-u85-256"
    system_config: str      # vela.ini System_Config section
    memory_mode: str        # vela.ini Memory_Mode section
    arch: str               # regor's architecture name, e.g. "EthosU85"
    macs: int
    cores: int
    arena_cache_size: int
    core_clock: float       # Hz, from the system config
    ini_text: str

    def sysconfig(self) -> str:
        return (f"[architecture]\nmacs={self.macs}\ncores={self.cores}\n"
                f"[vela]\nsystem_config_name={self.system_config}\nmemory_mode_name={self.memory_mode}\n"
                + self.ini_text)

    def options(self, per_layer: bool = False, optimise: str = "Performance") -> str:
        """Compiler options as Vela's command line writes them (raw output, COP1 driver header).
        ``optimise`` is one of OPTIMISE_GOALS: it is written into Vela's options text."""
        if optimise not in OPTIMISE_GOALS or not isinstance(per_layer, bool):
            raise ConfigError(f"Ethos-U option optimise={optimise!r}, per_layer={per_layer!r}: expected optimise one "
                              f"of {', '.join(OPTIMISE_GOALS)} and per_layer true or false")
        return ("[compiler]\n" + ("enable_db=true\n" if per_layer else "")
                + "output_format=Raw\ncop_format=COP1\n"
                + f"[scheduler]\noptimize={optimise}\narena_size_limit={self.arena_cache_size}\n"
                + "cpu_tensor_alignment=16\ntensor_allocator=HillClimb\n[graph]\n")


@functools.cache
def vela_config(accelerator: str, system_config: str | None = None, memory_mode: str | None = None) -> VelaConfig:
    """Validate an accelerator / system config / memory mode triple against Vela's vela.ini."""
    if accelerator not in ACCELERATORS:
        raise CompileError(f"unknown Ethos-U accelerator {accelerator!r}; Vela knows {', '.join(ACCELERATORS)}")
    from ethosu.vela import architecture_features as af

    family = "-".join(accelerator.split("-")[:2])
    default_sys, default_mem = DEFAULT_SYSTEM[family]
    ini = os.path.join(af.CONFIG_FILES_PATH, "Arm", "vela.ini")
    with open(ini, encoding="utf-8") as f:
        ini_text = f.read()
    if system_config is not None:
        # Vela accepts any section: a U85 memory system given to a U55 would be estimated silently
        prefix = "Ethos_" + family.split("-")[1].upper() + "_"      # ethos-u55 -> Ethos_U55_
        ours = re.findall(r"^\[System_Config\.(" + prefix + r"\w+)\]", ini_text, re.MULTILINE)
        if system_config not in ours:
            raise ConfigError(f"Ethos-U option system_config={system_config!r} is not a system config of "
                              f"{accelerator}; its configs in {ini}: {', '.join(ours)}")
    arch, exc, log = quietly(lambda: af.ArchitectureFeatures(
        vela_config_files=[ini], accelerator_config=accelerator,
        system_config=system_config or default_sys, memory_mode=memory_mode or default_mem,
        max_blockdep=af.ArchitectureFeatures.MAX_BLOCKDEP, verbose_config=False, arena_cache_size=None))
    if exc is not None or arch is None:
        raise CompileError(f"Vela rejects the configuration {accelerator} / system config "
                           f"{system_config or default_sys} / memory mode {memory_mode or default_mem}: "
                           f"{exc or log.strip()}; see the sections of {ini}")
    regor_arch = "".join(p.capitalize() for p in family.split("-"))  # ethos-u85 -> EthosU85
    return VelaConfig(accelerator, arch.system_config, arch.memory_mode, regor_arch, int(arch.num_macs_per_cycle),
                      int(arch.ncores), int(arch.arena_cache_size), float(arch.core_clock), ini_text)


def memory_modes(accelerator: str) -> list[str]:
    """The memory modes of Vela's vela.ini that Vela accepts for ``accelerator`` with its default
    system config (ethos-u55 has no dedicated SRAM)."""
    modes = re.findall(r"^\[Memory_Mode\.(\w+)\]", vela_config(accelerator).ini_text, re.MULTILINE)
    usable = []
    for mode in modes:
        try:
            vela_config(accelerator, None, mode)
        except CompileError:
            continue
        usable.append(mode)
    return usable


# -- rejections ------------------------------------------------------------------------------

class VelaRejection(CompileError):
    """Vela refused a graph. ``ops`` holds (operator type, reasons) where Vela named them."""

    def __init__(self, accelerator: str, kind: str, ops: tuple[tuple[str, tuple[str, ...]], ...], detail: str):
        self.accelerator, self.kind, self.ops, self.detail = accelerator, kind, ops, detail
        super().__init__(f"Vela ({accelerator}): {self.summary()}")

    def summary(self) -> str:
        if self.kind == "validation" and self.ops:
            return "TOSA validation: " + "; ".join(f"{op}: {', '.join(r)}" for op, r in self.ops)
        return self.detail


def parse_rejection(accelerator: str, message: str) -> VelaRejection:
    """Vela's exception text as a VelaRejection (formats observed with Vela 5.2)."""
    text = message.strip()
    m = re.search(r"Non-passthrough operation \((\w+)\) could not run on NPU", text)
    if m:
        return VelaRejection(accelerator, "npu_support", ((m.group(1), ()),), m.group(0))
    if "Validation error:" in text:
        ops: list[tuple[str, list[str]]] = []
        for line in text.split("Validation error:", 1)[1].splitlines():
            if line.startswith(" - ") and ops:
                ops[-1][1].append(line[3:].strip())
            elif line.strip().endswith(":"):
                ops.append((line.strip()[:-1], []))
        return VelaRejection(accelerator, "validation", tuple((o, tuple(r)) for o, r in ops), text)
    if "TOSA FB Reader error" in text:
        return VelaRejection(accelerator, "reader", (), " ".join(text.split()))
    return VelaRejection(accelerator, "other", (), " ".join(text.split()))


# -- results ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class IOTensor:
    """One input or output as the NPU sees it: ``element_size`` bytes per element at
    ``offset`` in memory ``region`` (1 = the scratch arena for COP1 command streams)."""

    name: str
    dtype: str                  # TOSA dtype name of the graph tensor, e.g. "INT8"
    shape: tuple[int, ...]      # shape in the TOSA graph
    npu_shape: tuple[int, ...]  # Vela's (6-D padded) shape
    element_size: int
    size: int
    region: int
    offset: int

    def as_meta(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "element_size": self.element_size,
                "size": self.size, "region": self.region, "offset": self.offset}


@dataclass(frozen=True)
class VelaResult:
    config: VelaConfig
    command_stream: bytes       # driver header ("COP1", config, id) + NPU register command stream
    read_only: bytes            # encoded weights, biases/scales, LUTs (region 0)
    scratch_size: int           # arena (region 1), IO tensors included
    scratch_fast_size: int      # SRAM cache (region 2); 0 unless a Dedicated_Sram memory mode
    inputs: tuple[IOTensor, ...]
    outputs: tuple[IOTensor, ...]
    perf: dict[str, Any]
    per_layer: list[dict[str, Any]] | None
    seconds: float


def tosa_block_io(buf: bytes) -> tuple[list[tuple[str, str, tuple[int, ...]]], list[tuple[str, str, tuple[int, ...]]]]:
    """(name, dtype name, shape) of the main block's inputs and outputs, in order."""
    from tosa import TosaGraph

    names = _tosa_dtype_names()
    block = TosaGraph.TosaGraph.GetRootAs(buf, 0).Regions(0).Blocks(0)
    inputs = [block.Inputs(i) for i in range(block.InputsLength())]
    outputs = [block.Outputs(i) for i in range(block.OutputsLength())]
    wanted = set(inputs) | set(outputs)
    tensors = {}
    for i in range(block.TensorsLength()):   # each tensor read once, only the IO ones described
        t = block.Tensors(i)
        name = t.Name()
        if name in wanted and name not in tensors:
            tensors[name] = (names[t.Type()], tuple(int(d) for d in t.ShapeAsNumpy()))

    def describe(name: bytes) -> tuple[str, str, tuple[int, ...]]:
        return (name.decode(), *tensors[name])

    return [describe(n) for n in inputs], [describe(n) for n in outputs]


@functools.lru_cache(maxsize=1)
def _tosa_dtype_names() -> dict[int, str]:
    from tosa import DType

    return {v: k for k, v in vars(DType.DType).items() if k.isupper()}


class VelaDroppedIO(CompileError):
    """Vela's command stream has fewer inputs or outputs than the TOSA graph (it gave one no buffer)."""


def _io(raw: list[dict[str, Any]], described: list[tuple[str, str, tuple[int, ...]]], what: str) -> tuple[IOTensor, ...]:
    if len(raw) != len(described):
        raise VelaDroppedIO(f"Vela reports {len(raw)} {what}s, the TOSA graph has {len(described)}")
    return tuple(IOTensor(name, dtype, shape, tuple(int(d) for d in t["shape"]), int(t["element_size"]),
                          int(t["size"]), int(t["region"]), int(t["address"]))
                 for t, (name, dtype, shape) in zip(raw, described))


# Vela runs in worker processes: a crash is an error, and its C stdio never touches this process's fds
_VELA_POOL = close_at_exit(WorkerPool(Path(__file__).with_name("vela_worker.py")))

_TOTALS: collections.OrderedDict[tuple[bytes, VelaConfig], int | None] = collections.OrderedDict()
_TOTALS_LOCK = threading.Lock()


def total_cycles(buf: bytes, config: VelaConfig) -> int | None:
    """Vela's total cycle estimate of a TOSA graph (None when Vela refuses it), remembered by the
    graph's digest: cost models ask about the same small graphs again and again."""
    key = (hashlib.sha256(buf).digest(), config)
    with _TOTALS_LOCK:
        if key in _TOTALS:
            _TOTALS.move_to_end(key)
            return _TOTALS[key]
    try:
        total = int(compile_tosa(buf, config).perf["total_cycles"])
    except CompileError:
        total = None
    with _TOTALS_LOCK:
        _TOTALS[key] = total
        while len(_TOTALS) > 1024:
            _TOTALS.popitem(last=False)
    return total


def compile_tosa(buf: bytes, config: VelaConfig, per_layer: bool = False, optimise: str = "Performance") -> VelaResult:
    """Compile a TOSA 1.0 flatbuffer for ``config`` in a Vela worker process (``vela_worker.py``);
    raises VelaRejection when Vela refuses it, CompileError when Vela crashes on it."""
    buf = bytes(buf)
    fmt = detect_format(buf)
    if fmt != "TOSA":
        raise CompileError(f"not a TOSA flatbuffer (file identifier {buf[4:8]!r}, expected {TOSA_MAGIC!r}); "
                           "only TOSA graphs are handed to Vela")
    t0 = time.perf_counter()
    request = [b"compile", config.arch.encode(), buf, config.sysconfig().encode(),
               config.options(per_layer, optimise).encode()]
    try:
        answer = _VELA_POOL.call(request)
    except WorkerDied as e:
        raise CompileError(f"Vela crashed compiling a graph for {config.accelerator}: its process {e}; "
                           "the calling process is unaffected") from None
    seconds = time.perf_counter() - t0
    if answer[0] != b"ok":
        message, log = answer[1].decode(errors="replace"), answer[2].decode(errors="replace")
        raise parse_rejection(config.accelerator, message or log)
    meta = json.loads(answer[1])
    ins, outs = tosa_block_io(buf)
    perf = {**meta["perf"], "core_clock_hz": config.core_clock,
            "inference_seconds": meta["perf"]["total_cycles"] / config.core_clock}
    return VelaResult(config, answer[2], answer[3], meta["scratch"], meta["scratch_fast"],
                      _io(meta["inputs"], ins, "input"), _io(meta["outputs"], outs, "output"), perf,
                      meta["per_layer"], seconds)


# what lowering compiled, by the TOSA graph's digest and everything else Vela read: loading a
# program derives its command stream and weights again (backend.py check_loaded) and, in the
# process that compiled it or on a second load, finds them here (backends/derived.py)
COMPILED: DerivedCache[VelaResult] = DerivedCache(lambda r: len(r.command_stream) + len(r.read_only))


def compile_cached(buf: bytes, config: VelaConfig, per_layer: bool = False,
                   optimise: str = "Performance") -> VelaResult:
    """``compile_tosa``, remembered: Vela is deterministic (same TOSA and options, same bytes)."""
    buf = bytes(buf)
    return COMPILED.get((digest(buf), config, per_layer, optimise),
                        lambda: compile_tosa(buf, config, per_layer, optimise))
