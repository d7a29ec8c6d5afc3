"""How fast is the reference interpreter on a MobileNetV2-shaped int8 graph?

The graph is built directly in the IR with random int8 weights (per-channel
scales, int32 biases): the real MobileNetV2 layer list at 224x224x3 — a 3x3
stride-2 conv to 32 channels, 17 inverted-residual blocks (1x1 expansion, 3x3
depthwise, 1x1 projection; an int8 residual add where the stride is 1 and the
channel count is unchanged), a 1x1 conv to 1280 channels, global average pooling
(reduce_sum + rescale) and a 1000-way fully connected layer. The graph is
verified, run once to warm up, then timed over 5 runs; the median is reported,
printed as a table and written to benchmarks/results/reference_speed.json.

BLAS runs on one thread by default (``--blas-threads 0`` keeps the library's
default): the GEMMs of a batch-1 network are small, and a multi-threaded BLAS
that spins for a core another process holds is several times slower, so one
thread gives the steadier and, measured here, no slower number.

    python benchmarks/reference_speed.py [--runs 5] [--blas-threads 1] [--out PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from qlower.ir import DType, Graph, GraphBuilder, QuantSpec, TensorType, Value, verify_graph
from qlower.reference import run_graph

# (expansion t, output channels c, repeats n, first stride s): MobileNetV2, Sandler et al. 2018, table 2
INVERTED_RESIDUAL_SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                              (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
RELU6 = QuantSpec.per_tensor(6 / 255, -128)   # zero point at the bottom of the range: ReLU6 for free
LINEAR = QuantSpec.per_tensor(0.05, 0)        # projection (no activation) and residual sums
TARGET_SECONDS = 1.0


class _Net:
    """Builds the int8 graph; every weight is random int8 with per-channel scales ~ 1/(73 sqrt(K))
    so that activations keep a useful spread of codes."""

    def __init__(self, seed: int = 0) -> None:
        self.b = GraphBuilder("mobilenet_v2")
        self.rng = np.random.default_rng(seed)
        self.n_convs = 0

    def conv(self, x: Value, out_c: int, k: int, stride: int, groups: int, out: QuantSpec) -> Value:
        in_c = x.shape[3]
        ci = in_c // groups
        fan_in = k * k * ci
        self.n_convs += 1
        name = f"conv{self.n_convs}"
        w_scale = (1.0 + 0.1 * self.rng.random(out_c)) / (73.0 * np.sqrt(fan_in))
        w = self.b.constant(self.rng.integers(-127, 128, size=(out_c, k, k, ci), dtype=np.int8),
                            QuantSpec.per_channel(w_scale, axis=0), name=name + "_w")
        acc_q = QuantSpec.accumulator(x.quant, w.quant, axis=0)
        bias = self.b.constant(self.rng.integers(-1000, 1000, size=out_c, dtype=np.int32), acc_q, name=name + "_b")
        pad = (k // 2,) * 4  # as torchvision: padding 1 for 3x3, 0 for 1x1
        acc = self.b.op("conv2d", x, w, bias, stride=(stride, stride), pad=pad, groups=groups, name=name)
        return self.b.op("rescale", acc, out=out, name=name + "_q")

    def add(self, a: Value, c: Value) -> Value:
        """int8 + int8: both to int32 at one common scale, add, back to int8."""
        common = QuantSpec.per_tensor(min(a.quant.scale[0], c.quant.scale[0]) / 2**10, 0, DType.INT32)
        a32 = self.b.op("rescale", a, out=common, name="res_a")
        c32 = self.b.op("rescale", c, out=common, name="res_b")
        s = self.b.op("add", a32, c32, name="res_add")
        return self.b.op("rescale", s, out=LINEAR, name="res_q")

    def block(self, x: Value, t: int, c: int, stride: int) -> Value:
        in_c = x.shape[3]
        h = self.conv(x, in_c * t, 1, 1, 1, RELU6) if t != 1 else x
        h = self.conv(h, h.shape[3], 3, stride, h.shape[3], RELU6)
        h = self.conv(h, c, 1, 1, 1, LINEAR)
        return self.add(x, h) if stride == 1 and in_c == c else h

    def build(self) -> Graph:
        b = self.b
        x = b.input("image", TensorType((1, 224, 224, 3), DType.INT8, QuantSpec.per_tensor(1 / 64, 0)))
        h = self.conv(x, 32, 3, 2, 1, RELU6)
        for t, c, n, s in INVERTED_RESIDUAL_SETTINGS:
            for i in range(n):
                h = self.block(h, t, c, s if i == 0 else 1)
        h = self.conv(h, 1280, 1, 1, 1, RELU6)
        # global average: codes to int32 (zero point removed), sum over H and W, divide by H*W in the rescale
        hw = h.shape[1] * h.shape[2]
        h32 = b.op("rescale", h, out=QuantSpec.per_tensor(h.quant.scale[0], 0, DType.INT32), name="gap_in")
        s = b.op("reduce_sum", b.op("reduce_sum", h32, axis=1, name="gap_h"), axis=2, name="gap_w")
        pooled = b.op("rescale", s, out=QuantSpec.per_tensor(h.quant.scale[0] * hw, -128), name="gap")
        flat = b.op("reshape", pooled, shape=(1, 1280), name="flatten")
        fc_w = b.constant(self.rng.integers(-127, 128, size=(1000, 1280), dtype=np.int8),
                          QuantSpec.per_channel(np.full(1000, 1 / (73 * np.sqrt(1280))), axis=0), name="fc_w")
        acc_q = QuantSpec.accumulator(flat.quant, fc_w.quant, axis=0)
        fc_b = b.constant(self.rng.integers(-1000, 1000, size=1000, dtype=np.int32), acc_q, name="fc_b")
        logits = b.op("rescale", b.op("fully_connected", flat, fc_w, fc_b, name="fc"),
                      out=QuantSpec.per_tensor(0.1, 0), name="logits")
        return b.build([logits])


def build_mobilenet_v2(seed: int = 0) -> Graph:
    return verify_graph(_Net(seed).build())


def macs(graph: Graph) -> int:
    """Multiply-accumulates of the convolutions and the fully connected layer."""
    total = 0
    for op in graph.ops:
        if op.kind == "conv2d":
            o = op.result.shape
            total += int(np.prod(o)) * int(np.prod(op.operands[1].shape[1:]))
        elif op.kind == "fully_connected":
            total += int(np.prod(op.result.shape)) * op.operands[1].shape[1]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--blas-threads", type=int, default=1, help="0: the BLAS library's default")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "reference_speed.json")
    args = parser.parse_args()

    t0 = time.perf_counter()
    graph = build_mobilenet_v2()
    build_s = time.perf_counter() - t0
    image = np.random.default_rng(1).integers(-128, 128, size=(1, 224, 224, 3), dtype=np.int8)

    with _blas_threads(args.blas_threads):
        run_graph(graph, [image])  # warm-up
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            (logits,) = run_graph(graph, [image])
            times.append(time.perf_counter() - t)
    median = statistics.median(times)

    counts = graph.count_ops()
    result = {
        "benchmark": "reference_speed",
        "model": "mobilenet_v2 (random int8 weights, 224x224x3)",
        "ops": len(graph.ops),
        "op_counts": counts,
        "macs": macs(graph),
        "build_and_verify_s": round(build_s, 4),
        "runs": args.runs,
        "times_s": [round(t, 4) for t in times],
        "median_s": round(median, 4),
        "target_s": TARGET_SECONDS,
        "meets_target": median <= TARGET_SECONDS,
        "output_checksum": int(logits.astype(np.int64).sum()),
        "blas_threads": args.blas_threads or "library default",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "numpy": np.__version__,
                    "load_average_1min": round(os.getloadavg()[0], 2)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    _print_table(result)
    print(f"written to {args.out}")


def _blas_threads(n: int):
    """Limit BLAS threads for the timed runs (a no-op for 0 or without threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        n = 0
    return threadpool_limits(limits=n, user_api="blas") if n else contextlib.nullcontext()


def _print_table(r: dict) -> None:
    rows = [("model", r["model"]), ("ops", f"{r['ops']} ({r['op_counts'].get('conv2d', 0)} conv2d)"),
            ("MACs", f"{r['macs'] / 1e6:.0f} M"), ("build + verify", f"{r['build_and_verify_s']:.3f} s"),
            ("runs", ", ".join(f"{t:.3f}" for t in r["times_s"])),
            ("BLAS threads", str(r["blas_threads"])),
            ("load (1 min)", f"{r['machine']['load_average_1min']:.2f} on {r['machine']['cpus']} CPUs"),
            ("median", f"{r['median_s']:.3f} s (target ≤ {r['target_s']:.1f} s: "
                       f"{'met' if r['meets_target'] else 'MISSED'})")]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for k, v in rows:
            print(f"{k:>16}  {v}")
        return
    table = Table(title="reference interpreter speed")
    table.add_column("what", style="bold")
    table.add_column("value")
    for k, v in rows:
        table.add_row(k, v)
    Console().print(table)


if __name__ == "__main__":
    main()
