"""What quantization costs, and what each method of qlower's wins back, on the trained zoo models and digits-hard.

Per trained zoo model (``zoo.trained_names()``; every one at its trained size: digits_cnn 8x8, the others
3x32x32), on the ``digits-hard`` held-out split (the digits under a fixed seeded distortion, noise and
occlusion, where fp32 is off the ceiling): fp32 top-1, then per quantization method the quantized model's
(PyTorch fake-quant, what every target computes up to the importer's one step) top-1, top-1 agreement with
fp32, output SQNR (dB) and the compile time (``qlower.compile`` to the reference target, calibration
included). Methods: int8 per-channel and per-tensor weights x each activation observer (minmax, histogram,
percentile, mse), mse weights, + equalization and bias correction, + SmoothQuant (ViT), A16W8, QAT
(``qlower.prepare_qat`` from the trained weights, benchmarks/qat.py's fine-tuning recipe and its steps per case:
``qat.case_recipe``); and the lossy settings where
quantization visibly costs accuracy on these small models: 4-bit weights (``weight_qmin=-7, weight_qmax=7``,
still int8 codes, so every target runs them exactly) per tensor and per channel, with min/max, + equalization
and bias correction, and QAT.

Calibration: the zoo's calibration images (training images, never held out) under the digits-hard
distortion drawn from its own seed (``CALIBRATION_SEED``, not one of the held-out split's), so the
calibration data represent what the model is evaluated on. The clean training images do not: 20% of
digits-hard's input pixels lie outside their [-1, 1] (noise reaches +-1.5), and the input quantization
clipped them — on MobileNetV2 that clip alone cost more than int8 itself (per-channel minmax 87.08%
against fp32 88.47%, 93.5% agreement, 16.6 dB; calibrated on distorted training images 88.75%, 99.4%,
23.7 dB). ``--clean-calibration`` measures the old way.

Resumable: each row is written to the JSON file as it finishes, and a new run skips the rows the file
holds (``--redo`` re-measures the rows whose method contains one of the given words; failed rows are
always re-measured).

Calibration cost per observer (MobileNetV2 at 224): benchmarks/calibration_speed.py.

    python benchmarks/accuracy.py [--models digits_cnn ...] [--methods 'per-tensor minmax' ...] [--limit N] [--copies K] [--no-qat]
                                  [--redo WORD ...] [--quantize-only] [--clean-calibration]

``--quantize-only``: quantize with the frontend alone (what every row's numbers are measured on: the
fake-quant model) instead of compiling to the reference target; the time column is then quantization
(export, rewrites, calibration, convert), not the whole compile.

Output: benchmarks/results/accuracy.json.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from qat import CONFIGS, W4, Recipe, case_recipe, finetune  # benchmarks/qat.py

import qlower
from qlower import QuantConfig, zoo
from qlower.frontend.capture import capture
from qlower.verification.accuracy import float_outputs, quantization_quality
from qlower.zoo import digits, trained

HERE = Path(__file__).resolve().parent
OBSERVERS = ["minmax", "histogram", "percentile", "mse"]
CALIBRATION_SEED = 28_000  # the calibration images' distortion (the held-out split's are HARD_SEED + k)


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


QAT_METHODS = {"per-tensor QAT": "per_tensor", "W4 per-tensor QAT": "w4_per_tensor"}  # row -> qat.py's config


def qat_methods(name: str) -> list[tuple[str, QuantConfig, Recipe]]:
    """The QAT rows: qat.py's config and its recipe for ``name`` (the case's steps, e.g. 300 for MobileNetV2 W4)."""
    return [(label, CONFIGS[config], case_recipe(name, config)) for label, config in QAT_METHODS.items()]


def _row(label: str, quality, seconds: float, error: str = "", cpu: float | None = None,
         quantize_only: bool = False, recipe: Recipe | None = None) -> dict:
    """One table row; ``compile_s`` / ``compile_cpu_s`` time ``timed``: the whole compile to the reference target
    or (``--quantize-only``) the frontend's quantization alone; a QAT row's include its fine-tuning (``recipe``)."""
    return {"method": label, **({} if quality is None else asdict(quality)), "compile_s": round(seconds, 2),
            **({} if cpu is None else {"compile_cpu_s": round(cpu, 2)}),
            "timed": "quantize" if quantize_only else "compile", **({"error": error} if error else {}),
            **({} if recipe is None else {"recipe": asdict(recipe)})}


def qat_model(name: str, model, quant: QuantConfig, calibration, recipe: Recipe):
    """``model`` fine-tuned by benchmarks/qat.py's ``finetune`` (one QAT recipe for both benchmarks:
    ``qlower.prepare_qat`` with ranges initialised on ``calibration``, learned weight scales, batch norms
    frozen early, training digits under the digits-hard distortion, the case's steps); in eval mode."""
    return finetune(name, quant, recipe, show=False, model=model, calibration=calibration)[0]


def hard_calibration(calibration: list[tuple]) -> list[tuple]:
    """The calibration images under the digits-hard distortion, drawn from ``CALIBRATION_SEED``."""
    x = digits.distort(torch.cat([b[0] for b in calibration]), CALIBRATION_SEED)
    return [(x[i:i + 1],) for i in range(len(x))]


def quantized_model(source, example, quant: QuantConfig | None, calibration, quantize_only: bool):
    """The fake-quant model every row is measured on: compiled to the reference target, or (``quantize_only``)
    from the frontend's capture alone."""
    if quantize_only:
        return capture(source, example, quant, calibration, progress=False).graph_module
    if quant is None:  # a QAT model: compiled with the scales it learned (quant=None would mean float)
        return qlower.compile(source, example, target="reference", progress=False).frontend.fake_quant
    return qlower.compile(source, example, target="reference", quant=quant, calibration=calibration,
                          progress=False).frontend.fake_quant


def measure(name: str, limit: int | None, qat: bool, results: dict, save, words: list[str] | None = None,
            redo: list[str] | None = None, clean: bool = False, quantize_only: bool = False,
            copies: int = zoo.digits.HARD_COPIES) -> dict:
    """Model ``name``'s rows into ``results[name]`` (rows it holds without an error are kept, unless their
    method contains a word of ``redo``), calling ``save()`` after each new row."""
    model, example, _, calibration = zoo.get(name, trained=True)
    calibration = calibration if clean else hard_calibration(calibration)
    data = trained.held_out(name, "digits-hard")
    if copies != zoo.digits.HARD_COPIES:  # a larger split (the first copies are the standard one) to resolve small gaps
        clean_split = trained.held_out(name, "digits")
        x, y = zoo.digits.hard_split(clean_split.inputs[0], clean_split.labels, copies)
        data = trained.LabelledData((x,), y)
    reference = float_outputs(model, data)
    count = len(data.labels) if limit is None else min(limit, len(data.labels))
    fp32 = float((reference[:count].argmax(1) == data.labels[:count].numpy()).mean())
    weights = (zoo.digits.cache_path() if name == "digits_cnn" else trained.cache_path(name)).name
    entry = results.setdefault(name, {"model": name, "rows": []})
    how = "clean" if clean else f"digits-hard seed {CALIBRATION_SEED}"
    if (entry.get("images"), entry.get("weights"), entry.get("calibration")) != (count, weights, how):
        entry["rows"] = []  # measured on other images, weights or calibration: not comparable
    entry.update(images=count, weights=weights, calibration=how, fp32=fp32, size=list(example[0].shape[1:]))
    done = {r["method"]: r for r in entry["rows"]
            if "error" not in r and not any(w in r["method"] for w in redo or [])}
    todo = [(label, quant, None) for label, quant in methods(name)] + (qat_methods(name) if qat else [])
    for label, quant, recipe in todo:
        if words and label not in words:
            continue
        kept = done.get(label)  # (a QAT row measured with another recipe is measured again)
        if kept is not None and (recipe is None or kept.get("recipe") == asdict(recipe)):
            print(f"  {name}: {_line(kept)}  (kept)", flush=True)
            continue
        t0, cpu0 = time.perf_counter(), time.process_time()
        try:
            source = qat_model(name, model, quant, calibration, recipe) if recipe is not None else model
            # a QAT model is compiled as given (pt2e_input), never re-captured: --quantize-only is for PTQ rows
            quick = quantize_only and source is model
            fake_quant = quantized_model(source, example, None if source is not model else quant,
                                         None if source is not model else calibration, quick)
            seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            row = _row(label, quantization_quality(model, fake_quant, data, limit=limit, reference=reference),
                       seconds, cpu=cpu, quantize_only=quick, recipe=recipe)
        except Exception as e:  # noqa: BLE001  (a benchmark row reports its failure and the table goes on)
            row = _row(label, None, time.perf_counter() - t0, f"{type(e).__name__}: {str(e)[:300]}", recipe=recipe)
        entry["rows"] = [r for r in entry["rows"] if r["method"] != label] + [row]
        save()
        print(f"  {name}: {_line(row)}", flush=True)
    order = {label: i for i, label in enumerate([label for label, _ in methods(name)] + list(QAT_METHODS))}
    entry["rows"].sort(key=lambda r: order.get(r["method"], len(order)))
    save()
    return entry


def _line(row: dict) -> str:
    if "error" in row:
        return f"{row['method']:34s} failed: {row['error'][:100]}"
    cpu = f"{row['compile_cpu_s']:7.1f}" if "compile_cpu_s" in row else f"{'':7s}"
    return (f"{row['method']:34s} {100 * row['quantized']:6.2f}% {100 * row['agreement']:6.2f}% "
            f"{row['sqnr_db']:7.2f} {row['compile_s']:7.1f} {cpu} {row.get('timed', '')}"
            + (f" (fine-tuning included, {row['recipe']['steps']} steps)" if "recipe" in row else ""))


def table(results: list[dict]) -> str:
    lines = []
    for r in results:
        size = "x".join(map(str, r.get("size", [])))
        lines.append(f"{r['model']} ({size}) on digits-hard ({r['images']} images, calibrated on "
                     f"{r.get('calibration', 'clean')}): fp32 {100 * r['fp32']:.2f}%")
        lines.append(f"  {'method':34s} {'top-1':>7s} {'agree':>7s} {'SQNR dB':>7s} {'wall s':>7s} {'CPU s':>7s} timed")
        lines += [f"  {_line(row)}" for row in r["rows"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=trained.names())
    parser.add_argument("--methods", nargs="+", default=None, help="only these methods (their names in the table)")
    parser.add_argument("--redo", nargs="+", default=None, help="re-measure kept rows whose method contains one")
    parser.add_argument("--limit", type=int, default=None, help="held-out images per model (default: all)")
    parser.add_argument("--copies", type=int, default=zoo.digits.HARD_COPIES,
                        help="distorted copies of each held-out digit (default: digits-hard's; more resolve small gaps)")
    parser.add_argument("--no-qat", action="store_true")
    parser.add_argument("--clean-calibration", action="store_true",
                        help="calibrate on the clean training images (not representative of digits-hard)")
    parser.add_argument("--quantize-only", action="store_true",
                        help="quantize with the frontend only (no compile to the reference target)")
    parser.add_argument("--out", default=str(HERE / "results" / "accuracy.json"))
    args = parser.parse_args()
    (HERE / "results").mkdir(exist_ok=True)
    out = Path(args.out)
    results = {r["model"]: r for r in json.loads(out.read_text())} if out.exists() else {}

    def save() -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(list(results.values()), indent=2))
        tmp.replace(out)

    for name in args.models:
        measure(name, args.limit, not args.no_qat, results, save, args.methods, args.redo, args.clean_calibration,
                args.quantize_only, args.copies)
    print(table([results[name] for name in args.models]))


if __name__ == "__main__":
    main()
