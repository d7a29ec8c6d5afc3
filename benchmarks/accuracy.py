"""What quantization costs, and what each method of qlower's wins back, on the trained zoo models and digits-hard.

Per trained zoo model (``zoo.trained_names()``; every one at its trained size: digits_cnn 8x8, the others
3x32x32), on the ``digits-hard`` held-out split (the digits under a fixed seeded distortion, noise and
occlusion, where fp32 is off the ceiling): fp32 top-1, then per quantization method the quantized model's
(PyTorch fake-quant, what every target computes up to the importer's one step) top-1, top-1 agreement with
fp32, output SQNR (dB) and the compile time (``qlower.compile`` to the reference target, calibration
included). Methods: int8 per-channel and per-tensor weights x each activation observer (minmax, histogram,
percentile, mse), mse weights, + equalization and bias correction, + SmoothQuant (ViT), A16W8, QAT
(``qlower.prepare_qat``, ``QAT_EPOCHS`` epochs from the trained weights); and the lossy settings where
quantization visibly costs accuracy on these small models: 4-bit weights (``weight_qmin=-7, weight_qmax=7``,
still int8 codes, so every target runs them exactly) per tensor and per channel, with min/max, + equalization
and bias correction, and QAT.

Resumable: each row is written to the JSON file as it finishes, and a new run skips the rows the file
holds (``--redo`` re-measures the rows whose method contains one of the given words; failed rows are
always re-measured).

``--calibration-speed``: calibration seconds of each observer on MobileNetV2 at 224 (random weights,
the zoo's calibration batches), against min/max (goal: histogram / mse at most 2x).

    python benchmarks/accuracy.py [--models digits_cnn ...] [--methods 'per-tensor minmax' ...] [--limit N] [--no-qat]
                                  [--redo WORD ...] [--calibration-speed]

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
from qlower.frontend.qat import freeze_ranges
from qlower.verification.accuracy import float_outputs, quantization_quality
from qlower.zoo import trained
from qlower.zoo.training import shift

HERE = Path(__file__).resolve().parent
OBSERVERS = ["minmax", "histogram", "percentile", "mse"]
QAT_EPOCHS, QAT_LR, QAT_BATCH = 3, 1e-4, 64
W4 = {"weight_qmin": -7, "weight_qmax": 7}  # 4-bit weights in int8 codes


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
    for per_channel, label in ((False, "W4 per-tensor"), (True, "W4 per-channel")):
        base = QuantConfig(per_channel=per_channel, **W4)
        rows += [(f"{label} minmax", base), (f"{label} mse weights", replace(base, weight_observer="mse")),
                 (f"{label} minmax +eq+bc", replace(base, equalize=True, bias_correction=True))]
    return rows


QAT_METHODS = [("per-tensor QAT", QuantConfig(per_channel=False)),
               ("W4 per-tensor QAT", QuantConfig(per_channel=False, **W4))]


def _row(label: str, quality, seconds: float, error: str = "") -> dict:
    return {"method": label, **({} if quality is None else asdict(quality)), "compile_s": round(seconds, 2),
            **({"error": error} if error else {})}


def qat_model(name: str, model, example, quant: QuantConfig, calibration, epochs: int = QAT_EPOCHS,
              lr: float = QAT_LR, seed: int = 28):
    """``model`` fine-tuned ``epochs`` epochs with ``qlower.prepare_qat(quant)`` on its training digits
    (Adam at ``lr``, the recipe's shift augmentation, ranges frozen for the last epoch); in eval mode."""
    qat = qlower.prepare_qat(model, example, quant, calibration)
    x_train, y_train, _, _ = zoo.digits.dataset() if name == "digits_cnn" else trained.dataset()
    opt = torch.optim.Adam(qat.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    qat.train()
    for epoch in range(epochs):
        if epoch == epochs - 1 and epochs > 1:
            freeze_ranges(qat)
        order = torch.randperm(len(y_train), generator=g)
        for start in range(0, len(order), QAT_BATCH):
            index = order[start:start + QAT_BATCH]
            opt.zero_grad()
            x = shift(x_train[index], 0 if name == "digits_cnn" else 2, g)
            F.cross_entropy(qat(x), y_train[index]).backward()
            opt.step()
    return qat.eval()


def measure(name: str, limit: int | None, qat: bool, results: dict, save, words: list[str] | None = None,
            redo: list[str] | None = None) -> dict:
    """Model ``name``'s rows into ``results[name]`` (rows it holds without an error are kept, unless their
    method contains a word of ``redo``), calling ``save()`` after each new row."""
    model, example, _, calibration = zoo.get(name, trained=True)
    data = trained.held_out(name, "digits-hard")
    reference = float_outputs(model, data)
    count = len(data.labels) if limit is None else min(limit, len(data.labels))
    fp32 = float((reference[:count].argmax(1) == data.labels[:count].numpy()).mean())
    weights = (zoo.digits.cache_path() if name == "digits_cnn" else trained.cache_path(name)).name
    entry = results.setdefault(name, {"model": name, "rows": []})
    if (entry.get("images"), entry.get("weights")) != (count, weights):
        entry["rows"] = []  # measured on other images or other trained weights: not comparable
    entry.update(images=count, weights=weights, fp32=fp32, size=list(example[0].shape[1:]))
    done = {r["method"]: r for r in entry["rows"]
            if "error" not in r and not any(w in r["method"] for w in redo or [])}
    todo = methods(name) + (QAT_METHODS if qat else [])
    for label, quant in todo:
        if words and label not in words:
            continue
        if label in done:
            print(f"  {name}: {_line(done[label])}  (kept)", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            source = (qat_model(name, model, example, quant, calibration) if label.endswith("QAT") else model)
            prog = qlower.compile(source, example, target="reference", quant=None if source is not model else quant,
                                  calibration=None if source is not model else calibration, progress=False)
            seconds = time.perf_counter() - t0
            row = _row(label, quantization_quality(model, prog.frontend.fake_quant, data, limit=limit,
                                                   reference=reference), seconds)
        except Exception as e:  # noqa: BLE001  (a benchmark row reports its failure and the table goes on)
            row = _row(label, None, time.perf_counter() - t0, f"{type(e).__name__}: {str(e)[:300]}")
        entry["rows"] = [r for r in entry["rows"] if r["method"] != label] + [row]
        save()
        print(f"  {name}: {_line(row)}", flush=True)
    order = {label: i for i, (label, _) in enumerate(methods(name) + QAT_METHODS)}
    entry["rows"].sort(key=lambda r: order.get(r["method"], len(order)))
    save()
    return entry


def _line(row: dict) -> str:
    if "error" in row:
        return f"{row['method']:34s} failed: {row['error'][:100]}"
    return (f"{row['method']:34s} {100 * row['quantized']:6.2f}% {100 * row['agreement']:6.2f}% "
            f"{row['sqnr_db']:7.2f} {row['compile_s']:7.1f}")


def table(results: list[dict]) -> str:
    lines = []
    for r in results:
        size = "x".join(map(str, r.get("size", [])))
        lines.append(f"{r['model']} ({size}) on digits-hard ({r['images']} images): fp32 {100 * r['fp32']:.2f}%")
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
    parser.add_argument("--methods", nargs="+", default=None, help="only these methods (their names in the table)")
    parser.add_argument("--redo", nargs="+", default=None, help="re-measure kept rows whose method contains one")
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
    out = Path(args.out)
    results = {r["model"]: r for r in json.loads(out.read_text())} if out.exists() else {}

    def save() -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(list(results.values()), indent=2))
        tmp.replace(out)

    for name in args.models:
        measure(name, args.limit, not args.no_qat, results, save, args.methods, args.redo)
    print(table([results[name] for name in args.models]))


if __name__ == "__main__":
    main()
