"""Which layers int8 hurts: each layer quantized alone, the others left in float, ranked by output SQNR.

The model is quantized once, exactly as ``qlower.compile`` does it (same
quantizer, calibration and scales), with weights left as ``dequantize(quantize(w))``.
Every quantize/dequantize pair of that fake-quant graph is a *quantization
point*, and each gets a switch: off, the pair passes its float input through.
A layer is an activation point (a tensor the program holds in int8) together
with the weights of the conv/linear that computes it; it is named by that
op's module path, so ``features.3`` in a report is ``features.3`` in the model.

All switches off is the float model (BatchNorm folded); all on is the
fake-quant model; one layer's switches on is that layer quantized alone. The
lower a layer's output SQNR alone, the more its int8 quantization costs: those
are the layers worth keeping at higher precision.

Each layer's measurement is independent of the others: under ``qlower.sweep.use_executor(...)`` the
layers are shared out among a sweep executor's workers (local processes or Ray tasks), each capturing
the same graph again, with the same numbers as in series.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.fx import GraphModule, Node

from qlower.frontend.capture import capture
from qlower.frontend.config import QuantConfig
from qlower.frontend.quantizer import GEMM, GEMM_AXIS1, packet
from qlower.frontend.source import module_path, source_location
from qlower.progress import progress_bar
from qlower.verification.accuracy import first_output, top1
from qlower.verification.metrics import sqnr_db

_QD = torch.ops.quantized_decomposed
QUANTIZE = {_QD.quantize_per_tensor.default, _QD.quantize_per_tensor.tensor, _QD.quantize_per_channel.default}
SOURCE = "qlower_sensitivity_source"   # GraphModule.meta: (model, example, quant, calibration) it was captured from
DEQUANTIZE = {_QD.dequantize_per_tensor.default, _QD.dequantize_per_tensor.tensor, _QD.dequantize_per_channel.default}


class Switch(nn.Module):
    """One quantization point: its fake-quantized value when on, its float input when off."""

    def __init__(self) -> None:
        super().__init__()
        self.on = True

    def forward(self, float_value: torch.Tensor, quantized_value: torch.Tensor) -> torch.Tensor:
        return quantized_value if self.on else float_value


@dataclass(frozen=True)
class Layer:
    """Quantization points switched together: one activation (``op`` computes it) and the weights of its
    conv/linear. ``name`` is the module path ('' for ops in the model's own forward), ``source`` file:line."""

    name: str
    op: str
    source: str
    points: tuple[int, ...]


@dataclass(frozen=True)
class LayerSensitivity:
    name: str
    op: str
    source: str
    sqnr_db: float            # output SQNR with only this layer in int8
    accuracy: float | None    # top-1 accuracy with only this layer in int8 (when labels are given)


@dataclass(frozen=True)
class SensitivityReport:
    """Per layer, most sensitive first; ``int8_sqnr_db`` / ``int8_accuracy``: every layer quantized."""

    layers: list[LayerSensitivity]
    inputs: int
    int8_sqnr_db: float
    fp32_accuracy: float | None = None
    int8_accuracy: float | None = None
    model: str = ""
    notes: list[str] = field(default_factory=list)

    def most_sensitive(self, k: int) -> list[str]:
        """The module paths of the ``k`` most sensitive layers (unnamed ones left out)."""
        return [row.name for row in self.layers if row.name][:k]

    def table(self, top: int | None = None) -> str:
        def pct(x: float | None) -> str:
            return "" if x is None else f"{100 * x:7.2f}%"

        head = (f"sensitivity of {self.model or 'the model'}: each layer alone in int8 on {self.inputs} inputs; "
                f"all {len(self.layers)} layers in int8: output SQNR {self.int8_sqnr_db:.1f} dB"
                + (f", accuracy {pct(self.int8_accuracy).strip()} (fp32 {pct(self.fp32_accuracy).strip()})"
                   if self.int8_accuracy is not None else ""))
        lines = [head, f"{'rank':>4s}  {'layer (module path)':32s} {'op':14s} {'SQNR dB':>8s}"
                       + (f" {'accuracy':>8s}" if self.int8_accuracy is not None else "") + "  source"]
        for rank, row in enumerate(self.layers[:top], 1):
            lines.append(f"{rank:4d}  {row.name or '(model forward)':32s} {row.op:14s} {row.sqnr_db:8.1f}"
                         + (f" {pct(row.accuracy)}" if row.accuracy is not None else "") + f"  {row.source}")
        return "\n".join(lines + self.notes)

    __str__ = table

    def to_json(self) -> str:
        return json.dumps(_finite(asdict(self)), indent=2)

    def plot(self, path: str | Path, top: int = 30) -> Path:
        """A bar chart of the ``top`` most sensitive layers' SQNR (PNG)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.layers[:top]
        fig, ax = plt.subplots(figsize=(8, 0.28 * len(rows) + 1.4))
        ys = range(len(rows))[::-1]
        ax.barh(list(ys), [min(r.sqnr_db, 99.0) for r in rows], color="#d6604d")
        ax.set_yticks(list(ys), [f"{r.name or '(forward)'} · {r.op}" for r in rows], fontsize=7)
        ax.axvline(self.int8_sqnr_db, color="black", linestyle="--", linewidth=1, label="every layer in int8")
        ax.set_xlabel("output SQNR with only this layer in int8 (dB; lower = more sensitive)")
        ax.set_title(f"int8 sensitivity per layer — {self.model or 'model'}", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _finite(x: object) -> object:
    """``x`` with every infinite float (an SQNR without noise) as None: JSON has no infinity."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def add_switches(gm: GraphModule) -> list[Switch]:
    """Put a ``Switch`` behind every quantize → dequantize pair of ``gm`` (in place); the switches in graph order."""
    switches: list[Switch] = []
    graph = gm.graph
    for dq in list(graph.nodes):
        if dq.op != "call_function" or dq.target not in DEQUANTIZE:
            continue
        q = dq.args[0]
        if not isinstance(q, Node) or q.target not in QUANTIZE:
            continue
        name = f"qlower_switch_{len(switches)}"
        switches.append(Switch())
        gm.add_submodule(name, switches[-1])
        with graph.inserting_after(dq):
            node = graph.call_module(name, (q.args[0], dq))
        dq.replace_all_uses_with(node, delete_user_cb=lambda user, new=node: user is not new)
        node.meta["qlower_point"] = q
    gm.recompile()
    return switches


def _switch_nodes(gm: GraphModule) -> list[Node]:
    return [n for n in gm.graph.nodes if "qlower_point" in n.meta]


def group_layers(gm: GraphModule) -> list[Layer]:
    """The layers of a switched graph: each activation point with the weight points of the op computing it.

    Walking back from an activation point's producer along first inputs (an op fused into a conv,
    like its ReLU, has no point of its own) finds the conv/linear that computes it, if any."""
    points = _switch_nodes(gm)
    index = {n: i for i, n in enumerate(points)}
    claimed: set[int] = set()
    layers: list[Layer] = []
    for point in points:
        value = point.args[0]
        if value.op == "get_attr":
            continue  # a weight: claimed by the activation its op computes
        members, named, chain = [index[point]], value, []
        node = value
        while isinstance(node, Node) and node.op == "call_function" and node not in index:
            chain.append(node)
            if packet(node) in GEMM | GEMM_AXIS1:
                named = node
                members += [index[a] for a in node.args[:3] if a in index and a.args[0].op == "get_attr"]
                break
            node = node.args[0] if node.args and isinstance(node.args[0], Node) else None
        claimed.update(members)
        name = "input" if value.op == "placeholder" else module_path(named) or module_path(value)
        what = "+".join(_op_name(n) for n in reversed(chain)) or _op_name(value)  # e.g. conv2d+relu
        layers.append(Layer(name, what, source_location(named) or source_location(value), tuple(members)))
    for point in points:  # weights of an op whose result is not quantized (it feeds a float op)
        i = index[point]
        if i not in claimed:
            user = next(iter(point.users), point)
            layers.append(Layer(module_path(user), _op_name(user), source_location(user), (i,)))
    return layers


def _op_name(node: Node) -> str:
    target = node.target
    if node.op == "placeholder":
        return "placeholder"
    return getattr(getattr(target, "overloadpacket", None), "__name__", None) or getattr(target, "__name__", str(target))


def chunks(inputs: Sequence[tuple[torch.Tensor, ...]], batch: int) -> list[tuple[torch.Tensor, ...]]:
    """Batch-1 input tuples stacked ``batch`` at a time; the last chunk padded with copies of its first rows."""
    out = []
    for start in range(0, len(inputs), batch):
        part = list(inputs[start:start + batch])
        part += [part[0]] * (batch - len(part))
        out.append(tuple(torch.cat(xs) for xs in zip(*part)))
    return out


def batch_agnostic(model: nn.Module, samples: Sequence[tuple[torch.Tensor, ...]]) -> bool:
    """Whether ``model`` computes each row of a stacked batch as it computes that input alone (no op
    mixes the batch), checked in float on ``samples``."""
    try:
        with torch.no_grad():
            alone = torch.cat([first_output(model(*x)) for x in samples])
            stacked = first_output(model(*chunks(samples, len(samples))[0]))
    except Exception:  # noqa: BLE001  (a model written for batch 1 only)
        return False
    return stacked.shape == alone.shape and bool(torch.allclose(stacked, alone, rtol=1e-4, atol=1e-5 * float(
        alone.abs().max())))


def capture_switchable(model: nn.Module, example: tuple[torch.Tensor, ...], quant: QuantConfig,
                       calibration: list[tuple[torch.Tensor, ...]], progress: bool) -> tuple[GraphModule, int]:
    """The fake-quant graph ``measure_sensitivity`` switches (weights left unfolded), and how many inputs it
    takes at once.

    Min/max observers see the same values whether the calibration batches come one by one or stacked (up
    to float32 rounding: a batched conv may round a last bit differently, moving a scale by an ulp, which
    compile can't accept but a ranking can): a batch-agnostic model is calibrated in one forward and
    measured ``len(calibration)`` inputs at a time."""
    batch = len(calibration) if len(calibration) > 1 and batch_agnostic(model, calibration) else 1
    if batch > 1:
        stacked = chunks(calibration, batch)[0]
        gm = capture(model, stacked, quant, [stacked], progress=progress, fold_weights=False).graph_module
    else:
        gm = capture(model, example, quant, calibration, progress=progress, fold_weights=False).graph_module
    # what a worker needs to capture the same graph again (a GraphModule of PT2E ops doesn't pickle)
    gm.meta[SOURCE] = (model, tuple(example), quant, list(calibration))
    return gm, batch


def _runner(gm: GraphModule, switches: list[Switch], stacked: list, count: int):
    """``run(on)``: the outputs of ``gm`` on the stacked inputs with the switches in ``on`` turned on."""

    def run(on: set[int]) -> np.ndarray:
        for i, switch in enumerate(switches):
            switch.on = i in on
        outs = [first_output(gm(*x)).detach().numpy().astype(np.float64) for x in stacked]
        return np.concatenate(outs)[:count]

    return run


def _score(reference: np.ndarray, outs: np.ndarray, labels: np.ndarray | None) -> tuple[float, float | None]:
    accuracy = None if labels is None else float(np.mean([top1(o) == y for o, y in zip(outs, labels)]))
    return sqnr_db(reference, outs), accuracy


@torch.no_grad()
def measure_layers(task: tuple) -> list[tuple[float, float | None]]:
    """A worker's share of the layers: capture the same switched graph again (from the model, its
    quantization and calibration, as ``capture_switchable`` did) and score each layer's points alone.
    The torch thread count is the caller's, so the float arithmetic, and the numbers, are the same."""
    source, inputs, labels, batch, points, reference, threads = task
    torch.set_num_threads(threads)
    model, example, quant, calibration = source
    gm, again = capture_switchable(model, example, quant, calibration, progress=False)
    if again != batch:
        raise RuntimeError(f"the graph captured again takes {again} inputs at once, the caller's {batch}")
    run = _runner(gm, add_switches(gm), chunks(inputs, batch), len(inputs))
    return [_score(reference, run(set(p)), labels) for p in points]


@torch.no_grad()
def measure_sensitivity(gm: GraphModule, inputs: Sequence[tuple[torch.Tensor, ...]], labels: np.ndarray | None = None,
                        *, batch: int = 1, progress: bool = True, model: str = "", executor=None) -> SensitivityReport:
    """Rank the layers of the fake-quant graph ``gm`` (converted with ``fold_weights=False``, exported for
    ``batch`` inputs at a time; switched here, in place) by the output SQNR each gives when quantized
    alone, on the batch-1 ``inputs``.

    ``executor`` (default: the one ``qlower.sweep.use_executor`` set, else none) measures the layers
    in its workers, a share each, when ``gm`` came from ``capture_switchable``; the numbers are the
    ones measured here in series."""
    from qlower.late import late

    # qlower.sweep (a later layer) sets it: the package root binds the slot (qlower/late.py)
    executor = executor if executor is not None else late("current_executor")()
    switches = add_switches(gm)
    layers = group_layers(gm)
    run = _runner(gm, switches, chunks(inputs, batch), len(inputs))
    with progress_bar(progress, total=len(layers) + 2, desc="sensitivity", unit="layer") as bar:
        reference = run(set())
        bar.update()
        int8_sqnr, int8_accuracy = _score(reference, run(set(range(len(switches)))), labels)
        bar.update()
        if executor is not None and SOURCE in gm.meta and len(layers) > 1:
            scores = _fan_out(executor, gm.meta[SOURCE], inputs, labels, batch, layers, reference, bar)
        else:
            scores = []
            for layer in layers:
                scores.append(_score(reference, run(set(layer.points)), labels))
                bar.update()
    for switch in switches:
        switch.on = True
    rows = [LayerSensitivity(layer.name, layer.op, layer.source, sqnr, accuracy)
            for layer, (sqnr, accuracy) in zip(layers, scores, strict=True)]
    rows.sort(key=lambda r: (r.sqnr_db, r.name))
    fp32_accuracy = None if labels is None else _score(reference, reference, labels)[1]
    return SensitivityReport(rows, len(inputs), int8_sqnr, fp32_accuracy, int8_accuracy, model)


def _fan_out(executor, source: tuple, inputs: Sequence, labels: np.ndarray | None, batch: int, layers: list[Layer],
             reference: np.ndarray, bar) -> list[tuple[float, float | None]]:
    """The layers' scores measured by ``executor``'s workers, one share of the layers each (each share
    pays one capture); a share that fails fails the measurement with the worker's reason."""
    from qlower.errors import ExecutionError

    shares = min(len(layers), max(1, executor.size))
    bounds = [round(k * len(layers) / shares) for k in range(shares + 1)]
    tasks = [(source, list(inputs), labels, batch, [layers[i].points for i in range(bounds[k], bounds[k + 1])],
              reference, torch.get_num_threads()) for k in range(shares)]
    scores: list = [None] * shares
    for outcome in executor.map(measure_layers, tasks):
        if not outcome.ok:
            raise ExecutionError(f"sensitivity: a worker measuring layers {bounds[outcome.index]}.."
                                 f"{bounds[outcome.index + 1] - 1} failed: {outcome.error}")
        scores[outcome.index] = outcome.value
        bar.update(len(outcome.value))
    return [s for share in scores for s in share]
