"""Ethos-U55 partition counts of the zoo's transformer models, with and without the divider-free forms.

Vela runs no INTDIV and no GATHER on Ethos-U55 (nor EQUAL/SELECT), so before issue 25 §3 every
integer division by a constant (LayerNorm's normalisation steps) and every int16 lookup (softmax's
exponentials) stayed on the host and split the model into pieces. The Ethos-U backend now writes a
division by a constant as multiplies and shifts (qlower/backends/tosa/division.py, exact for every
int32) and a lookup in at most 256 entries as int8 TABLEs, Vela's LUTs. "before" compiles with
``backend_options={"divider_free": False}`` (the old lowering), "after" with the default; both
programs are checked bit-exact against the reference target on the example input. The host ops
left are named with their count (LayerNorm's 16384-entry rsqrt table, softmax's division by its
run-time sum). ethos-u85-256 is shown for comparison.

    python benchmarks/u55_partitions.py [--models timm_vit_tiny ...] [--json benchmarks/results/u55_partitions.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import numpy as np

import qlower
from qlower import zoo
from qlower.api import lower_graph

MODELS = ("timm_vit_tiny", "vit_block", "convnext_block", "mobilevit_block", "s4_attention")
IGNORED = {"quantize", "dequantize", "transpose"}   # model boundary ops, on the host on every target


def _host_ops(prog) -> dict[str, int]:
    return dict(sorted(collections.Counter(d.op.kind for d in prog.decisions if d.op.kind not in IGNORED).items()))


def _exact(prog, reference, inputs) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(prog.run(*inputs), reference.run(*inputs)))


def measure(name: str) -> dict:
    model, example, quant, calib = zoo.get(name)
    reference = qlower.compile(model, example, target="reference", quant=quant, calibration=calib[:2], progress=False)
    row: dict = {"model": name, "ir_ops": len(reference.source.ops)}
    for label, target, options in (("before", "ethos-u55-128", {"divider_free": False}),
                                   ("after", "ethos-u55-128", {}), ("u85_before", "ethos-u85-256", {"divider_free": False}),
                                   ("u85", "ethos-u85-256", {})):
        t0 = time.perf_counter()
        prog = lower_graph(reference.source, target, backend_options=options)
        row[label] = {"partitions": len(prog.partitions), "host_ops": _host_ops(prog),
                      "exact": _exact(prog, reference, example),
                      "npu_cycles": sum(p.payload.meta["perf"]["npu_cycles"] for p in prog.partitions),
                      "lower_seconds": round(time.perf_counter() - t0, 1)}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "u55_partitions.json")
    args = ap.parse_args()
    rows = []
    print(f"{'model':16s} {'IR ops':>6s} {'U55 before':>10s} {'U55 after':>9s} {'U85 before':>10s} {'U85 after':>9s} "
          f"{'U85 cycles before':>17s} {'after':>9s}  exact  host ops after (before)")
    for name in args.models:
        r = measure(name)
        rows.append(r)
        b, a, ub, u = r["before"], r["after"], r["u85_before"], r["u85"]
        host = ", ".join(f"{k} {n}" for k, n in a["host_ops"].items()) or "-"
        was = ", ".join(f"{k} {n}" for k, n in b["host_ops"].items()) or "-"
        exact = "yes" if b["exact"] and a["exact"] and ub["exact"] and u["exact"] else "NO"
        print(f"{name:16s} {r['ir_ops']:>6d} {b['partitions']:>10d} {a['partitions']:>9d} {ub['partitions']:>10d} "
              f"{u['partitions']:>9d} {ub['npu_cycles']:>17,d} {u['npu_cycles']:>9,d}  {exact:5s}  {host} ({was})",
              flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
