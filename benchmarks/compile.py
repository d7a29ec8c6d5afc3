"""Compile time: quantized PyTorch model → program, per stage and target.

PT2E quantization is timed on its own, and split into its stages (export,
prepare, calibration, convert: where the compile time of a quantized model goes);
the first capture of the process, which pays torch's one-time warm-up, is shown
apart ("PT2E first") and left out of the medians;
"compile" is what qlower adds after it: import into the IR, the pass pipeline,
and partitioning + lowering (TOSA serialisation, tosa-opt validation, Vela).
Medians over ``--repeat`` runs; the machine is shared and noisy, so compare
ratios within one run.

    python benchmarks/compile.py [--size 224] [--repeat 3] [--targets reference tosa-1.0+int]
    python benchmarks/compile.py --repeat 1 --targets ethos-u85-256 ethos-u55-128 vgf+int \
        --json benchmarks/results/compile_npu.json     # also Vela's cycle estimates, per memory mode
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from qlower import zoo
from qlower.api import lower_graph
from qlower.frontend.capture import capture
from qlower.frontend.importer import import_graph
from qlower.passes import default_pipeline


def _time(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def bench(name: str, size: int, targets: list[str], repeat: int) -> list[dict]:
    model, example, quant, calib = zoo.get(name, size=size)
    # The first capture of the process pays torch's one-time warm-up (lazy imports, first dispatch of
    # each op): reported apart, as "first"; the medians are over the captures after it.
    timed = [_time(lambda: capture(model, example, quant, calib, progress=False)) for _ in range(repeat + 1)]
    captured = timed[-1][0]
    t_first, t_quant = timed[0][1], statistics.median(t for _, t in timed[1:])
    stages = {f"pt2e_{stage}_s": round(statistics.median(c.seconds[stage] for c, _ in timed[1:]), 3)
              for stage in captured.seconds}
    rows = []
    for target in targets:
        samples = []
        for _ in range(repeat):
            imported, t_import = _time(lambda: import_graph(captured.graph_module, name=name))
            graph, t_passes = _time(lambda imported=imported: default_pipeline().run(imported.graph))
            prog, t_lower = _time(lambda graph=graph, target=target: lower_graph(graph, target))
            samples.append((t_import, t_passes, t_lower))
        med = [statistics.median(s[i] for s in samples) for i in range(3)]
        counts: dict[str, int] = {}
        for p in prog.partitions:
            tosa_meta = p.payload.meta.get("tosa", p.payload.meta)  # Ethos-U and VGF payloads nest theirs
            for k, n in tosa_meta.get("tosa_ops", {}).items():
                counts[k] = counts.get(k, 0) + n
        perf = [p.payload.meta["perf"] for p in prog.partitions if "perf" in p.payload.meta]
        rows.append({"model": name, "size": size, "target": target, "pt2e_quantize_s": round(t_quant, 3), **stages,
                     "pt2e_first_s": round(t_first, 3),
                     "import_s": round(med[0], 3), "passes_s": round(med[1], 3), "lower_s": round(med[2], 3),
                     "compile_s": round(sum(med), 3), "total_s": round(t_quant + sum(med), 3),
                     "partitions": len(prog.partitions),
                     "ir_ops": len(graph.ops), "tosa_ops": counts,
                     # Vela's estimate for Ethos-U targets, summed over partitions
                     "npu_cycles": sum(x["npu_cycles"] for x in perf) if perf else None,
                     "total_cycles": sum(x["total_cycles"] for x in perf) if perf else None,
                     "memory_modes": _cycles_per_memory_mode(graph, target) if perf else None})
    return rows


def _cycles_per_memory_mode(graph, target: str) -> dict[str, dict[str, int]]:
    """Vela's NPU and total cycles for each memory mode of vela.ini that the accelerator takes."""
    from qlower.backends.ethosu.vela import memory_modes

    out = {}
    for mode in memory_modes(target):
        perf = [p.payload.meta["perf"] for p in lower_graph(graph, target, backend_options={"memory_mode": mode})
                .partitions]
        out[mode] = {"npu_cycles": sum(x["npu_cycles"] for x in perf), "total_cycles": sum(x["total_cycles"] for x in perf)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--models", nargs="+", default=["mobilenet_v2", "resnet18"])
    p.add_argument("--targets", nargs="+", default=["reference", "tosa-1.0+int"])
    p.add_argument("--json", default=str(Path(__file__).parent / "results" / "compile.json"))
    args = p.parse_args()
    rows = [r for m in args.models for r in bench(m, args.size, args.targets, args.repeat)]

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"qlower compile time (median of {args.repeat}, seconds)")
    for col in ("model", "target", "PT2E quantize (export / prepare / calibrate / convert)", "PT2E first",
                "import", "passes", "lower", "compile", "PT2E + compile", "partitions", "total cycles (Vela)",
                "NPU cycles"):
        t.add_column(col)
    for r in rows:
        split = " / ".join(f"{r.get(f'pt2e_{s}_s', 0):.2f}" for s in ("export", "prepare", "calibrate", "convert"))
        t.add_row(r["model"], r["target"], f"{r['pt2e_quantize_s']:.2f} ({split})", f"{r['pt2e_first_s']:.2f}",
                  f"{r['import_s']:.3f}", f"{r['passes_s']:.3f}", f"{r['lower_s']:.3f}", f"{r['compile_s']:.3f}",
                  f"{r['total_s']:.2f}", str(r["partitions"]),
                  "—" if r["total_cycles"] is None else f"{r['total_cycles']:,}",
                  "—" if r["npu_cycles"] is None else f"{r['npu_cycles']:,}")
    Console(width=150).print(t)
    modes = Table(title="Vela's total / NPU cycles per memory mode (default system config of each family)")
    for col in ("model", "target", "memory mode", "total cycles", "NPU cycles"):
        modes.add_column(col)
    for r in rows:
        for mode, c in (r["memory_modes"] or {}).items():
            modes.add_row(r["model"], r["target"], mode, f"{c['total_cycles']:,}", f"{c['npu_cycles']:,}")
    if modes.rows:
        Console(width=150).print(modes)
    for r in rows:
        if r["tosa_ops"]:
            print(f"{r['model']} {r['target']} TOSA ops: " + ", ".join(f"{k} {v}" for k, v in sorted(r["tosa_ops"].items())))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
