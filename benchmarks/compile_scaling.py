"""Compile time against graph size: milliseconds per 1,000 IR ops per stage, for a model made of N
transformer blocks (N doubling), to show which stage grows faster than the graph.

The model (``blocks(n)``): a 4x4 patch convolution (1x3x16x16 -> 16 tokens of width 32), ``n`` pre-norm
transformer blocks (LayerNorm, 2-head attention with q/k/v linears, softmax, output linear, LayerNorm,
GELU MLP of width 64, residuals), a mean over the tokens and a linear head; static int8. Stages:
PT2E's export, prepare, calibrate (2 batches) and convert (capture.py times them), the import into
the IR, the default pass pipeline, and per target the backend's rewrites + op placement ("place":
``supports`` for every op, Vela's one-op compiles on Ethos-U) and the lowering of its partitions
("lower": TOSA emission, tosa-opt / Vela). A stage that is linear in the graph keeps its ms per
1,000 ops flat as N doubles.

    python benchmarks/compile_scaling.py [--sizes 1 2 4 8 16] [--targets tosa-1.0+int ethos-u55-128]
        [--json benchmarks/results/compile_scaling.json] [--profile N]

``--profile N`` prints cProfile's top functions (by cumulative and own time) for the N-block model.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time
from pathlib import Path

import torch
from torch import nn

from qlower import QuantConfig
from qlower.backends.registry import backend_for
from qlower.frontend.capture import capture
from qlower.frontend.importer import import_graph
from qlower.ir.rewrite import apply_rewrites
from qlower.partition import partition
from qlower.passes import default_pipeline

WIDTH, HEADS, TOKENS_SIDE = 32, 2, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.q, self.k, self.v, self.out = (nn.Linear(WIDTH, WIDTH) for _ in range(4))
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.norm1(x)

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.reshape(b, t, HEADS, c // HEADS).transpose(1, 2)

        q, k, v = heads(self.q(h)), heads(self.k(h)), heads(self.v(h))
        a = torch.softmax(q @ k.transpose(-1, -2) * (c // HEADS) ** -0.5, dim=-1) @ v
        x = x + self.out(a.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class Blocks(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, WIDTH, 4, stride=4)
        self.blocks = nn.Sequential(*(Block() for _ in range(n)))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        return self.head(self.blocks(x).mean(dim=1))


def blocks(n: int) -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(n)
    side = 4 * TOKENS_SIDE
    model = Blocks(n).eval()
    calibration = [(torch.randn(1, 3, side, side),) for _ in range(2)]
    return model, calibration[0], calibration


def measure(n: int, targets: list[str]) -> dict:
    model, example, calibration = blocks(n)
    seconds: dict[str, float] = {}
    captured = capture(model, example, QuantConfig(), calibration, progress=False)
    seconds.update(captured.seconds)
    t0 = time.perf_counter()
    graph = import_graph(captured.graph_module, name="blocks").graph
    seconds["import"] = time.perf_counter() - t0
    imported_ops = len(graph.ops)
    t0 = time.perf_counter()
    graph = default_pipeline().run(graph)
    seconds["passes"] = time.perf_counter() - t0
    partitions = {}
    for target in targets:
        backend = backend_for(target, {})
        lowering = 0.0

        def timed_lower(*args, plain_lower=backend.lower, **kwargs):
            nonlocal lowering
            t = time.perf_counter()
            try:
                return plain_lower(*args, **kwargs)
            finally:
                lowering += time.perf_counter() - t

        backend.lower = timed_lower
        t0 = time.perf_counter()
        form, _ = apply_rewrites(graph, backend.rewrites(target))
        result = partition(form, backend, target)
        total = time.perf_counter() - t0
        seconds[f"{target} place"] = total - lowering
        seconds[f"{target} lower"] = lowering
        partitions[target] = len(result.partitions)
    ops = len(graph.ops)
    return {"blocks": n, "imported_ops": imported_ops, "ir_ops": ops, "partitions": partitions,
            "seconds": {k: round(v, 4) for k, v in seconds.items()},
            "ms_per_1000_ops": {k: round(1e6 * v / ops, 1) for k, v in seconds.items()}}


def profile(n: int, targets: list[str], top: int = 30) -> None:
    prof = cProfile.Profile()
    prof.enable()
    measure(n, targets)
    prof.disable()
    stats = pstats.Stats(prof).strip_dirs()
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    ap.add_argument("--targets", nargs="+", default=["tosa-1.0+int", "ethos-u55-128"])
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "compile_scaling.json")
    ap.add_argument("--profile", type=int, default=None, metavar="N")
    args = ap.parse_args()
    if args.profile is not None:
        profile(args.profile, args.targets)
        return
    measure(1, args.targets)   # warm-up: imports, Vela's verdict cache for the ops every size has
    rows = []
    for n in args.sizes:
        r = measure(n, args.targets)
        rows.append(r)
        if len(rows) == 1:
            print(f"{'blocks':>6s} {'IR ops':>6s}  " + "  ".join(f"{k:>24s}" for k in r["seconds"]) + "   (ms per 1,000 IR ops)")
        print(f"{n:>6d} {r['ir_ops']:>6d}  " + "  ".join(f"{v:>24,.0f}" for v in r["ms_per_1000_ops"].values()),
              flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"targets": args.targets, "load_average": os.getloadavg(), "rows": rows}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
