"""XNNPACK's AMX tiles against its AVX-512 VNNI kernels on every zoo model: data for the per-program choice.

LiteRT's XNNPACK decides once per process which int8 GEMM kernels it runs: AMX (qs8_qc8w 16x64c4: M in 16 rows,
N in 64 columns, K padded to 64) when Linux grants the tile state it asks for at start, else AVX-512 VNNI
(7x16c8). Each zoo model that compiles for ``litert`` with ``kernels="xnnpack"`` (at its own example input)
is timed in two child processes at once: one where AMX is refused before XNNPACK starts (``latency.deny_amx``)
and one where it is granted. Both set ``QLOWER_XNNPACK_AMX=1``, so the refusal is the only thing that differs
(not qlower's own per-program choice); each child reports whether the process holds AMX after its runs.

The parent compiles each model once, saves its programs (one per thread count) and input, and drives the two
children in turns: an idle gap, one untimed call and a block of timed calls per child, the order reversed
every turn, both pinned to the same cores (the first N allowed, N the thread count), until each has
``--runs`` calls (blocks are longer for fast models). A row gives each child's median, their ratio
``VNNI / AMX`` (above 1: AMX is faster) and the median over turns of the paired block ratio with its IQR.
Each child saves the outputs to .npy; the parent checks them bit-identical (AMX against VNNI, and across thread
counts). The load is recorded per row (load average before/after, other processes' CPU in cores).

Features per program (its ``source`` graph: what the partitions compute), over int8 GEMMs XNNPACK runs on its
GEMM kernels (conv2d that is not depthwise, a grouped one as one GEMM per group, and fully_connected):
    amx_eff  = sum(M*N*K) / sum(ceil(M/16)*16 * ceil(N/64)*64 * ceil(K/64)*64)
    vnni_eff = sum(M*N*K) / sum(ceil(M/7)*7 * ceil(N/16)*16 * ceil(K/8)*8)
the cost model's rule (prefer AMX when ``amx_eff * R > vnni_eff``) at ``--r`` (2.0), the MAC-weighted mean N
and K, the share of MACs in depthwise convolutions and in per-tensor matmuls. Then R is fitted: the interval of
R that puts every model on its measured side (ties, whose paired IQR holds 1, left out), and its margin; and the
other features are tried as one-threshold rules on the same models.

    python benchmarks/xnnpack_isa.py [--models NAME ...] [--threads 1 2] [--runs 30] [--warmup 5] [--r 2.0]
                                     [--extra mobilenet_v2@112 ...] [--gemms MxNxK ...]
                                     [--convs SIDExCINxCOUTxKERNEL ...]

Prints a table and writes benchmarks/results/xnnpack_isa.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from executorch_column import JsonLinesChild  # noqa: E402
from latency import GAP, _Load, amx_permitted, deny_amx, pin  # noqa: E402

from qlower.backends.litert.xnnpack_isa import AMX_SPEEDUP, AMX_TILE, VNNI_TILE  # noqa: E402

MODES = ("amx", "vnni")      # the child where AMX is granted, the one where it is refused
BLOCK_SECONDS = 0.01         # a turn's timed block lasts about this long (at least 3 calls)
NEAR = 0.5                  # a threshold's near interval: cuts at most this much mean regret (%) above the best
MIN_TURNS = 12              # turns at least, however many calls that makes


# --- features ---------------------------------------------------------------------------------------------------
def gemm_features(graph) -> dict:
    """The GEMM-shape features of a graph (see the module docstring); its GEMMs are those qlower's own cost
    model counts (``xnnpack_isa.gemm_shapes``)."""
    from qlower.backends.litert.xnnpack_isa import gemm_shapes
    from qlower.ir import DType

    gemms, dw_macs, matmul_macs = gemm_shapes(graph), 0, 0
    for op in graph.ops:
        out = op.results[0].type if op.results else None
        if op.kind == "matmul":
            matmul_macs += math.prod(out.shape) * op.operands[0].type.shape[-1]
        elif (op.kind == "conv2d" and op.operands[0].dtype == DType.INT8 and op.attrs["groups"] > 1
              and op.operands[1].type.shape[-1] == 1):
            o, kh, kw, _ = op.operands[1].type.shape   # depthwise (one input channel a group): dwconv kernels
            if o == op.attrs["groups"]:
                dw_macs += math.prod(out.shape) * kh * kw
    macs = sum(m * n * k for m, n, k in gemms)

    def padded(tile):
        return sum(math.prod(-(-d // t) * t for d, t in zip(s, tile)) for s in gemms)

    total = macs + dw_macs + matmul_macs
    counts: dict[tuple[int, int, int], int] = {}
    for g in gemms:
        counts[g] = counts.get(g, 0) + 1
    return {
        "shapes": [[*g, c] for g, c in counts.items()],   # (M, N, K, how many)
        "gemms": len(gemms), "gemm_macs": macs, "depthwise_macs": dw_macs, "matmul_macs": matmul_macs,
        "amx_eff": round(macs / padded(AMX_TILE), 4) if gemms else None,
        "vnni_eff": round(macs / padded(VNNI_TILE), 4) if gemms else None,
        "mean_n": round(sum(m * n * k * n for m, n, k in gemms) / macs, 1) if gemms else None,
        "mean_k": round(sum(m * n * k * k for m, n, k in gemms) / macs, 1) if gemms else None,
        "depthwise_mac_share": round(dw_macs / total, 4) if total else None,
        "matmul_mac_share": round(matmul_macs / total, 4) if total else None,
    }


# --- the child: one process, AMX granted or refused, serving requests on stdin ---------------------------------
def serve(mode: str) -> None:
    """Answer lines, one JSON line each: ``load DIR`` (the programs and inputs the parent saved there),
    ``run DIR THREADS N`` (one untimed call, then N timed: wall and CPU seconds), ``save DIR THREADS`` (the
    outputs to .npy, and whether the process holds AMX now) and ``drop DIR``."""
    refused = deny_amx() if mode == "vnni" else None   # before anything starts XNNPACK
    import warnings

    import qlower

    # qlower's own per-program choice (QLOWER_XNNPACK_AMX=1 here) warns when XNNPACK started without tiles
    warnings.filterwarnings("ignore", message="XNNPACK started in this process")
    loaded: dict[str, tuple[dict, list]] = {}
    print(json.dumps({"mode": mode, "pid": os.getpid(), "refused": refused}), flush=True)
    for line in sys.stdin:
        cmd, key, *rest = line.split()
        reply: dict = {}
        if cmd == "load":
            d = Path(key)
            meta = json.loads((d / "meta.json").read_text())
            loaded[key] = ({t: qlower.load(d / f"threads{t}.qlp") for t in meta["threads"]},
                           [np.load(d / f"input{i}.npy") for i in range(meta["inputs"])])
        elif cmd == "drop":
            del loaded[key]
        else:
            progs, xs = loaded[key]
            p = progs[int(rest[0])]
            if cmd == "run":
                p.run(*xs)
                times = []
                for _ in range(int(rest[1])):
                    t, c = time.perf_counter(), time.process_time()
                    p.run(*xs)
                    times.append((time.perf_counter() - t, time.process_time() - c))
                reply = {"times": times}
            elif cmd == "save":
                outs = p.run(*xs)
                for i, y in enumerate(outs):
                    np.save(Path(key) / f"out_{mode}_t{rest[0]}_{i}.npy", y)
                reply = {"outputs": len(outs), "amx_permitted": amx_permitted()}
            else:
                raise SystemExit(f"unknown command {line!r}")
        print(json.dumps(reply), flush=True)


class Child(JsonLinesChild):
    what = "child"

    def __init__(self, mode: str):
        env = dict(os.environ, QLOWER_XNNPACK_AMX="1", TF_CPP_MIN_LOG_LEVEL="2")
        super().__init__([sys.executable, __file__, "--serve", mode], env=env)
        if mode == "vnni" and self.hello["refused"] is not True:
            self.close()
            raise RuntimeError("AMX could not be refused in the VNNI child (granted already, or not Linux x86-64)")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# --- one model --------------------------------------------------------------------------------------------------
def conv_model(side: int, cin: int, cout: int, kernel: int):
    """One convolution (``kernel`` x ``kernel``, stride 1, same padding) on a ``side`` x ``side`` image, as a zoo
    model: seeded weights, the zoo's static per-channel int8 config, random calibration images. A 1x1 one is
    an (M, N, K) = (side^2, cout, cin) GEMM."""
    import torch

    from qlower import zoo

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, kernel, padding=kernel // 2)).eval()
    gen = torch.Generator().manual_seed(1)
    images = [(torch.randn(1, cin, side, side, generator=gen),) for _ in range(4)]
    return model, images[0], zoo.get("tiny_cnn")[2], images


def _conv_spec(text: str, parser: argparse.ArgumentParser, gemm: bool) -> tuple[str, tuple[int, ...]]:
    """``MxNxK`` (a GEMM: a 1x1 convolution, M a square number) or ``SIDExCINxCOUTxKERNEL`` as a conv row."""
    try:
        dims = tuple(int(d) for d in text.split("x"))
    except ValueError:
        dims = ()
    if gemm and len(dims) == 3 and math.isqrt(dims[0]) ** 2 == dims[0]:
        return "conv", (math.isqrt(dims[0]), dims[2], dims[1], 1)
    if not gemm and len(dims) == 4:
        return "conv", dims
    parser.error(f"{text!r}: expected " + ("MxNxK with M a square number" if gemm else "SIDExCINxCOUTxKERNEL"))


def _prepare(item: tuple[str, int | None], thread_counts: list[int], workdir: Path) -> dict:
    """Compile the model, save its programs and input to ``workdir``; its features and qlower's own choice."""
    import qlower
    from qlower import zoo
    from qlower.api import lower_graph

    name, size = item
    if name == "conv":
        model, example, cfg, calibration = conv_model(*size)
    else:
        model, example, cfg, calibration = zoo.get(name, size) if size else zoo.get(name)
    t0 = time.perf_counter()
    base = qlower.compile(model, example, target="litert", quant=cfg, calibration=calibration, progress=False,
                          backend_options={"kernels": "xnnpack"})
    compile_s = time.perf_counter() - t0
    for t in thread_counts:
        p = lower_graph(base.canonical_graph, "litert", backend_options={"kernels": "xnnpack", "threads": t})
        p.save(workdir / f"threads{t}.qlp")
    for i, x in enumerate(example):
        np.save(workdir / f"input{i}.npy", x.numpy())
    (workdir / "meta.json").write_text(json.dumps({"threads": thread_counts, "inputs": len(example)}))
    return {"input_shapes": [list(x.shape) for x in example], "compile_s": round(compile_s, 1),
            "partitions": len(p.partitions), "host_ops": sum(op.kind not in ("constant", "delegate")
                                                              for op in p.graph.ops),
            "cost_model_prefers_amx": [q.payload.meta.get("xnnpack_amx") for q in p.partitions],
            **gemm_features(p.source)}


def _timed(children: dict[str, Child], key: str, threads: int, runs: int, warmup: int, cores: set[int]) -> dict:
    """Both children's timings in alternating turns, pinned to ``cores``."""
    first = {m: c.ask(f"run {key} {threads} {warmup}")["times"] for m, c in children.items()}   # pools exist now
    for c in children.values():
        pin(c.proc.pid, cores)
    est = max(statistics.median(w for w, _ in t) for t in first.values())
    block = max(3, min(50, round(BLOCK_SECONDS / max(est, 1e-6))))
    times: dict[str, list] = {m: [] for m in children}
    turns = []
    order = list(children)
    load = _Load([c.proc.pid for c in children.values()])
    while min(len(t) for t in times.values()) < max(runs, MIN_TURNS * block):
        turn = {}
        for m in order:
            time.sleep(GAP)
            got = children[m].ask(f"run {key} {threads} {block}")["times"]
            times[m].extend(got)
            turn[m] = statistics.median(w for w, _ in got)
        turns.append(turn["vnni"] / turn["amx"])
        order.reverse()
    section = load.done()
    for c in children.values():
        pin(c.proc.pid, set(os.sched_getaffinity(0)))
    row = {"cores": sorted(cores), "block": block, "turns": len(turns), **section}
    for m, t in times.items():
        row[f"{m}_ms"] = round(statistics.median(w for w, _ in t) * 1e3, 4)
        row[f"{m}_cpu_ms"] = round(statistics.median(c for _, c in t) * 1e3, 4)
        row[f"{m}_iqr_ms"] = [round(float(np.percentile([w for w, _ in t], q)) * 1e3, 4) for q in (25, 75)]
    row["ratio"] = round(row["vnni_ms"] / row["amx_ms"], 4)
    row["paired_ratio"] = round(statistics.median(turns), 4)
    row["paired_iqr"] = [round(float(np.percentile(turns, q)), 4) for q in (25, 75)]
    return row


def _outputs(workdir: Path, mode: str, threads: int, n: int) -> list[np.ndarray]:
    return [np.load(workdir / f"out_{mode}_t{threads}_{i}.npy") for i in range(n)]


def _label(item: tuple[str, int | tuple | None]) -> str:
    name, size = item
    if name == "conv":
        side, cin, cout, kernel = size
        return f"conv{kernel} {side * side}x{cout}x{cin * kernel * kernel}"
    return name + (f"@{size}" if size else "")


def bench(children: dict[str, Child], item: tuple[str, int | tuple | None], thread_counts: list[int], runs: int,
          warmup: int) -> dict:
    row: dict = {"model": _label(item), "zoo_name": item[0], "size": item[1]}
    with tempfile.TemporaryDirectory(prefix="xnnpack_isa_") as tmp:
        workdir = Path(tmp)
        try:
            row.update(_prepare(item, thread_counts, workdir))
        except Exception as e:   # a model the litert target can't compile is a row that says why
            row["skipped"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            return row
        for c in children.values():
            c.ask(f"load {workdir}")
        try:
            allowed = sorted(os.sched_getaffinity(0))
            row["threads"] = {}
            saved = {}
            for t in thread_counts:
                row["threads"][str(t)] = _timed(children, str(workdir), t, runs, warmup, set(allowed[:t]))
                saved[t] = {m: c.ask(f"save {workdir} {t}") for m, c in children.items()}
            row["amx_permitted"] = {m: saved[thread_counts[0]][m]["amx_permitted"] for m in MODES}
        finally:
            for c in children.values():
                c.ask(f"drop {workdir}")
        n = saved[thread_counts[0]]["amx"]["outputs"]
        ref = _outputs(workdir, "amx", thread_counts[0], n)
        row["bit_identical"] = all(
            all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(ref, _outputs(workdir, m, t, n)))
            for t in thread_counts for m in MODES)
    return row


# --- the fit ----------------------------------------------------------------------------------------------------
def _winner(r: dict) -> str | None:
    """'amx' or 'vnni' by the paired ratio; None (a tie) when its IQR holds 1."""
    lo, hi = r["paired_iqr"]
    return None if lo <= 1 <= hi else ("amx" if r["paired_ratio"] > 1 else "vnni")


def _regret(amx: bool, paired: float) -> float:
    """How much slower a row runs with the chosen kernels than with the faster ones (log of the time ratio),
    from its paired ratio VNNI/AMX."""
    return max(0.0, -math.log(paired)) if amx else max(0.0, math.log(paired))


def _threshold(points: list[tuple[float, float, str | None]], high: str) -> dict:
    """The threshold on one feature for the rule "``high`` above it, the other kernels below", from ``points``
    (value, paired ratio, clear winner or None): the cut between two neighbouring values with the least mean
    regret over every point (then the fewest errors among clear winners). Gives the cut (their geometric mean),
    the interval of values it lies in, its margin (upper/lower end), the errors, the mean and worst regret."""
    values = sorted({v for v, _, _ in points})
    cuts = []
    for i in range(len(values) + 1):
        lo = values[i - 1] if i else -math.inf
        hi = values[i] if i < len(values) else math.inf
        choice = [(v > lo) == (high == "amx") for v, _, _ in points]   # AMX chosen?
        regrets = [_regret(c, p) for c, (_, p, _) in zip(choice, points)]
        errors = sum(w is not None and (w == "amx") != c for c, (_, _, w) in zip(choice, points))
        cuts.append((sum(regrets) / len(regrets), errors, lo, hi, regrets))
    mean, errors, lo, hi, regrets = min(cuts, key=lambda c: (round(c[0], 6), c[1]))
    # every cut whose mean regret is within NEAR of the best: how sharply the data place the threshold
    near = [c for c in cuts if c[0] <= mean + math.log1p(NEAR / 100)]
    finite = lo > 0 and hi < math.inf

    def end(v: float) -> float | None:
        return None if math.isinf(v) else round(v, 4)
    return {"threshold": round(math.sqrt(lo * hi), 4) if finite else end(lo if hi == math.inf else hi),
            "interval": [end(lo), end(hi)], "margin": round(hi / lo, 3) if finite else None,
            "near_interval": [end(min(c[2] for c in near)), end(max(c[3] for c in near))],
            "errors": errors, "clear": sum(w is not None for _, _, w in points), "rows": len(points),
            "mean_regret_pct": round(100 * math.expm1(mean), 2),
            "max_regret_pct": round(100 * math.expm1(max(regrets)), 1)}


def _rule(points: list[tuple[bool, float, str | None]]) -> dict:
    """A fixed choice per row (AMX?, paired ratio, clear winner): its errors and regret."""
    regrets = [_regret(c, p) for c, p, _ in points]
    return {"errors": sum(w is not None and (w == "amx") != c for c, _, w in points),
            "clear": sum(w is not None for _, _, w in points), "rows": len(points),
            "mean_regret_pct": round(100 * (math.exp(sum(regrets) / len(regrets)) - 1), 2),
            "max_regret_pct": round(100 * (math.exp(max(regrets)) - 1), 1)}


FEATURES = (("mean_n", "amx"), ("mean_k", "amx"), ("gemm_macs", "amx"), ("amx_eff", "amx"),
            ("depthwise_mac_share", "vnni"))   # (feature, which kernels win above its threshold)


def fit(rows: list[dict], threads: str, r_value: float) -> dict:
    """At ``threads``: R (the rule prefers AMX when R > vnni_eff/amx_eff) fitted as the threshold on
    vnni_eff/amx_eff, the rule at ``r_value``, always-AMX and always-VNNI, and one-threshold rules on the other
    features; each with its errors among the rows whose winner is clear (paired IQR away from 1) and its regret
    over every row with a GEMM (the time lost against the faster kernels, from the paired ratio)."""
    done = [r for r in rows if threads in r.get("threads", {}) and r["amx_eff"]]
    out: dict = {"threads": int(threads), "rows": [r["model"] for r in done],
                 "ties": [r["model"] for r in done if not _winner(r["threads"][threads])]}
    if not done:
        return out
    pts = [(r, r["threads"][threads]["paired_ratio"], _winner(r["threads"][threads])) for r in done]
    out["R"] = _threshold([(r["vnni_eff"] / r["amx_eff"], p, w) for r, p, w in pts], "vnni")
    out[f"R={r_value}"] = _rule([(r["amx_eff"] * r_value > r["vnni_eff"], p, w) for r, p, w in pts])
    out["always AMX"] = _rule([(True, p, w) for _, p, w in pts])
    out["always VNNI"] = _rule([(False, p, w) for _, p, w in pts])
    for feature, high in FEATURES:
        out[feature] = _threshold([(r[feature], p, w) for r, p, w in pts if r[feature] is not None], high)
    return out


# --- report -----------------------------------------------------------------------------------------------------
def _table(rows: list[dict], r_value: float, thread_counts: list[int]) -> None:
    print(f"\nXNNPACK int8 GEMMs, AMX tiles vs AVX-512 VNNI, two processes in turns (medians); ratio = VNNI/AMX "
          f"(>1: AMX faster); paired = median over turns [IQR]; predicted with R={r_value}")
    print(f"{'model':22} thr {'ms AMX':>9} {'ms VNNI':>9} {'ratio':>6} {'paired [IQR]':>20} {'amx_eff':>7} "
          f"{'vnni_eff':>8} {'dw%':>5} {'N':>6} {'K':>6} pred  meas  ok?  same  load")
    for r in rows:
        if "skipped" in r:
            print(f"{r['model']:22}  -  skipped: {r['skipped']}")
            continue
        pred = None if r["amx_eff"] is None else ("amx" if r["amx_eff"] * r_value > r["vnni_eff"] else "vnni")
        for t in thread_counts:
            s = r["threads"][str(t)]
            won = _winner(s)
            ok = "tie" if won is None or pred is None else ("yes" if won == pred else "NO")
            feats = (f"{r['amx_eff'] or 0:7.3f} {r['vnni_eff'] or 0:8.3f} {100 * (r['depthwise_mac_share'] or 0):5.1f} "
                     f"{r['mean_n'] or 0:6.0f} {r['mean_k'] or 0:6.0f}")
            paired = f"{s['paired_ratio']:.3f} [{s['paired_iqr'][0]:.3f},{s['paired_iqr'][1]:.3f}]"
            print(f"{r['model']:22} {t:3} {s['amx_ms']:9.3f} {s['vnni_ms']:9.3f} {s['ratio']:6.3f} {paired:>20} "
                  f"{feats} {pred or '-':5} {won or 'tie':5} {ok:4} {'yes' if r['bit_identical'] else 'NO':4}  "
                  f"{s['load_average_1min_before']:.1f}->{s['load_average_1min_after']:.1f} "
                  f"+{s['other_processes_cores']:.2f}c")


def _gemm_table(rows: list[dict], thread_counts: list[int]) -> None:
    """The one-GEMM rows: the R each implies (its paired ratio times vnni_eff/amx_eff: the speed-up of AMX per
    padded MAC, were the whole program its GEMM)."""
    gemms = [r for r in rows if r["zoo_name"] == "conv" and "threads" in r]
    if not gemms:
        return
    print("\none-convolution programs: implied R = paired ratio * vnni_eff / amx_eff")
    print(f"{'conv MxNxK':22} {'MMAC':>7} {'amx_eff':>7} {'vnni_eff':>8} "
          + " ".join(f"{f'ms AMX/VNNI t{t}':>20} {'paired':>6} {'R':>6}" for t in thread_counts))
    for r in gemms:
        cols = []
        for t in thread_counts:
            s = r["threads"][str(t)]
            s["implied_r"] = round(s["paired_ratio"] * r["vnni_eff"] / r["amx_eff"], 3)
            cols.append(f"{s['amx_ms']:9.3f}/{s['vnni_ms']:<10.3f} {s['paired_ratio']:6.3f} {s['implied_r']:6.3f}")
        print(f"{r['model']:22} {r['gemm_macs'] / 1e6:7.1f} {r['amx_eff']:7.3f} {r['vnni_eff']:8.3f} "
              + " ".join(cols))


def _write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))


def main() -> None:
    from qlower import zoo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=zoo.names(), choices=zoo.names())
    parser.add_argument("--extra", nargs="*", default=[], metavar="NAME@SIZE",
                        help="more rows at another input size, e.g. resnet18@112")
    parser.add_argument("--gemms", nargs="*", default=[], metavar="MxNxK",
                        help="one-GEMM programs (a 1x1 convolution; M a square number), e.g. 3136x64x576")
    parser.add_argument("--convs", nargs="*", default=[], metavar="SIDExCINxCOUTxKERNEL",
                        help="one-convolution programs, e.g. 56x64x64x3 (the row shows its GEMM: M x N x K)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=30, help="timed calls per child (at least)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--r", type=float, default=AMX_SPEEDUP,
                        help=f"the cost model's AMX speed-up per padded MAC (default qlower's, {AMX_SPEEDUP})")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "xnnpack_isa.json")
    args = parser.parse_args()
    if amx_permitted() is None:
        parser.error("needs Linux x86-64 (AMX permission is asked of Linux)")
    todo = ([(m, None) for m in args.models] + [(e.split("@")[0], int(e.split("@")[1])) for e in args.extra]
            + [_conv_spec(g, parser, True) for g in args.gemms] + [_conv_spec(c, parser, False) for c in args.convs])
    rows: list[dict] = []
    load0 = os.getloadavg()
    result = {"benchmark": "xnnpack_isa", "threads": args.threads, "runs": args.runs, "warmup": args.warmup,
              "r": args.r, "load_average_before": load0,
              "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version()}}
    children: dict[str, Child] = {}
    try:
        for m in MODES:
            children[m] = Child(m)
        for item in todo:
            t0 = time.perf_counter()
            rows.append(bench(children, item, args.threads, args.runs, args.warmup))
            _write(args.out, {**result, "rows": rows, "complete": False})   # kept if a later row fails
            print(f"  {rows[-1]['model']}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        for c in children.values():
            c.close()
    _table(rows, args.r, args.threads)
    _gemm_table(rows, args.threads)
    fits = [fit([r for r in rows if r["zoo_name"] != "conv"], str(t), args.r) for t in args.threads]
    for f in fits:
        print(f"\nrules at {f['threads']} thread(s), over {len(f['rows'])} models with a GEMM (errors among those "
              f"with a clear winner; regret: time lost against the faster kernels, by the paired ratio); "
              f"ties: {', '.join(f['ties']) or '-'}")
        for name in ("R", f"R={args.r}", "always AMX", "always VNNI", *(k for k, _ in FEATURES)):
            if name in f:
                g = f[name]
                def num(v: float | None) -> str:
                    return "-" if v is None else f"{v:.4g}"
                cut = (f"threshold {num(g['threshold'])} in [{num(g['interval'][0])}, {num(g['interval'][1])}] "
                       f"(margin {num(g['margin'])}; within {NEAR}% of its regret: [{num(g['near_interval'][0])}, "
                       f"{num(g['near_interval'][1])}])" if "threshold" in g else "")
                print(f"  {name:20} errors {g['errors']:2}/{g['clear']:<2} regret mean {g['mean_regret_pct']:5.2f}% "
                      f"max {g['max_regret_pct']:6.1f}%  {cut}")
    load1 = os.getloadavg()
    print(f"\nload average (1, 5, 15 min) {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} -> "
          f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} on {os.cpu_count()} CPUs")
    _write(args.out, {**result, "load_average_after": load1, "rows": rows, "fits": fits, "complete": True})
    print(f"written to {args.out}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        main()
