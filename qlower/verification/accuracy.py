"""Accuracy on labelled data: the float model, the fake-quant model and the compiled program, image by image.

The three are run on the same images one at a time (a program, like the
fake-quant graph, is specialised to the example inputs' batch of 1) and
scored by top-1 against the labels. ``agreement`` is how often the program
picks what the fake-quant model picks: the part of an accuracy change that
the lowering, not the quantization, is responsible for.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np
import torch

from qlower.backends.registry import cost_report
from qlower.errors import InputError
from qlower.progress import progress_bar


def pct(x: float | None) -> str:
    """An accuracy in [0, 1] as a percentage, or a dash when there is none."""
    return "—" if x is None else f"{100 * x:.2f}%"


@dataclass(frozen=True)
class AccuracyReport:
    """Top-1 accuracies in [0, 1] on ``images`` labelled inputs; ``fake_quant`` and ``agreement`` are None
    for a program compiled in float; ``cycles`` is the total cycle estimate of the target's backend (``estimator``'s), else None."""

    target: str
    images: int
    fp32: float
    fake_quant: float | None
    program: float
    agreement: float | None
    cycles: int | None = None
    label: str = ""
    detail: str = ""  # e.g. which layers auto_int16 promoted
    estimator: str = ""  # who estimated ``cycles`` (the backend's cost report names it)

    def table(self) -> str:
        lines = [f"accuracy on {self.images} held-out inputs{f' ({self.label})' if self.label else ''}",
                 f"  fp32                  {pct(self.fp32)}",
                 f"  fake-quant (PyTorch)  {pct(self.fake_quant)}",
                 f"  {self.target:21s} {pct(self.program)}"]
        if self.agreement is not None:
            lines.append(f"  top-1 same as fake-quant on {pct(self.agreement)} of the inputs")
        if self.cycles is not None:
            lines.append(f"  {self.estimator or 'backend'} estimate: {self.cycles:,} total cycles per inference")
        return "\n".join(lines)

    __str__ = table

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def labelled(data: object) -> tuple[tuple[torch.Tensor, ...], np.ndarray]:
    """``(inputs, labels)`` (a ``zoo.LabelledData`` or any pair) → (input tensors ``[N, ...]``, int labels ``[N]``)."""
    try:
        inputs, labels = data
    except (TypeError, ValueError):
        raise InputError("data must be a pair (inputs, labels), e.g. zoo.held_out(name)") from None
    inputs = (inputs,) if isinstance(inputs, torch.Tensor | np.ndarray) else tuple(inputs)
    inputs = tuple(torch.as_tensor(x) for x in inputs)
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise InputError(f"labels must be a 1-D integer array, got {labels.dtype}{list(labels.shape)}")
    for i, x in enumerate(inputs):
        if x.ndim == 0 or x.shape[0] != len(labels):
            raise InputError(f"input {i} has shape {list(x.shape)}; expected {len(labels)} inputs along dim 0, "
                             "one per label")
    if len(labels) == 0:
        raise InputError("data holds no inputs")
    return inputs, labels


def first_output(result: object) -> object:
    """A model's (first) output: models return a tensor or a tuple/list of them."""
    return result[0] if isinstance(result, tuple | list) else result


def top1(output: object) -> int:
    return int(np.argmax(np.asarray(output).reshape(-1)))


def total_cycles(program) -> int | None:
    """The total cycle estimate over the program's partitions (their backends' cost reports), or
    None when none has one."""
    return _total(program)[0]


def _total(program) -> tuple[int | None, str]:
    """The total cycle estimate and who estimated it (see ``total_cycles``)."""
    costs = [c for c in (cost_report(p.payload) for p in program.partitions) if c is not None and c.cycles is not None]
    return (sum(c.cycles for c in costs) if costs else None), " and ".join(sorted({c.estimator for c in costs}))


@torch.no_grad()
def measure_accuracy(program, data: object, *, limit: int | None = None, progress: bool = True,
                     label: str = "", detail: str = "") -> AccuracyReport:
    """Top-1 accuracy of ``program`` on ``data`` (its first ``limit`` inputs), beside its float and
    fake-quant models. The program must come from ``qlower.compile`` in this process (a loaded
    program has neither model)."""
    front = getattr(program, "frontend", None)
    if front is None:
        raise InputError("measure_accuracy needs a program from qlower.compile (a loaded program file keeps "
                         "neither the float nor the fake-quant model)")
    inputs, labels = labelled(data)
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise InputError(f"limit is how many inputs to measure, an integer >= 1; got {limit!r}")
    count = len(labels) if limit is None else min(limit, len(labels))
    picks = np.zeros((3, count), dtype=np.int64)
    models = (front.float_model, front.fake_quant)
    with progress_bar(progress, total=count, desc=f"evaluating on {program.target}", unit="input") as bar:
        for i in range(count):
            x = tuple(t[i:i + 1] for t in inputs)
            for row, model in enumerate(models):
                if model is not None:
                    picks[row, i] = top1(first_output(model(*x)))
            picks[2, i] = top1(program.run(*x)[0])
            bar.update()
    truth = labels[:count]
    cycles, estimator = _total(program)
    quantized = front.fake_quant is not None
    return AccuracyReport(
        target=program.target, images=count, fp32=float(np.mean(picks[0] == truth)),
        fake_quant=float(np.mean(picks[1] == truth)) if quantized else None,
        program=float(np.mean(picks[2] == truth)),
        agreement=float(np.mean(picks[2] == picks[1])) if quantized else None,
        cycles=cycles, estimator=estimator, label=label, detail=detail)



def comparison_table(reports: list[AccuracyReport]) -> str:
    """Several configurations of one model on one target (e.g. int8 and A16W8), a row each: what the
    higher precision buys in accuracy and costs in the backend's cycle estimate."""
    first = reports[0]
    lines = [f"{first.target}, {first.images} held-out inputs; fp32 accuracy {pct(first.fp32)}",
             f"  {'configuration':34s} {'fake-quant':>10s} {'program':>9s} {'cycles':>12s}"]
    for r in reports:
        cycles = "—" if r.cycles is None else f"{r.cycles:,}"
        if r.cycles is not None and first.cycles and r is not first:
            cycles += f" ({r.cycles / first.cycles:.2f}x)"
        lines.append(f"  {r.label:34s} {pct(r.fake_quant):>10s} {pct(r.program):>9s} {cycles:>12s}")
        if r.detail:
            lines.append(f"    {r.detail}")
    return "\n".join(lines)


@dataclass(frozen=True)
class QuantizationQuality:
    """What quantization costs on labelled data: top-1 of the float and the quantized model, how often the
    quantized model picks what the float one picks (``agreement``), and the SQNR of its outputs in dB
    (float output power over the power of the difference; it moves even when top-1 does not)."""

    images: int
    fp32: float
    quantized: float
    agreement: float
    sqnr_db: float


def _outputs(model, inputs: tuple[torch.Tensor, ...], count: int, batch: int) -> np.ndarray:
    """``model``'s first output on the first ``count`` inputs, ``batch`` at a time when it takes batches (an
    exported graph may be specialised to a batch of 1: then one at a time)."""
    rows = []
    i = 0
    while i < count:
        n = min(batch, count - i)
        out = first_output(model(*(t[i:i + n] for t in inputs)))
        out = np.asarray(out.detach() if isinstance(out, torch.Tensor) else out, dtype=np.float64)
        if out.shape[0] != n:
            raise ValueError("the model returned another batch size")
        rows.append(out.reshape(n, -1))
        i += n
    return np.concatenate(rows)


@torch.no_grad()
def quantization_quality(float_model, quantized_model, data: object, *, limit: int | None = None,
                         batch: int = 64, reference: np.ndarray | None = None) -> QuantizationQuality:
    """Compare ``quantized_model`` (e.g. a program's ``frontend.fake_quant``, or anything callable on a batch of
    inputs) with ``float_model`` on ``data`` (inputs, labels). ``reference``: the float model's outputs
    on the same inputs when already computed."""
    inputs, labels = labelled(data)
    count = len(labels) if limit is None else min(limit, len(labels))
    ref = reference[:count] if reference is not None else _outputs(float_model, inputs, count, batch)

    try:
        got = _outputs(quantized_model, inputs, count, batch)
    except Exception:  # noqa: BLE001  (a graph specialised to one input fails in many ways on a batch)
        got = _outputs(quantized_model, inputs, count, 1)
    truth = labels[:count]
    noise = float(np.sum((ref - got) ** 2))
    signal = float(np.sum(ref ** 2))
    sqnr = float("inf") if noise == 0 else 10 * np.log10(signal / noise)
    return QuantizationQuality(images=count, fp32=float(np.mean(ref.argmax(1) == truth)),
                               quantized=float(np.mean(got.argmax(1) == truth)),
                               agreement=float(np.mean(got.argmax(1) == ref.argmax(1))), sqnr_db=sqnr)


def float_outputs(model, data: object, *, batch: int = 64) -> np.ndarray:
    """The float model's outputs ``[N, ...]`` on ``data``, flattened per input (reused across comparisons)."""
    inputs, labels = labelled(data)
    with torch.no_grad():
        try:
            return _outputs(model, inputs, len(labels), batch)
        except Exception:  # noqa: BLE001
            return _outputs(model, inputs, len(labels), 1)
