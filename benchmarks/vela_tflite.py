"""Vela cross-check: qlower's exported .tflite through Vela's TFLite front end, next to qlower's TOSA route.

For each model, the program compiled for ``litert`` is exported (``prog.export(format="tflite")``)
and compiled by Vela 5.2's TFLite reader (``regor.compile(..., "TFLITE", ...)``) for each
accelerator, with the same system config and memory mode as qlower's Ethos-U backend uses by
default; the same model compiled by qlower for that accelerator (its TOSA route) gives the other
column. Vela's TFLite compile runs in a child process: its native code can crash on a model (it
does on int64 arithmetic, which its operator checks accept for the NPU), and a crash is a row
of the table, not the end of the benchmark.

    python benchmarks/vela_tflite.py [--size 224] [--models mobilenet_v2 resnet18 tiny_cnn ds_cnn_kws]
                                     [--accelerators ethos-u85-256 ethos-u55-128]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import qlower
from qlower import zoo

CHILD = r"""
import json, sys
from ethosu import regor
from qlower.backends.ethosu.vela import vela_config, capture_fds
buf = open(sys.argv[1], "rb").read()
c = vela_config(sys.argv[2])
options = c.options().replace("output_format=Raw", "output_format=TFLite")
cm, exc, log = capture_fds(lambda: regor.compile(c.arch, buf, "TFLITE", c.sysconfig(), options=options, verbose=False))
if exc is not None or cm is None:
    print(json.dumps({"error": str(exc or log.strip().splitlines()[-1:])[:300]}))
else:
    pr = cm.perf_report
    cpu_ops = sorted({line.split("operator: ")[1].split(",")[0] for line in log.splitlines() if "operator: " in line})
    print(json.dumps({"npu_cycles": int(pr.npuCycles), "total_cycles": int(pr.totalCycles), "npu_ops": int(pr.npuOps),
                      "cpu_op_types": cpu_ops}))
"""


def vela_tflite(model: bytes, accelerator: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".tflite") as f:
        f.write(model)
        f.flush()
        try:
            r = subprocess.run([sys.executable, "-c", CHILD, f.name, accelerator], capture_output=True, text=True,
                               timeout=900)
        except subprocess.TimeoutExpired:
            return {"error": "Vela did not finish in 900 s"}
    if r.returncode != 0:
        how = f"signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
        return {"error": f"Vela's process died ({how})"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def tosa_route(model, example, cfg, calibration, accelerator: str) -> dict:
    prog = qlower.compile(model, example, target=accelerator, quant=cfg, calibration=calibration, progress=False)
    npu = sum(p.payload.meta.get("perf", {}).get("npu_cycles", 0) for p in prog.partitions)
    total = sum(p.payload.meta.get("perf", {}).get("total_cycles", 0) for p in prog.partitions)
    return {"npu_cycles": npu, "total_cycles": total, "partitions": len(prog.partitions),
            "host_ops": sum(op.kind not in ("constant", "delegate") for op in prog.graph.ops)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--models", nargs="*", default=["mobilenet_v2", "resnet18", "tiny_cnn", "ds_cnn_kws"])
    ap.add_argument("--accelerators", nargs="*", default=["ethos-u85-256", "ethos-u55-128"])
    ap.add_argument("--json", default="benchmarks/results/vela_tflite.json")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    t0 = time.perf_counter()
    for name in args.models:
        size = args.size if zoo.default_size(name) else None
        model, example, cfg, calibration = zoo.get(name, size=size)
        prog = qlower.compile(model, example, target="litert", quant=cfg, calibration=calibration, progress=False)
        with tempfile.TemporaryDirectory() as d:
            tflite = Path(prog.export(Path(d) / f"{name}.tflite", format="tflite")).read_bytes()
        for acc in args.accelerators:
            row = {"model": name, "size": size, "accelerator": acc, "tflite_bytes": len(tflite),
                   "vela_tflite": vela_tflite(tflite, acc), "qlower_tosa": tosa_route(model, example, cfg, calibration, acc)}
            rows.append(row)
            v, q = row["vela_tflite"], row["qlower_tosa"]
            vela = (f"{v['npu_cycles']:>11,d} {v['total_cycles']:>11,d}" if "error" not in v
                    else f"{'failed: ' + v['error']:>23s}")
            print(f"{name:14s} {acc:14s} vela(.tflite) npu/total {vela}   qlower TOSA npu/total "
                  f"{q['npu_cycles']:>11,d} {q['total_cycles']:>11,d}", flush=True)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"size": args.size, "seconds": round(time.perf_counter() - t0, 1), "rows": rows},
                              indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
