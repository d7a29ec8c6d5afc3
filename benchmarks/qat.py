"""Quantization-aware training against post-training quantization on the trained zoo models.

Per model and QuantConfig: fp32, PTQ (qlower.compile with min/max calibration) and QAT
(qlower.prepare_qat, a few epochs of fine-tuning on the training digits, then qlower.compile with the
learned scales): top-1 of the compiled program on zoo.held_out and its ``digits-hard`` split, epochs and
seconds. Prints a table, writes benchmarks/results/qat.json.

    .venv/bin/python benchmarks/qat.py                      # default cases
    .venv/bin/python benchmarks/qat.py --models digits_cnn --configs a4 --epochs 2 --limit 200
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import qlower
from qlower import zoo
from qlower.verification.accuracy import measure_accuracy

sys.path.insert(0, str(Path(__file__).parent))
from accuracy import qat_model  # noqa: E402  (one QAT fine-tuning for both benchmarks)

CONFIGS = {
    "per_tensor": qlower.QuantConfig(per_channel=False),
    "w4": qlower.QuantConfig(weight_qmin=-7, weight_qmax=7),
    "a4": qlower.QuantConfig(act_qmin=-8, act_qmax=7),
    "w4_per_tensor": qlower.QuantConfig(per_channel=False, weight_qmin=-7, weight_qmax=7),
}
DEFAULT = [("digits_cnn", "a4"), ("mobilenet_v2", "w4_per_tensor"), ("mobilenet_v3_small", "w4_per_tensor")]


def _splits(name: str) -> dict[str, zoo.LabelledData]:
    return {"held_out": zoo.held_out(name), "digits_hard": zoo.held_out(name, "digits-hard")}


def _top1(model, data: zoo.LabelledData) -> float:
    with torch.no_grad():
        return float((model(*data.inputs).argmax(1) == data.labels).float().mean())


def run_case(name: str, config: str, epochs: int, lr: float, limit: int | None) -> dict:
    quant = CONFIGS[config]
    zm = zoo.get(name, trained=True)
    splits = _splits(name)
    row: dict = {"model": name, "config": config, "epochs": epochs}
    for split, data in splits.items():
        row[f"fp32_{split}"] = _top1(zm.model, data)
    t0 = time.perf_counter()
    ptq = qlower.compile(zm.model, zm.example_inputs, "reference", quant, zm.calibration_batches, progress=False)
    for split, data in splits.items():
        row[f"ptq_{split}"] = measure_accuracy(ptq, data, limit=limit, progress=False).program
    row["ptq_seconds"] = round(time.perf_counter() - t0, 1)

    t0 = time.perf_counter()
    qat = qat_model(name, zm.model, zm.example_inputs, quant, zm.calibration_batches, epochs, lr, seed=2800)
    row["qat_train_seconds"] = round(time.perf_counter() - t0, 1)
    prog = qlower.compile(qat, zm.example_inputs, "reference", progress=False)
    for split, data in splits.items():
        row[f"qat_{split}"] = measure_accuracy(prog, data, limit=limit, progress=False).program
    row["qat_seconds"] = round(time.perf_counter() - t0, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", help="trained zoo models (default: the default cases)")
    parser.add_argument("--configs", nargs="*", default=None, choices=sorted(CONFIGS))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--limit", type=int, default=None, help="measure the programs on the first N images")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "qat.json"))
    args = parser.parse_args()
    cases = DEFAULT if not args.models else [(m, c) for m in args.models for c in (args.configs or ["per_tensor"])]
    rows = []
    print(f"{'model':20s} {'config':11s} {'split':12s} {'fp32':>7s} {'PTQ':>7s} {'QAT':>7s}  epochs  QAT s")
    for name, config in cases:
        row = run_case(name, config, args.epochs, args.lr, args.limit)
        rows.append(row)
        for split in [k[5:] for k in row if k.startswith("fp32_")]:
            print(f"{name:20s} {config:11s} {split:12s} {100 * row[f'fp32_{split}']:6.2f}% "
                  f"{100 * row[f'ptq_{split}']:6.2f}% {100 * row[f'qat_{split}']:6.2f}%  {args.epochs:6d} "
                  f"{row['qat_seconds']:6.1f}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"torch_threads": torch.get_num_threads(), "limit": args.limit,
                                          "lr": args.lr, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
