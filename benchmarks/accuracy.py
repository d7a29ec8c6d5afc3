"""What quantization costs, and what each method of qlower's wins back, on the trained zoo models and digits-hard.

Per trained zoo model (``zoo.trained_names()``), on the ``digits-hard`` held-out split (the digits under a
fixed seeded distortion, noise and occlusion, where fp32 is off the ceiling): fp32 top-1, then per
quantization method the quantized model's (PyTorch fake-quant, what every target computes up to the
importer's one step) top-1, top-1 agreement with fp32, output SQNR (dB) and the compile time (``qlower.compile``
to the reference target, calibration included). Methods: int8 per-channel and per-tensor weights x
each activation observer (minmax, histogram, percentile, mse), mse weights, + equalization and bias
correction, + SmoothQuant (ViT), A16W8, and QAT (``qlower.prepare_qat``, a few epochs from the
trained weights, per-tensor weights) where it exists.

``--calibration-speed``: calibration seconds of each observer on MobileNetV2 at 224 (random weights,
the zoo's calibration batches), against min/max (goal: histogram / mse at most 2x).

    python benchmarks/accuracy.py [--models digits_cnn ...] [--limit N] [--no-qat] [--calibration-speed]

Output: benchmarks/results/accuracy.json (and accuracy_calibration.json).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F

import qlower
from qlower import QuantConfig, zoo
from qlower.verification.accuracy import float_outputs, quantization_quality
from qlower.zoo import trained

HERE = Path(__file__).resolve().parent
OBSERVERS = ["minmax", "histogram", "percentile", "mse"]
QAT_EPOCHS, QAT_LR, QAT_BATCH = 2, 1e-4, 32


def methods(name: str) -> list[tuple[str, QuantConfig]]:
    rows = []
    for per_channel, label in ((True, "per-channel"), (False, "per-tensor")):
        base = QuantConfig(per_channel=per_channel)
        rows += [(f"{label} {obs}", replace(base, observer=obs)) for obs in OBSERVERS]
        rows.append((f"{label} mse, mse weights", replace(base, observer="mse", weight_observer="mse")))
        rows.append((f"{label} minmax +eq+bc", replace(base, equalize=True, bias_correction=True)))
        rows.append((f"{label} mse +eq+bc", replace(base, observer="mse", equalize=True, bias_correction=True)))
    if name == "timm_vit_tiny":
        rows += [("per-channel minmax +smooth 0.5", QuantConfig(smooth=0.5)),
                 ("per-tensor minmax +smooth 0.5", QuantConfig(per_channel=False, smooth=0.5))]
    rows.append(("A16W8 per-channel", QuantConfig(act_dtype="int16")))
    return rows


def _row(label: str, quality, seconds: float, error: str = "") -> dict:
    return {"method": label, **({} if quality is None else asdict(quality)), "compile_s": round(seconds, 2),
            **({"error": error} if error else {})}


def qat_row(name: str, model, example, calibration, data, reference, limit) -> dict | None:
    """The QAT hook: per-tensor weights trained ``QAT_EPOCHS`` epochs from the trained weights."""
    if not hasattr(qlower, "prepare_qat"):
        return None
    label = "per-tensor QAT"
    t0 = time.perf_counter()
    try:
        quant = QuantConfig(per_channel=False)
        qat = qlower.prepare_qat(model, example, quant, calibration)
        if name == "digits_cnn":
            x_train, y_train, _, _ = zoo.digits.dataset()
        else:
            x_train, y_train, _, _ = trained.dataset()
        opt = torch.optim.Adam(qat.parameters(), lr=QAT_LR)
        g = torch.Generator().manual_seed(28)
        qat.train()
        for _ in range(QAT_EPOCHS):
            order = torch.randperm(len(y_train), generator=g)
            for start in range(0, len(order), QAT_BATCH):
                index = order[start:start + QAT_BATCH]
                opt.zero_grad()
                F.cross_entropy(qat(x_train[index]), y_train[index]).backward()
                opt.step()
        qat.eval()
        prog = qlower.compile(qat, example, target="reference", progress=False)
        quality = quantization_quality(model, prog.frontend.fake_quant, data, limit=limit, reference=reference)
        return _row(label, quality, time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001  (a benchmark row reports its failure and the table goes on)
        return _row(label, None, time.perf_counter() - t0, f"{type(e).__name__}: {str(e)[:300]}")


def measure(name: str, limit: int | None, qat: bool) -> dict:
    model, example, _, calibration = zoo.get(name, trained=True)
    data = trained.held_out(name, "digits-hard")
    reference = float_outputs(model, data)
    rows = []
    for label, quant in methods(name):
        t0 = time.perf_counter()
        try:
            prog = qlower.compile(model, example, target="reference", quant=quant, calibration=calibration,
                                  progress=False)
            seconds = time.perf_counter() - t0
            rows.append(_row(label, quantization_quality(model, prog.frontend.fake_quant, data, limit=limit,
                                                         reference=reference), seconds))
        except Exception as e:  # noqa: BLE001
            rows.append(_row(label, None, time.perf_counter() - t0, f"{type(e).__name__}: {str(e)[:300]}"))
        print(f"  {name}: {_line(rows[-1])}", flush=True)
    if qat:
        row = qat_row(name, model, example, calibration, data, reference, limit)
        if row is not None:
            rows.append(row)
            print(f"  {name}: {_line(row)}", flush=True)
    count = len(data.labels) if limit is None else min(limit, len(data.labels))
    fp32 = float((reference[:count].argmax(1) == data.labels[:count].numpy()).mean())
    return {"model": name, "images": count, "fp32": fp32, "rows": rows}


def _line(row: dict) -> str:
    if "error" in row:
        return f"{row['method']:34s} failed: {row['error'][:100]}"
    return (f"{row['method']:34s} {100 * row['quantized']:6.2f}% {100 * row['agreement']:6.2f}% "
            f"{row['sqnr_db']:7.2f} {row['compile_s']:7.1f}")


def table(results: list[dict]) -> str:
    lines = []
    for r in results:
        lines.append(f"{r['model']} on digits-hard ({r['images']} images): fp32 {100 * r['fp32']:.2f}%")
        lines.append(f"  {'method':34s} {'top-1':>7s} {'agree':>7s} {'SQNR dB':>7s} {'compile s':>9s}")
        lines += [f"  {_line(row)}" for row in r["rows"]]
    return "\n".join(lines)


def calibration_speed(repeats: int = 2) -> dict:
    """Seconds of the calibrate stage per observer, MobileNetV2 at 224 (the best of ``repeats``)."""
    from qlower.frontend.capture import capture

    model, example, _, calibration = zoo.get("mobilenet_v2")
    out = {"model": "mobilenet_v2", "size": 224, "batches": len(calibration), "calibrate_s": {}}
    for obs in OBSERVERS:
        best = float("inf")
        for _ in range(repeats):
            captured = capture(model, example, QuantConfig(observer=obs), calibration, progress=False)
            best = min(best, captured.seconds["calibrate"])
        out["calibrate_s"][obs] = round(best, 3)
        print(f"  calibrate {obs:10s} {best:7.3f} s ({best / out['calibrate_s']['minmax']:.2f}x min/max)", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=trained.names())
    parser.add_argument("--limit", type=int, default=None, help="held-out images per model (default: all)")
    parser.add_argument("--no-qat", action="store_true")
    parser.add_argument("--calibration-speed", action="store_true")
    parser.add_argument("--out", default=str(HERE / "results" / "accuracy.json"))
    args = parser.parse_args()
    (HERE / "results").mkdir(exist_ok=True)
    if args.calibration_speed:
        speed = calibration_speed()
        (HERE / "results" / "accuracy_calibration.json").write_text(json.dumps(speed, indent=2))
        return
    results = [measure(name, args.limit, not args.no_qat) for name in args.models]
    print(table(results))
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
