"""Each rewriting target against a separately compiled ``reference`` program, as a peer would compare.

For every op-catalogue case and zoo model (image models at ``--size``), each target is compiled
(with the case's calibration) and verified, and a ``reference`` program is compiled on its own
from the same model and calibration. The outputs of the two programs are compared in steps of
the output's quantization (the dequantized output's scale; 1 for integer outputs), and each case
is classed:

- ``equal``: the target's outputs are the reference target's;
- ``explained``: they differ, the report says by as much (``form_vs_canonical`` at that output,
  at least the peer's difference), names the rewrites responsible, and is OK (the target exact
  with its own form, the form within its declared bounds op by op);
- ``unexplained``: anything else (the goal: none); ``failed``: the compile or run raised.

    python benchmarks/target_forms.py [--targets litert tflm ethos-u55-128] [--size 32] [--ops] [--zoo]
                                      [--out results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
import warnings

import numpy as np

import qlower
from qlower import zoo
from qlower.testing import op_catalog
from qlower.verification import verify_program

DYNAMIC = ("s0_dynamic_biasless", "s2_perchannel_binary")


def _steps(graph) -> list[float]:
    producers = graph.producers()
    out = []
    for v in graph.outputs:
        op = producers.get(v)
        q = op.operands[0].quant if op is not None and op.kind == "dequantize" and op.operands[1] is None else None
        out.append(q.scale[0] if q is not None and len(q.scale) == 1 else 1.0)
    return out


def compare(name: str, model, example, calibration, quant, target: str) -> dict:
    row = {"case": name, "target": target}
    t0 = time.perf_counter()
    try:
        prog = qlower.compile(model, example, target, quant, calibration, progress=False, trace=True)
        ref = qlower.compile(model, example, "reference", quant, calibration, progress=False)
        report = verify_program(prog, [example])
        ours, theirs = prog.run(*example), ref.run(*example)
    except Exception as e:  # noqa: BLE001 - a failure is a row of the table
        return {**row, "class": "failed", "error": f"{type(e).__name__}: {str(e)[:300]}",
                "trace": traceback.format_exc(limit=3)[-600:]}
    peer_abs = [float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max(initial=0.0))
                for a, b in zip(ours, theirs)]
    peer = [round(d / s, 2) for d, s in zip(peer_abs, _steps(prog.source))]
    forms = [o.form_vs_canonical for o in report.outputs]
    reported = [f.max_steps if f is not None else 0.0 for f in forms]
    reported_abs = [f.max_abs if f is not None else 0.0 for f in forms]
    named = [o.rewrite for o in report.outputs]
    if max(peer_abs, default=0) == 0:
        cls = "equal" if report.ok else "unexplained"
    else:   # the report states at least the peer's difference (in real terms) and names its rewrites
        told = all(d == 0 or (r >= d * (1 - 1e-6) and n) for d, r, n in zip(peer_abs, reported_abs, named))
        cls = "explained" if told and report.ok else "unexplained"
    alone = [r.form_alone_steps for r in report.layers if r.form_alone_steps]
    return {**row, "class": cls, "peer_steps": peer, "reported_steps": reported, "rewrites": named,
            "applied": [r["name"] for r in report.rewrites], "ok": report.ok, "problems": report.problems[:3],
            "worst_alone": max(alone, default=0.0), "seconds": round(time.perf_counter() - t0, 2)}


def op_cases():
    for case in op_catalog.cases():
        yield case.key, case.build(), case.inputs(), case.calibration(), qlower.QuantConfig()


def zoo_cases(size: int):
    for name in zoo.names():
        if name in DYNAMIC:
            continue
        model, example, quant, calibration = zoo.get(name, size if zoo.default_size(name) else None)
        yield f"zoo/{name}", model, tuple(example), calibration[:4], quant


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", nargs="+", default=["litert", "tflm", "ethos-u55-128", "ethos-u85-256"])
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--ops", action="store_true", help="the op catalogue (default: both)")
    ap.add_argument("--zoo", action="store_true", help="the zoo (default: both)")
    ap.add_argument("--out", default=None, help="a JSON-lines file of every row")
    args = ap.parse_args()
    both = not (args.ops or args.zoo)
    warnings.filterwarnings("ignore")
    counts: dict[tuple[str, str], int] = {}
    out = open(args.out, "w") if args.out else None   # noqa: SIM115 - closed below
    sources = [*(op_cases() if args.ops or both else ()), *(zoo_cases(args.size) if args.zoo or both else ())]
    for name, model, example, calibration, quant in sources:
        for target in args.targets:
            row = compare(name, model, example, calibration, quant, target)
            counts[(target, row["class"])] = counts.get((target, row["class"]), 0) + 1
            if row["class"] != "equal":
                print(json.dumps({k: v for k, v in row.items() if k != "trace"}), flush=True)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
    if out:
        out.close()
    print(f"{'target':16} {'equal':>6} {'explained':>10} {'unexplained':>12} {'failed':>7}")
    for target in args.targets:
        print(f"{target:16} " + " ".join(f"{counts.get((target, c), 0):>{w}}" for c, w in
                                         (("equal", 6), ("explained", 10), ("unexplained", 12), ("failed", 7))))


if __name__ == "__main__":
    main()
