"""CPU backend latency: MobileNetV2- and ResNet-18-shaped int8 IR graphs beside torch eager fp32 and LiteRT.

The int8 graphs are built directly in the IR with random int8 weights
(benchmarks/models_ir.py), 224x224x3, batch 1, and compiled with
``qlower.backends.cpu.prepare(graph, threads=2)``. The fp32 baselines are the zoo's
torch models (``qlower.zoo.get(name)[0]``, NCHW, eager, ``torch.inference_mode``)
with the same thread count. After a warm-up, int8 and fp32 runs alternate (so both
see the same machine load) and the median of ``--runs`` is reported. The int8 output
is checked once against the reference interpreter (bit-exact). Targets on the
2-core machine: MobileNetV2 <= 16 ms, ResNet-18 <= 60 ms.

Zoo-model rows (``--no-litert`` skips them), at each of ``--zoo-threads`` (1 and 2): the zoo models
themselves at 224, batch 1, in four runtimes: ExecuTorch 1.5.1's XNNPACK (the same model class and
weights, quantized by ExecuTorch's XNNPACK quantizer and lowered by its partitioner, run by its Python
runtime in a venv of its own made on demand, see executorch_column.py; ``--no-executorch`` skips it, and
it is skipped with the reason when it can't be built), and qlower's quantization of the model compiled
for ``litert`` once per kernel family (``xnnpack``: the default delegates, ``builtin``: LiteRT's optimized
builtin kernels) and for qlower's ``cpu`` backend (the xnnpack program's quantized graph).

They are timed in lock-step over the same wall-clock window: turns of a short idle gap (a thread pool that
spins after its run parks), one untimed call and ``BLOCK`` timed calls per runtime, the runtimes' order
reversed every turn, until each has ``--runs`` calls. Both processes (ExecuTorch's server and this one, every
thread) are pinned to the same cores (``--cores``, default the first N allowed, N the thread count). Each call
gives its wall time and its CPU time (the process's, every thread's, which a loaded machine inflates far less);
a row gives the medians and the interquartile range. Ratios are to ExecuTorch's median of the same run, and
``paired`` is the median (and IQR) over turns of the runtime's block median over ExecuTorch's in the same turn.
Each section records the load: the 1-minute load average before and after, and the CPU time other processes
took on the machine during it (from /proc/stat less this process and the server), in cores. Before timing, the
outputs are compared: ExecuTorch's and every qlower row's against the float model's (relative L2 error) and
ExecuTorch's against qlower's xnnpack program. ``--runtimes`` picks the rows (e.g. ``"executorch xnnpack"
"qlower litert xnnpack"``). Each qlower output is compared once with the reference interpreter on the
program's source: max difference in output steps and share of exact elements. Each model's zoo rows run in a process of their own:
XNNPACK picks its AMX or AVX-512 VNNI GEMM kernels once per process, from the first program's cost model
(qlower/backends/litert/xnnpack_isa.py), as a deployment running that model does; ``--xnnpack-amx 0|1``
forces the choice (0: the VNNI kernels ExecuTorch's build runs, it has no AMX kernels), and the table and
JSON say which kernels ran.

    python benchmarks/latency.py [--runs 50] [--warmup 10] [--threads 2] [--no-check] [--no-ir]
                                 [--no-litert] [--zoo-threads 1 2] [--no-executorch] [--runtimes NAME ...]
                                 [--cores 0 1] [--xnnpack-amx auto|1|0]

Prints a table and writes benchmarks/results/latency.json (per-run times, medians,
load average, machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from models_ir import build_mobilenet_v2, build_resnet18, macs  # noqa: E402

from qlower import zoo  # noqa: E402
from qlower.backends.cpu import native, prepare  # noqa: E402
from qlower.backends.cpu.gemm import int_mm_exact  # noqa: E402
from qlower.reference import run_graph  # noqa: E402

MODELS = {  # name: (IR builder, zoo name, target ms)
    "mobilenet_v2": (build_mobilenet_v2, "mobilenet_v2", 16.0),
    "resnet18": (build_resnet18, "resnet18", 60.0),
}


# zoo rows, one turn per runtime: an idle gap (seconds), SETTLE untimed calls, BLOCK timed ones
GAP, SETTLE, BLOCK = 0.005, 1, 2


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _time_cpu(fn) -> tuple[float, float]:
    """Wall and CPU seconds of ``fn()`` (the process's CPU time, every thread's: on a loaded machine the wall
    time waits for cores, the CPU time much less)."""
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def bench(name: str, runs: int, warmup: int, threads: int, check: bool) -> dict:
    build, zoo_name, target = MODELS[name]
    graph = build()
    t0 = time.perf_counter()
    plan = prepare(graph, threads=threads)
    prepare_s = time.perf_counter() - t0
    image = np.random.default_rng(1).integers(-128, 128, size=graph.inputs[0].shape, dtype=np.int8)

    model = zoo.get(zoo_name)[0].eval()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for _ in range(warmup):
                plan.run([image])
                model(x)
            int8_s, fp32_s = [], []
            for _ in range(runs):
                int8_s.append(_time(lambda: plan.run([image])))
                fp32_s.append(_time(lambda: model(x)))
    finally:
        torch.set_num_threads(previous)
    exact = None
    if check:
        exact = bool(np.array_equal(plan.run([image])[0], run_graph(graph, [image])[0]))
    med8, med32 = statistics.median(int8_s) * 1e3, statistics.median(fp32_s) * 1e3
    return {
        "model": name, "macs": macs(graph), "ops": len(graph.ops), "steps": plan.num_steps,
        "fused": len(plan.fused), "prepare_s": round(prepare_s, 3),
        "int8_ms": {"median": round(med8, 3), "p10": round(np.percentile(int8_s, 10) * 1e3, 3),
                    "p90": round(np.percentile(int8_s, 90) * 1e3, 3), "runs": [round(t * 1e3, 3) for t in int8_s]},
        "fp32_eager_ms": {"median": round(med32, 3), "p10": round(np.percentile(fp32_s, 10) * 1e3, 3),
                          "p90": round(np.percentile(fp32_s, 90) * 1e3, 3), "runs": [round(t * 1e3, 3) for t in fp32_s]},
        "target_ms": target, "meets_target": med8 <= target, "speedup_vs_fp32": round(med32 / med8, 2),
        "bit_exact_vs_reference": exact,
    }


def _q(values, q: float) -> float:
    return round(float(np.percentile(values, q)) * 1e3, 3)


def _stats(runs: list[tuple[float, float]]) -> dict:
    times, cpu = [w for w, _ in runs], [c for _, c in runs]
    return {"median_ms": round(statistics.median(times) * 1e3, 3), "p25_ms": _q(times, 25), "p75_ms": _q(times, 75),
            "p10_ms": _q(times, 10), "p90_ms": _q(times, 90), "cpu_median_ms": round(statistics.median(cpu) * 1e3, 3),
            "cpu_p25_ms": _q(cpu, 25), "cpu_p75_ms": _q(cpu, 75)}


def _exactness(p, x: np.ndarray) -> dict:
    """The program's output against the reference interpreter on its source: max steps, exact share."""
    want, got = run_graph(p.source, [x])[0], p.run(x)[0]
    step = float(p.source.ops[-1].operands[0].type.quant.scale[0]) if p.source.ops[-1].kind == "dequantize" else 1
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64)) / step
    return {"max_steps_vs_reference": round(float(diff.max()), 3), "exact_share": round(float(np.mean(diff == 0)), 4)}


def _rel_error(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    return round(float(np.linalg.norm(got - want) / np.linalg.norm(want)), 5)


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of process ``pid`` (0: this one) onto ``cores``; threads made later inherit it."""
    for tid in os.listdir(f"/proc/{pid or os.getpid()}/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except (ProcessLookupError, PermissionError):   # a thread that just ended
            pass


def _busy_ticks() -> float:
    """Every CPU's busy time so far (clock ticks), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]   # less idle and iowait


def _process_ticks(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])   # utime, stime


class _Load:
    """The machine's load over a timed section: load average before and after, and the CPU time every process
    but ``pids`` took meanwhile, in cores."""

    def __init__(self, pids: list[int]):
        self.pids, self.load = pids, os.getloadavg()[0]
        self.t, self.busy, self.ours = time.perf_counter(), _busy_ticks(), sum(map(_process_ticks, pids))

    def done(self) -> dict:
        seconds = time.perf_counter() - self.t
        others = (_busy_ticks() - self.busy) - (sum(map(_process_ticks, self.pids)) - self.ours)
        return {"load_average_1min_before": round(self.load, 2), "load_average_1min_after": round(os.getloadavg()[0], 2),
                "other_processes_cores": round(max(others, 0) / os.sysconf("SC_CLK_TCK") / seconds, 2),
                "seconds": round(seconds, 1)}


def _lockstep(runners: dict, runs: int) -> tuple[dict[str, list[tuple[float, float]]], list[dict[str, float]]]:
    """Every runner's ``runs`` timed calls, taken in turns (see the module docstring); also each turn's block
    medians (wall), for the paired ratios."""
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in runners}
    turns: list[dict[str, float]] = []
    order = list(runners)
    while min(len(t) for t in times.values()) < runs:
        turn = {}
        for k in order:
            time.sleep(GAP)
            runners[k](SETTLE)
            block = runners[k](min(BLOCK, max(runs - len(times[k]), 1)))
            times[k].extend(block)
            turn[k] = statistics.median(w for w, _ in block)
        turns.append(turn)
        order.reverse()
    return times, turns


def _paired(turns: list[dict[str, float]], key: str, ref: str) -> dict:
    ratios = [t[key] / t[ref] for t in turns]
    return {"median": round(statistics.median(ratios), 3), "p25": round(float(np.percentile(ratios, 25)), 3),
            "p75": round(float(np.percentile(ratios, 75)), 3), "turns": len(ratios)}


def executorch_runtime(name: str, venv: Path | None):
    """ExecuTorch's XNNPACK runtime of the zoo model (a Server), or the reason it can't be had."""
    if venv is None:
        return "skipped (--no-executorch)"
    import executorch_column as et
    model, example, _, calibration = zoo.get(MODELS[name][1])
    try:
        python = et.venv_python(venv)
        return et.Server(python, *et.export_pte(python, model.eval(), calibration, example))
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return f"unavailable: {e}"


RUNTIMES = ("executorch xnnpack", "qlower litert xnnpack", "qlower cpu", "qlower litert builtin")


def bench_litert(name: str, runs: int, warmup: int, thread_counts: list[int], et_venv: Path | None,
                 wanted: tuple[str, ...] = RUNTIMES, cores: list[int] | None = None) -> dict:
    """The zoo model quantized at 224: ExecuTorch's XNNPACK, LiteRT (xnnpack, builtin) and qlower's cpu backend
    (those of ``wanted``), timed in lock-step on the same cores, at each thread count."""
    import qlower
    from qlower.api import lower_graph

    _, zoo_name, _ = MODELS[name]
    model, example, cfg, calibration = zoo.get(zoo_name)
    base = qlower.compile(model, example, target="litert", quant=cfg, calibration=calibration, progress=False,
                          backend_options={"kernels": "xnnpack"})
    canonical = base.canonical_graph
    x = example[0].numpy()
    with torch.inference_mode():
        want = model.eval()(*example).numpy()
    et = executorch_runtime(name, et_venv if "executorch xnnpack" in wanted else None)
    result = {"model": name, "size": 224, "executorch": None if isinstance(et, str) else "1.5.1 xnnpack",
              "executorch_note": et if isinstance(et, str) else None, "threads": {}}
    allowed = sorted(os.sched_getaffinity(0))
    try:
        for threads in thread_counts:
            runners: dict[str, object] = {}
            progs = {f"qlower litert {k}": lower_graph(canonical, "litert", backend_options={"kernels": k,
                                                                                            "threads": threads})
                     for k in ("xnnpack", "builtin") if f"qlower litert {k}" in wanted}
            # the cpu target's own program (its own roundings): the xnnpack program's graph carries XNNPACK's
            # float32 requantization and add forms, which the cpu backend runs on its slow generic kernels
            if "qlower cpu" in wanted:
                progs["qlower cpu"] = lower_graph(canonical, "cpu", threads=threads)
            outputs = {k: p.run(x)[0] for k, p in progs.items()}
            if not isinstance(et, str):
                et.set_threads(threads)
                runners["executorch xnnpack"] = et.run
                outputs["executorch xnnpack"] = et.output()
            for k, p in progs.items():
                runners[k] = lambda n, p=p: [_time_cpu(lambda: p.run(x)) for _ in range(n)]
            runners = {k: runners[k] for k in RUNTIMES if k in runners}
            for run in runners.values():
                run(warmup)   # every thread pool exists now: pin them all
            use = set(cores or allowed[:threads])
            pids = [0] + ([et.proc.pid] if not isinstance(et, str) else [])
            for pid in pids:
                pin(pid, use)
            load = _Load([pid or os.getpid() for pid in pids])
            times, turns = _lockstep(runners, runs)
            section = {"cores": sorted(use), **load.done()}
            for pid in pids:
                pin(pid, set(allowed))
            rows = {k: _stats(t) for k, t in times.items()}
            for k, y in outputs.items():
                rows[k]["rel_error_vs_float"] = _rel_error(y, want)
            if "executorch xnnpack" in outputs and "qlower litert xnnpack" in outputs:
                rows["executorch xnnpack"]["rel_error_vs_qlower_xnnpack"] = _rel_error(
                    outputs["executorch xnnpack"], outputs["qlower litert xnnpack"])
            for k, p in progs.items():
                rows[k].update(_exactness(p, x))
            ref = rows.get("executorch xnnpack")
            for k, row in rows.items():
                row["vs_executorch"] = round(row["median_ms"] / ref["median_ms"], 3) if ref else None
                row["paired_vs_executorch"] = _paired(turns, k, "executorch xnnpack") if ref else None
            result["threads"][str(threads)] = {"load": section, **rows}
    finally:
        if not isinstance(et, str):
            et.close()
    return result


_small_stack = None   # deny_amx's signal stack, kept alive for the process


def amx_permitted() -> bool | None:
    """Whether this process may use AMX tiles (Linux x86-64; None elsewhere)."""
    from qlower.backends.litert import xnnpack_isa

    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None
    return xnnpack_isa.tiles_permitted()


def deny_amx() -> bool:
    """A diagnosis (benchmarks/xnnpack_isa.py): make this process's later requests for AMX fail (Linux refuses AMX to a
    process with a thread whose signal stack is too small for AMX state, so one is installed on this thread),
    so XNNPACK, which asks for AMX when it starts, runs its AVX-512 VNNI kernels as ExecuTorch's build does.
    False when AMX was already granted (then it stays)."""
    global _small_stack
    import ctypes

    class StackT(ctypes.Structure):
        _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]

    libc = ctypes.CDLL(None, use_errno=True)
    _small_stack = ctypes.create_string_buffer(4096)
    stack = StackT(ctypes.cast(_small_stack, ctypes.c_void_p), 0, len(_small_stack))
    if libc.sigaltstack(ctypes.byref(stack), None) != 0:
        return False
    from qlower.backends.litert.xnnpack_isa import _ARCH_REQ_XCOMP_PERM, _SYS_ARCH_PRCTL, _XFEATURE_XTILEDATA
    return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0


def bench_litert_isolated(name: str, *args, xnnpack_amx: str = "auto") -> dict:
    """``bench_litert`` in a process of its own: XNNPACK picks AMX or VNNI kernels once per process, from the
    first program it runs (qlower/backends/litert/xnnpack_isa.py), so each model gets its own choice, as a
    deployment running one model does. ``xnnpack_amx``: "auto" (the program's cost model), "1" or "0"."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    env = os.environ.copy()
    if xnnpack_amx == "auto":
        os.environ.pop("QLOWER_XNNPACK_AMX", None)
    else:
        os.environ["QLOWER_XNNPACK_AMX"] = xnnpack_amx
    try:   # the child reads the variable when it starts XNNPACK
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(_bench_litert_recording_isa, name, *args).result()
    finally:
        os.environ.clear()
        os.environ.update(env)


def _bench_litert_recording_isa(name: str, *args) -> dict:
    from qlower.backends.litert import xnnpack_isa

    result = bench_litert(name, *args)
    result["xnnpack_isa"] = xnnpack_isa.state()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--no-check", dest="check", action="store_false", help="skip the reference comparison")
    parser.add_argument("--no-litert", dest="litert", action="store_false",
                        help="skip the zoo-model rows (ExecuTorch, LiteRT, cpu)")
    parser.add_argument("--zoo-threads", type=int, nargs="+", default=[1, 2],
                        help="thread counts of the zoo-model rows (default 1 2)")
    parser.add_argument("--executorch-venv", type=Path, default=Path(__file__).parent / "results" / "executorch-venv",
                        help="where ExecuTorch's venv is (made on demand)")
    parser.add_argument("--no-executorch", dest="executorch", action="store_false",
                        help="skip the ExecuTorch XNNPACK column")
    parser.add_argument("--no-ir", dest="ir", action="store_false", help="skip the IR-graph rows")
    parser.add_argument("--runtimes", nargs="+", default=list(RUNTIMES), choices=list(RUNTIMES), metavar="RUNTIME",
                        help=f"the zoo-model rows to time (default all: {', '.join(map(repr, RUNTIMES))})")
    parser.add_argument("--cores", type=int, nargs="+", default=None,
                        help="the cores every zoo-row runtime is pinned to (default: the first N this process may use, "
                             "N the thread count)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "latency.json")
    parser.add_argument("--xnnpack-amx", choices=("auto", "1", "0"), default="auto",
                        help="XNNPACK's kernels in each model's process: auto (the program's cost model, qlower's "
                             "default), 1 (AMX tiles where the CPU has them) or 0 (AVX-512 VNNI, as ExecuTorch's "
                             "build, which has no AMX kernels); sets QLOWER_XNNPACK_AMX")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    rows = [bench(m, args.runs, args.warmup, args.threads, args.check) for m in args.models] if args.ir else []
    et_venv = args.executorch_venv if args.executorch else None
    litert = ([bench_litert_isolated(m, args.runs, args.warmup, args.zoo_threads, et_venv, tuple(args.runtimes),
                                     args.cores, xnnpack_amx=args.xnnpack_amx)
               for m in args.models]
              if args.litert else [])
    result = {
        "benchmark": "latency", "threads": args.threads, "runs": args.runs, "warmup": args.warmup,
        "models": rows, "zoo_models": litert,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "amx_permitted": amx_permitted(), "xnnpack_amx": args.xnnpack_amx,
                    "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(libgomp's default)"),
                    "native_kernels": native.load() is not None, "int8_gemm": int_mm_exact(),
                    "load_average_1min_before": round(load_before, 2),
                    "load_average_1min_after": round(os.getloadavg()[0], 2)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    _print_table(result)
    print(f"written to {args.out}")


def _print_table(r: dict) -> None:
    header = ("model", "MACs", "int8 cpu (ms)", "p10-p90", "target", "fp32 eager (ms)", "speedup", "exact")
    rows = [(m["model"], f"{m['macs'] / 1e6:.0f} M", f"{m['int8_ms']['median']:.2f}",
             f"{m['int8_ms']['p10']:.1f}-{m['int8_ms']['p90']:.1f}",
             f"<= {m['target_ms']:.0f} {'met' if m['meets_target'] else 'MISSED'}",
             f"{m['fp32_eager_ms']['median']:.2f}", f"{m['speedup_vs_fp32']:.2f}x",
             {True: "yes", False: "NO", None: "-"}[m["bit_exact_vs_reference"]]) for m in r["models"]]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for line in (header, *rows) if rows else ():
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)))
    if r["zoo_models"]:
        print(f"\nzoo models (224x224, batch 1), same run, lock-step turns of {SETTLE}+{BLOCK} calls, pinned to the "
              "same cores; ratio to ExecuTorch's XNNPACK (medians; paired: median over turns):")
        print(f"{'model':14s} {'thr':>3s} {'runtime':22s} {'median ms':>10s} {'IQR':>14s} {'cpu ms':>7s} "
              f"{'vs ET':>7s} {'paired':>7s} {'max steps':>10s} {'exact':>8s} {'err/float':>9s}")
        for m in r["zoo_models"]:
            if m["executorch_note"]:
                print(f"{m['model']}: ExecuTorch XNNPACK column {m['executorch_note']}")
            isa = m.get("xnnpack_isa") or {}
            if isa.get("started"):
                print(f"{m['model']}: XNNPACK {'with' if isa['amx_tiles'] else 'without'} AMX tiles ({isa['why']})")
            for threads, rows in m["threads"].items():
                for k, row in rows.items():
                    if k == "load":
                        continue
                    ratio = f"{row['vs_executorch']:.2f}x" if row["vs_executorch"] else "-"
                    paired = f"{row['paired_vs_executorch']['median']:.2f}x" if row["paired_vs_executorch"] else "-"
                    steps = f"{row['max_steps_vs_reference']:10.3f}" if "exact_share" in row else f"{'-':>10s}"
                    exact = f"{100 * row['exact_share']:7.2f}%" if "exact_share" in row else f"{'-':>8s}"
                    print(f"{m['model']:14s} {threads:>3s} {k:22s} {row['median_ms']:10.2f} "
                          f"{row['p25_ms']:6.2f}-{row['p75_ms']:<7.2f} {row['cpu_median_ms']:7.2f} {ratio:>7s} "
                          f"{paired:>7s} {steps} {exact} {row['rel_error_vs_float']:9.4f}")
                ld = rows["load"]
                print(f"{'':14s} {threads:>3s} load: cores {ld['cores']}, load average {ld['load_average_1min_before']}"
                      f" -> {ld['load_average_1min_after']}, other processes {ld['other_processes_cores']} cores "
                      f"over {ld['seconds']} s")
    mc = r["machine"]
    print(f"IR rows: threads {r['threads']}; median of {r['runs']} runs after {r['warmup']} warm-up; "
          f"load average {mc['load_average_1min_before']} -> {mc['load_average_1min_after']} on {mc['cpus']} CPUs; "
          f"AMX permitted: {mc['amx_permitted']}; --xnnpack-amx {mc.get('xnnpack_amx', 'auto')}; "
          f"OMP_WAIT_POLICY: {mc.get('omp_wait_policy', '?')}")


if __name__ == "__main__":
    main()
