"""Real models (Hugging Face transformers from tiny configs, timm backbones, ultralytics YOLO11n detect and
segment; random init, qlower/testing/real_models.py) x every target: outcome, compile time, partitions, share of integer ops, host float ops.

Each model is compiled once for ``reference`` (capture, PT2E, import, passes: the "frontend" time), then
lowered for each target (the "lower" time) and run on one held-out input: ``exact`` when every output
equals the reference interpreter on the target's form. ``integer`` is the share of the program's IR ops
that compute on integers (``qlower.testing.coverage.op_shares``), ``host float`` the ops run in float on
the host (boundary quantize / dequantize left out), ``host`` every op a delegate target leaves on the
host, by kind (constants, quantize and dequantize left out; the transposes at the model's boundary
count), and on ``reference`` and ``cpu``, where everything runs on the host, the aten fallbacks.

    python benchmarks/real_models.py [--models bert vit ...] [--targets cpu litert ...] [--set ci] [--json PATH]

``--set ci`` measures the reduced forms tests/test_real_models.py runs in CI (``CI_MODELS``) instead.

Output: a table, and benchmarks/results/real_models.json (or PATH).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

import qlower
from qlower.api import lower_graph
from qlower.reference import run_graph
from qlower.testing.coverage import HOST_TARGETS, PLUMBING, on_host, op_shares
from qlower.testing.differential import program_meaning
from qlower.testing.frontend import FLOAT_BOUNDARY
from qlower.testing.real_models import CI_MODELS, REAL_MODELS

TARGETS = ("reference", "cpu", "tosa-1.0+int", "ethos-u55-128", "ethos-u85-256", "vgf+int", "litert", "tflm")
RESULTS = Path(__file__).resolve().parent / "results" / "real_models.json"


def host_float_ops(prog) -> list[str]:
    """Ops of ``prog`` that run in float on the host (their aten target when a fallback)."""
    return [str(op.attrs.get("target", op.kind)) for op in prog.source.ops
            if op.kind not in FLOAT_BOUNDARY and on_host(prog, op)
            and any(r.dtype.is_float and r.quant is None for r in op.results)]


def host_ops(prog) -> dict[str, int]:
    """Ops left on the host of a delegate target, by kind (aten fallbacks by their target); on a host
    target only the fallbacks."""
    kinds = Counter(str(op.attrs["target"]) if op.kind == "aten" else op.kind for op in prog.source.ops
                    if op.kind not in PLUMBING and on_host(prog, op)
                    and (op.kind == "aten" or prog.target not in HOST_TARGETS))
    return dict(sorted(kinds.items()))


def measure(name: str, targets: tuple[str, ...], models: dict = REAL_MODELS) -> list[dict]:
    entry = models[name]
    model, example = entry.build()
    rows = []
    start = time.perf_counter()
    try:
        compiled = qlower.compile(model, example, target="reference", calibration=entry.calibration(),
                                  progress=False)
    except Exception as e:  # noqa: BLE001 - a refusal is a row of the table
        rows = [{"model": name, "target": t, "outcome": f"refused: {type(e).__name__}: {str(e)[:160]}"}
                for t in targets]
        print(_line(rows[0]), flush=True)
        return rows
    frontend = time.perf_counter() - start
    inputs = entry.make_inputs(7)
    for target in targets:
        row = {"model": name, "target": target, "frontend_s": round(frontend, 2)}
        start = time.perf_counter()
        try:
            options = {"execution": "vulkan"} if target.startswith("vgf") else None
            prog = compiled if target == "reference" else lower_graph(compiled.source, target,
                                                                          backend_options=options)
            row["lower_s"] = round(time.perf_counter() - start, 2)
            want = run_graph(program_meaning(compiled.source, target), [t.numpy() for t in inputs])
            got = prog.run(*inputs)
            same = all(g.shape == w.shape and np.array_equal(g, w) for g, w in zip(got, want))
            shares = op_shares(prog)
            row.update(outcome="exact" if same else "MISMATCH", partitions=len(prog.partitions),
                       ops=shares["ops"], integer_share=shares["integer_share"],
                       host_float=len(host_float_ops(prog)), host_ops=host_ops(prog),
                       fallbacks=shares["fallback_targets"])
        except Exception as e:  # noqa: BLE001
            row["outcome"] = f"error: {type(e).__name__}: {str(e)[:160]}"
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _line(r: dict) -> str:
    if "partitions" not in r:
        return f"{r['model']:<17} {r['target']:<14} {r['outcome']}"
    return (f"{r['model']:<17} {r['target']:<14} {r['outcome']:<9} {r['frontend_s']:>7.1f} {r['lower_s']:>7.1f} "
            f"{r['partitions']:>5} {100 * r['integer_share']:>8.1f}% {r['host_float']:>6} {sum(r['host_ops'].values()):>5}  "
            + ", ".join(f"{k} {n}" for k, n in r["host_ops"].items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=("real", "ci"), default="real")
    parser.add_argument("--models", nargs="*")
    parser.add_argument("--targets", nargs="*", default=list(TARGETS))
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    print(f"{'model':<17} {'target':<14} {'outcome':<9} {'front s':>7} {'lower s':>7} {'parts':>5} {'integer':>9} "
          f"{'hostfl':>6} {'host':>5}  host ops")
    models = CI_MODELS if args.set == "ci" else REAL_MODELS
    rows = [r for name in args.models or list(models) for r in measure(name, tuple(args.targets), models)]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
