"""Integer coverage: where each op of the catalogue runs per target, and how integer each zoo model is.

Ops: every case of qlower/testing/op_catalog.py is quantized (static int8),
imported and optimised once, lowered for each target and classified
(qlower/testing/coverage.py): integer on the target, integer on the host, float
on the host (a float fallback), or refused. The table counts cases per family
and target; a target's output that is not bit-exact with the reference
interpreter (or a run that raises) is counted too and listed (it should never happen).

Models: every zoo model (image models at ``--size``) with its own QuantConfig;
the share of IR ops (constants, quantize and dequantize left out) that are
integer, and the share inside NPU partitions for the ``--npu-targets`` (the transposes at the
model's boundary count: Ethos-U keeps them on the host on purpose).

    python benchmarks/coverage.py [--targets reference cpu tosa-1.0+int ethos-u85-256 ethos-u55-128]
                                  [--size 32] [--models tiny_cnn ...] [--no-ops] [--no-models]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from qlower import zoo
from qlower.api import lower_graph
from qlower.frontend import capture_and_import
from qlower.passes import default_pipeline
from qlower.reference import run_graph
from qlower.testing import op_catalog
from qlower.testing.coverage import CLASSES, REFUSED, classify, op_shares, prepare

TARGETS = ["reference", "cpu", "tosa-1.0+int", "ethos-u85-256", "ethos-u55-128"]
NPU_TARGETS = ["tosa-1.0+int", "ethos-u85-256"]
SHORT = {"integer on target": "int", "host integer": "host-int", "host float": "float", "refused": "refused"}


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def _exact(got, want) -> bool:
    return len(got) == len(want) and all(
        np.asarray(g).shape == np.asarray(w).shape and np.asarray(g).dtype == np.asarray(w).dtype
        and np.array_equal(g, w, equal_nan=np.asarray(w).dtype.kind == "f") for g, w in zip(got, want))


def op_rows(targets: list[str]) -> list[dict]:
    rows = []
    for case in op_catalog.CASES:
        t0 = time.perf_counter()
        try:
            prep = prepare(case)
            want = run_graph(prep.graph, [x.numpy() for x in prep.inputs])
        except Exception as e:  # noqa: BLE001  (a refusal is a result here)
            prep, error = None, e
        for target in targets:
            row = {"family": case.family, "case": case.name, "target": target}
            if prep is None:
                place, exact = classify(error, case), None
            else:
                try:
                    prog = prep.lower(target)
                except Exception as e:  # noqa: BLE001
                    place, exact = classify(e, case), None
                else:
                    place = classify(prog, case)
                    try:
                        exact = _exact(prog.run(*prep.inputs), want)
                    except Exception as e:  # noqa: BLE001  (compiled, but running it failed: a bug)
                        exact, row["run_error"] = False, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            row.update({"class": place.cls, "ops": list(place.kinds), "bit_exact": exact,
                        "detail": place.describe()})
            rows.append(row)
        print(f"  {case.key}: " + ", ".join(f"{r['target']} {SHORT[r['class']]}" for r in rows[-len(targets):])
              + f" ({time.perf_counter() - t0:.1f} s)", flush=True)
    return rows


def model_rows(names: list[str], size: int, npu_targets: list[str]) -> list[dict]:
    rows = []
    for name in names:
        t0 = time.perf_counter()
        used_size = size if zoo.default_size(name) is not None else None
        row: dict = {"model": name, "size": used_size}
        try:
            model, example, quant, calib = zoo.get(name, size=used_size)
            row["quant"] = quant.mode if quant is not None else "float"
            front = capture_and_import(model, example, quant, calib, progress=False)
            graph = default_pipeline().run(front.graph)
            host = op_shares(lower_graph(graph, "reference"))
            row.update({"ops": host["ops"], "integer_share": host["integer_share"],
                        "float_fallbacks": host["float_fallbacks"], "fallback_targets": host["fallback_targets"]})
            for target in npu_targets:
                try:
                    row[f"npu_share:{target}"] = op_shares(lower_graph(graph, target))["delegated_share"]
                except Exception as e:  # noqa: BLE001
                    row[f"npu_share:{target}"] = None
                    row.setdefault("errors", []).append(f"{target}: {type(e).__name__}: {str(e)[:200]}")
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        row["seconds"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
        what = row["error"] if "error" in row else f"{_pct(row['integer_share'])} integer"
        print(f"  {name}: {what} ({row['seconds']} s)", flush=True)
    return rows


def family_table(rows: list[dict], targets: list[str]) -> dict:
    counts: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for r in rows:
        for key in ((r["family"], r["target"]), ("all", r["target"])):
            counts[key][r["class"]] += 1
            counts[key]["not bit-exact"] += r["bit_exact"] is False
    return {f"{fam}|{t}": dict(c) for (fam, t), c in counts.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", nargs="+", default=TARGETS)
    p.add_argument("--npu-targets", nargs="+", default=NPU_TARGETS)
    p.add_argument("--size", type=int, default=32, help="input height/width of the zoo's image models")
    p.add_argument("--models", nargs="+", default=None, help="zoo models (default: all of qlower.zoo.names())")
    p.add_argument("--no-ops", action="store_true")
    p.add_argument("--no-models", action="store_true")
    p.add_argument("--json", default=str(Path(__file__).parent / "results" / "coverage.json"))
    args = p.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    result: dict = {"targets": args.targets, "npu_targets": args.npu_targets, "size": args.size}
    if not args.no_ops:
        print(f"op catalogue: {len(op_catalog.CASES)} cases × {len(args.targets)} targets")
        rows = op_rows(args.targets)
        table = family_table(rows, args.targets)
        result.update({"cases": rows, "families": table})
        t = Table(title="op cases per family × target: int on target / host int / host float / refused "
                        "(! = not bit-exact with the reference)")
        t.add_column("family")
        for target in args.targets:
            t.add_column(target, justify="center")
        for fam in (*op_catalog.FAMILIES, "all"):
            cells = []
            for target in args.targets:
                c = table.get(f"{fam}|{target}", {})
                cell = " / ".join(str(c.get(k, 0)) for k in CLASSES)
                cells.append(cell + (f" !{c['not bit-exact']}" if c.get("not bit-exact") else ""))
            t.add_row(fam, *cells)
        console.print(t)
        for r in rows:
            if r["class"] == REFUSED:
                print(f"refused {r['family']}/{r['case']} on {r['target']}: {r['detail'][len(REFUSED) + 2:][:240]}")
            elif r["bit_exact"] is False:
                print(f"NOT BIT-EXACT {r['family']}/{r['case']} on {r['target']}: "
                      + r.get("run_error", "outputs differ from the reference interpreter's"))
    if not args.no_models:
        names = args.models or zoo.names()
        print(f"zoo: {len(names)} models")
        mrows = model_rows(names, args.size, args.npu_targets)
        result["models"] = mrows
        t = Table(title=f"zoo models (image models at {args.size}x{args.size}): share of IR ops")
        for col in ("model", "quant", "IR ops", "integer", *(f"in NPU partitions: {n}" for n in args.npu_targets),
                    "float fallbacks"):
            t.add_column(col)
        for r in mrows:
            if "error" in r:
                t.add_row(r["model"], r.get("quant", "—"), "—", "refused: " + r["error"][:60],
                          *("—" for _ in args.npu_targets), "—")
                continue
            npu = [_pct(r.get(f"npu_share:{n}")) for n in args.npu_targets]
            fb = ", ".join(f"{k.removeprefix('aten.')}×{v}" for k, v in sorted(r["fallback_targets"].items()))
            t.add_row(r["model"], r["quant"], str(r["ops"]), _pct(r["integer_share"]), *npu, fb or "none")
        console.print(t)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(),
                         "load_average_1min_before": round(load_before, 2),
                         "load_average_1min_after": round(os.getloadavg()[0], 2)}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {args.json} ({result['seconds']} s)")


if __name__ == "__main__":
    main()
