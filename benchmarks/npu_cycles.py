"""Ethos-U cycles: Vela's NPU and total cycle estimates per model and memory configuration.

Total cycles are what the device spends (NPU work plus memory-bound time); NPU cycles are
the compute part. Each model is compiled at its zoo default size (so the figures compare
with other Ethos-U stacks on the same networks) for ethos-u85-256 in Sram_Only and
Dedicated_Sram_384KB and for ethos-u55-128 in Shared_Sram, with Vela's default system
configuration of each family. The peer column holds ExecuTorch 1.5.1's totals measured
for issue 16 on the same weights and Vela (MobileNetV2 and ResNet-18 only). "unwidened" is the
total of the same program compiled with ``widen_channels=False`` (no zero channels, see
qlower/backends/ethosu/channels.py); "widened" lists the runs that got them.

    python benchmarks/npu_cycles.py [--models mobilenet_v2 resnet18] [--json benchmarks/results/npu_cycles.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import qlower
from qlower import zoo
from qlower.api import lower_graph

CONFIGS = (("ethos-u85-256", "Sram_Only"), ("ethos-u85-256", "Dedicated_Sram_384KB"),
           ("ethos-u55-128", "Shared_Sram"))
MODELS = ("mobilenet_v2", "resnet18", "mobilenet_v3_small", "efficientnet_lite", "ds_cnn_kws", "convnext_block",
          "mobilevit_block", "timm_vit_tiny", "unet_tiny", "lstm_kws")
# total cycles of ExecuTorch 1.5.1's Ethos-U flow, from issue 16's table
PEER_TOTAL = {
    ("mobilenet_v2", "ethos-u85-256", "Sram_Only"): 3_601_723,
    ("mobilenet_v2", "ethos-u85-256", "Dedicated_Sram_384KB"): 5_349_488,
    ("mobilenet_v2", "ethos-u55-128", "Shared_Sram"): 7_767_416,
    ("resnet18", "ethos-u85-256", "Sram_Only"): 11_171_415,
    ("resnet18", "ethos-u55-128", "Shared_Sram"): 22_544_250,
}


def measure(name: str, target: str, memory_mode: str) -> dict:
    model, example, quant, calib = zoo.get(name)
    t0 = time.perf_counter()
    prog = qlower.compile(model, example, target=target, quant=quant, calibration=calib[:2], progress=False,
                          backend_options={"memory_mode": memory_mode})
    seconds = time.perf_counter() - t0
    perf = [p.payload.meta["perf"] for p in prog.partitions]
    plain = lower_graph(prog.source, target, backend_options={"memory_mode": memory_mode, "widen_channels": False})
    widened = {f"{p.name}:{run}": width for p in prog.partitions for run, width in p.payload.meta["widened"].items()}
    host = sorted({d.op.kind for d in prog.decisions} - {"quantize", "dequantize", "transpose", "reshape"})
    return {"model": name, "target": target, "memory_mode": memory_mode, "partitions": len(prog.partitions),
            "npu_cycles": sum(p["npu_cycles"] for p in perf), "total_cycles": sum(p["total_cycles"] for p in perf),
            "peer_total_cycles": PEER_TOTAL.get((name, target, memory_mode)), "host_ops": host,
            "unwidened_total_cycles": sum(p.payload.meta["perf"]["total_cycles"] for p in plain.partitions),
            "widened": widened, "compile_seconds": round(seconds, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "npu_cycles.json")
    args = ap.parse_args()
    rows = []
    print(f"{'model':18s} {'target':14s} {'memory mode':22s} {'NPU cycles':>12s} {'total cycles':>13s} "
          f"{'unwidened':>12s} {'peer total':>12s} {'ratio':>6s}  host ops; widened runs")
    for name in args.models:
        for target, mode in CONFIGS:
            r = measure(name, target, mode)
            rows.append(r)
            peer = r["peer_total_cycles"]
            ratio = f"{r['total_cycles'] / peer:.3f}" if peer else ""
            widened = ", ".join(f"{k}→{w}" for k, w in r["widened"].items())
            print(f"{name:18s} {target:14s} {mode:22s} {r['npu_cycles']:>12,} {r['total_cycles']:>13,} "
                  f"{r['unwidened_total_cycles']:>12,} {peer or '':>12} {ratio:>6s}  "
                  f"{', '.join(r['host_ops']) or '-'}; {widened or '-'}", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"configs": CONFIGS, "rows": rows}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
