"""Quantization-aware training against post-training quantization on the trained zoo models (issue 28 §4).

Per model and QuantConfig, on the ``digits-hard`` held-out split (``zoo.held_out(name, "digits-hard")``,
720 images): fp32, PTQ (``qlower.compile`` with min/max calibration on the zoo's calibration images under
the digits-hard distortion, as benchmarks/accuracy.py calibrates) and QAT (``qlower.prepare_qat`` from the
trained fp32 weights, ranges initialised on the same images, fine-tuned at the models' own 32x32, then
``qlower.compile`` with the learned scales): top-1, top-1 agreement with fp32 and output SQNR of the
compiled model's fake-quant graph (which adds the int32 biases deployment adds, so every target computes
it to within one output step), seconds.

The fine-tuning (``Recipe``, also benchmarks/accuracy.py's QAT rows): Adam at a low learning rate with a
cosine decay, batches of 32 training digits with the training recipe's 2-pixel shifts and, as the images
measured, the digits-hard distortion (affine, noise, occlusion; batch k drawn from ``TRAIN_SEED + k``, no
seed of the held-out split's or the calibration's), a fixed number of steps; the weights' scales learned
(``learn_scales="weights"``: LSQ, their log-scales at their own Adam rate ``scale_lr``); batch norms on
their running statistics after the first ``bn_freeze`` steps (``freeze_batch_norms``: the conv then trains
folded as deployed), ranges frozen for the last ``1 - range_freeze`` of the steps (``freeze_ranges``).
Two torch threads; a progress bar. A step of MobileNetV2 takes about 0.5 s on an idle machine, 5 s at
load 7 on 2 cores.

Resumable: each row is written to the JSON file as it finishes; a new run keeps the rows the file holds for
the same model, config and recipe (``--redo`` measures them again).

    .venv/bin/python benchmarks/qat.py                      # the default cases (steps: the case's, STEPS)
    .venv/bin/python benchmarks/qat.py --models mobilenet_v2 --configs w4_per_tensor --steps 200
    .venv/bin/python benchmarks/qat.py --models digits_cnn --ablation   # + fixed scales and the float control

``--ablation`` separates LSQ's gain from the data's: per case, QAT with learned weight scales (the
default), QAT with fixed observer scales (``learn_scales="none"``: the weights' min/max at each step, the
activations' moving average, same data and schedule) and fp32 fine-tuned by the same recipe.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import qlower
from qlower import zoo
from qlower.frontend.learned_scales import scale_parameters
from qlower.frontend.qat import freeze_batch_norms, freeze_ranges
from qlower.progress import progress_bar
from qlower.verification.accuracy import float_outputs, quantization_quality
from qlower.zoo import digits, trained
from qlower.zoo.training import shift

W4 = {"weight_qmin": -7, "weight_qmax": 7}  # 4-bit weights in int8 codes
CONFIGS = {
    "int8_per_channel": qlower.QuantConfig(),
    "per_tensor": qlower.QuantConfig(per_channel=False),
    "w4_per_tensor": qlower.QuantConfig(per_channel=False, **W4),
    "w4_per_channel": qlower.QuantConfig(**W4),
    "a4": qlower.QuantConfig(act_qmin=-8, act_qmax=7),
}
DEFAULT = [("mobilenet_v2", "w4_per_tensor"), ("mobilenet_v2", "int8_per_channel"),
           ("mobilenet_v3_small", "w4_per_tensor")]  # (model, config)
STEPS = {("mobilenet_v2", "w4_per_tensor"): 300}  # the cases that need more than Recipe.steps to clear fp32
OUT = Path(__file__).parent / "results" / "qat.json"


TRAIN_SEED = 29_000  # batch k of the fine-tuning is distorted with seed TRAIN_SEED + k: none is digits-hard's
# (digits.HARD_SEED + 0/1) nor the calibration's (accuracy.CALIBRATION_SEED)


@dataclass(frozen=True)
class Recipe:
    steps: int = 150
    batch: int = 32
    lr: float = 5e-4
    bn_freeze: int = 20  # steps on batch statistics before the batch norms freeze
    range_freeze: float = 0.7  # share of the steps after which the ranges freeze
    seed: int = 2800
    learn_scales: str = "weights"  # prepare_qat's: which scales are trained (LSQ)
    scale_lr: float = 1e-2  # Adam's learning rate for the log-scales (a relative change per step)
    distort: bool = True  # fine-tune on training digits under digits-hard's distortion (own seeds)


def case_recipe(name: str, config: str, **changes) -> Recipe:
    """The recipe of case (``name``, ``config``): ``Recipe`` with the case's steps (``STEPS``), then ``changes``;
    benchmarks/accuracy.py's QAT rows use it too."""
    return replace(Recipe(steps=STEPS.get((name, config), Recipe.steps)), **changes)


def hard_calibration(calibration: list[tuple]) -> list[tuple]:
    """The calibration images under the digits-hard distortion, drawn from ``CALIBRATION_SEED``: what
    accuracy.py calibrates PTQ on (imported here, as accuracy.py imports this module's fine-tuning)."""
    from accuracy import hard_calibration as hard

    return hard(calibration)


def finetune(name: str, quant: qlower.QuantConfig, recipe: Recipe, show: bool = True, model=None,
             calibration=None):
    """The trained zoo model ``name`` (or ``model``, with the zoo's example inputs) prepared for QAT with
    ``quant`` (ranges initialised on ``calibration``, default the zoo's calibration images under the
    digits-hard distortion) and fine-tuned by ``recipe``; in eval mode, with the mean training loss of
    its first and last 20 steps."""
    zoo_model, example, _, zoo_calibration = zoo.get(name, trained=True)
    calibration = calibration if calibration is not None else hard_calibration(zoo_calibration)
    qat = qlower.prepare_qat(model if model is not None else zoo_model, example, quant, calibration,
                             learn_scales=recipe.learn_scales)
    scales = scale_parameters(qat)
    weights = [p for p in qat.parameters() if all(p is not s for s in scales)]

    def freeze(step: int) -> None:
        if step == recipe.bn_freeze:
            freeze_batch_norms(qat)
        if step == int(recipe.range_freeze * recipe.steps):
            freeze_ranges(qat)

    losses = train_steps(qat.train(), name, recipe, [{"params": weights}, {"params": scales, "lr": recipe.scale_lr}],
                         freeze, show, "QAT")
    return qat.eval(), losses


def finetune_float(name: str, recipe: Recipe, show: bool = True):
    """The control: the trained zoo model ``name`` fine-tuned in float by ``recipe`` (same batches, same
    schedule, batch norms on running statistics after ``bn_freeze`` steps), in eval mode, and its losses.
    What the same data gives without quantization: QAT's gain over fp32 that is only the distortion."""
    model = copy.deepcopy(zoo.get(name, trained=True)[0])

    def freeze(step: int) -> None:
        if step == recipe.bn_freeze:
            for m in model.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.eval()

    losses = train_steps(model.train(), name, recipe, [{"params": list(model.parameters())}], freeze, show, "fp32")
    return model.eval(), losses


def train_steps(model, name: str, recipe: Recipe, groups: list[dict], freeze, show: bool, label: str):
    """``recipe.steps`` Adam steps (cosine decay) of ``model`` on the training digits (shifted, distorted
    unless ``recipe.distort`` is off), ``freeze(step)`` called before each; the mean loss of the first
    and of the last 20 steps."""
    x_train, y_train, _, _ = zoo.digits.dataset() if name == "digits_cnn" else trained.dataset()
    opt = torch.optim.Adam(groups, lr=recipe.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, recipe.steps)
    g = torch.Generator().manual_seed(recipe.seed)
    order = torch.randperm(len(y_train), generator=g)
    losses = []
    with progress_bar(show, total=recipe.steps, desc=f"{label} {name}", unit="step") as bar:
        for step in range(recipe.steps):
            freeze(step)
            start = (step * recipe.batch) % len(order)
            if start + recipe.batch > len(order):
                order, start = torch.randperm(len(y_train), generator=g), 0
            index = order[start:start + recipe.batch]
            opt.zero_grad()
            x = shift(x_train[index], 0 if name == "digits_cnn" else 2, g)
            if recipe.distort:
                x = digits.distort(x, TRAIN_SEED + step)
            loss = F.cross_entropy(model(x), y_train[index])
            loss.backward()
            opt.step()
            schedule.step()
            losses.append(float(loss.detach()))
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
            bar.update()
            if not show and (step + 1) % 25 == 0:
                print(f"  {label} {name} step {step + 1}/{recipe.steps}: loss {np.mean(losses[-20:]):.3f}", flush=True)
    return float(np.mean(losses[:20])), float(np.mean(losses[-20:]))


def _quality(prefix: str, model, prog: qlower.Program, data, reference: np.ndarray) -> dict:
    q = quantization_quality(model, prog.frontend.fake_quant, data, reference=reference)
    return {f"{prefix}_top1": q.quantized, f"{prefix}_agreement": q.agreement, f"{prefix}_sqnr_db": q.sqnr_db}


def run_case(name: str, config: str, recipe: Recipe, show: bool) -> dict:
    quant = CONFIGS[config]
    model, example, _, calibration = zoo.get(name, trained=True)
    data = trained.held_out(name, "digits-hard")
    reference = float_outputs(model, data)
    row: dict = {"model": name, "config": config, "recipe": asdict(recipe), "images": len(data.labels),
                 "fp32_top1": float(np.mean(reference.argmax(1) == data.labels.numpy()))}
    calibration = hard_calibration(calibration)
    t0 = time.perf_counter()
    ptq = qlower.compile(model, example, "reference", quant, calibration, progress=False)
    row.update(_quality("ptq", model, ptq, data, reference), ptq_seconds=round(time.perf_counter() - t0, 1))
    t0, load = time.perf_counter(), os.getloadavg()[0]
    qat, (first, last) = finetune(name, quant, recipe, show, calibration=calibration)
    train = time.perf_counter() - t0
    row.update(qat_loss_first=round(first, 4), qat_loss_last=round(last, 4), qat_train_seconds=round(train, 1),
               qat_steps_per_s=round(recipe.steps / train, 3), load_at_start=round(load, 1),
               load_at_end=round(os.getloadavg()[0], 1))
    prog = qlower.compile(qat, example, "reference", progress=False)
    row.update(_quality("qat", model, prog, data, reference), qat_seconds=round(time.perf_counter() - t0, 1))
    return row


def run_float_control(name: str, recipe: Recipe, show: bool) -> dict:
    """Row ``fp32_finetuned``: the fp32 model fine-tuned by ``recipe`` in float (``finetune_float``), top-1
    and agreement with the trained fp32 model on digits-hard."""
    model = zoo.get(name, trained=True)[0]
    data = trained.held_out(name, "digits-hard")
    reference = float_outputs(model, data)
    t0 = time.perf_counter()
    tuned, (first, last) = finetune_float(name, recipe, show)
    outputs = float_outputs(tuned, data)
    labels = data.labels.numpy()
    return {"model": name, "config": "fp32_finetuned", "recipe": asdict(recipe), "images": len(labels),
            "fp32_top1": float(np.mean(reference.argmax(1) == labels)),
            "finetuned_top1": float(np.mean(outputs.argmax(1) == labels)),
            "finetuned_agreement": float(np.mean(outputs.argmax(1) == reference.argmax(1))),
            "loss_first": round(first, 4), "loss_last": round(last, 4),
            "train_seconds": round(time.perf_counter() - t0, 1)}


def _line(row: dict) -> str:
    if row["config"] == "fp32_finetuned":
        return (f"{row['model']:19s} {'fp32 fine-tuned':16s} {'':7s} {100 * row['fp32_top1']:6.2f}%  fine-tuned in "
                f"float: {100 * row['finetuned_top1']:6.2f}% (agreement {100 * row['finetuned_agreement']:6.2f}%)  "
                f"{row['recipe']['steps']:5d} {row['train_seconds']:6.0f}")

    def cell(prefix: str) -> str:
        if f"{prefix}_top1" not in row:
            return f"{'-':>22s}"
        return (f"{100 * row[f'{prefix}_top1']:6.2f}% {100 * row[f'{prefix}_agreement']:6.2f}% "
                f"{row[f'{prefix}_sqnr_db']:5.1f}dB")
    return (f"{row['model']:19s} {row['config']:16s} {row['recipe']['learn_scales']:7s} {100 * row['fp32_top1']:6.2f}%  "
            f"{cell('ptq')}  {cell('qat')}  {row['recipe']['steps']:5d} {row['qat_seconds']:6.0f}")


def _key(row: dict) -> tuple:
    """What identifies a row: model, config and recipe."""
    return row["model"], row["config"], json.dumps(row["recipe"], sort_keys=True)


def ablation(rows: list[dict], name: str, config: str, recipe: Recipe) -> str | None:
    """What the distorted data and LSQ each add, for the case when its rows are measured: fp32, fp32
    fine-tuned by ``recipe`` (the data's gain), QAT with fixed observer scales (``learn_scales="none"``)
    and with learned weight scales (``"weights"``, LSQ's gain over ``"none"``), top-1 %."""
    def find(config_: str, learn_scales: str) -> dict | None:
        want = _key({"model": name, "config": config_, "recipe": asdict(replace(recipe, learn_scales=learn_scales))})
        return next((r for r in rows if _key(r) == want), None)

    control, none, lsq = (find("fp32_finetuned", Recipe.learn_scales), find(config, "none"),
                          find(config, "weights"))
    if not (control and none and lsq):
        return None
    fp32, tuned, ptq = (100 * control["fp32_top1"], 100 * control["finetuned_top1"], 100 * lsq["ptq_top1"])
    fixed, learned = 100 * none["qat_top1"], 100 * lsq["qat_top1"]
    return (f"{name:19s} {config:16s} {recipe.steps:5d}  fp32 {fp32:6.2f}  fp32 fine-tuned {tuned:6.2f} "
            f"({tuned - fp32:+.2f})  PTQ {ptq:6.2f}  QAT fixed scales {fixed:6.2f} ({fixed - fp32:+.2f})  "
            f"QAT LSQ {learned:6.2f} (LSQ {learned - fixed:+.2f}; {none['qat_sqnr_db']:.1f} -> "
            f"{lsq['qat_sqnr_db']:.1f} dB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", help="trained zoo models (default: the default cases)")
    parser.add_argument("--configs", nargs="*", default=None, choices=sorted(CONFIGS))
    parser.add_argument("--steps", type=int, default=None, help=f"default: the case's (STEPS), else {Recipe.steps}")
    parser.add_argument("--batch", type=int, default=Recipe.batch)
    parser.add_argument("--lr", type=float, default=Recipe.lr)
    parser.add_argument("--bn-freeze", type=int, default=Recipe.bn_freeze)
    parser.add_argument("--range-freeze", type=float, default=Recipe.range_freeze)
    parser.add_argument("--learn-scales", nargs="+", default=[Recipe.learn_scales], choices=["none", "weights", "all"],
                        help="one QAT row per value")
    parser.add_argument("--scale-lr", type=float, default=Recipe.scale_lr)
    parser.add_argument("--clean", action="store_true", help="fine-tune on the clean training digits")
    parser.add_argument("--float-control", action="store_true",
                        help="per model, fine-tune in float by the same recipe instead (what the data alone gives)")
    parser.add_argument("--ablation", action="store_true",
                        help="per case: QAT with learned ('weights') and fixed ('none') scales and the float control")
    parser.add_argument("--redo", action="store_true", help="measure the rows the JSON file holds again")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    torch.set_num_threads(2)
    changes = {"batch": args.batch, "lr": args.lr, "bn_freeze": args.bn_freeze, "range_freeze": args.range_freeze,
               "scale_lr": args.scale_lr, "distort": not args.clean, **({"steps": args.steps} if args.steps else {})}
    cases = DEFAULT if not args.models else [(m, c) for m in args.models for c in (args.configs or ["w4_per_tensor"])]
    learn_scales = ["weights", "none"] if args.ablation else args.learn_scales
    runs = [] if args.float_control else [(name, config, case_recipe(name, config, learn_scales=ls, **changes))
                                          for name, config in cases for ls in learn_scales]
    if args.float_control or args.ablation:  # one per model and recipe (the float recipe's learn_scales: the default)
        runs += list({(name, "fp32_finetuned", case_recipe(name, config, **changes)): None
                      for name, config in cases})
    out = Path(args.out)
    saved = json.loads(out.read_text()) if out.exists() else {}
    rows = saved.get("rows", [])

    print(f"{'':37s} {'scales':7s} {'fp32':>7s}  {'PTQ: top-1  agree  SQNR':>22s}  {'QAT':>22s}  steps  QAT s")
    for name, config, recipe in runs:
        row = {"model": name, "config": config, "recipe": asdict(recipe)}
        done = [r for r in rows if _key(r) == _key(row)]
        if done and not args.redo:
            print(_line(done[0]) + "  (kept)", flush=True)
            continue
        row = (run_float_control(name, recipe, not args.no_progress) if config == "fp32_finetuned"
               else run_case(name, config, recipe, not args.no_progress))
        rows = [r for r in rows if _key(r) != _key(row)] + [row]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"torch_threads": torch.get_num_threads(), "rows": rows}, indent=2) + "\n")
        print(_line(row), flush=True)
    lines = [line for name, config in cases
             if (line := ablation(rows, name, config, case_recipe(name, config, **changes))) is not None]
    if lines:
        print("\nWhat the data and LSQ each add (top-1 %, one seed; differences against fp32, LSQ's against fixed "
              "scales):\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
