"""From an nn.Module to a torch GraphModule: torch.export, then PT2E prepare → calibrate → convert.

The converted module is the *fake-quant model*: float in, float out, with
quantize/dequantize pairs at every quantized edge. It is the reference the
importer's IR is compared against (at most one quantization step per element).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import time
import traceback
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import torch
from torch import nn
from torch.fx import GraphModule
from torch.utils import _pytree as pytree
from tqdm.auto import tqdm

from qlower.errors import ConfigError, InputError, QlowerError, UnsupportedOpError
from qlower.frontend.batch_norm_fold import fold_batch_norms
from qlower.frontend.bias_rounding import round_biases
from qlower.frontend.config import QuantConfig
from qlower.frontend.constant_fold import fold_constant_subgraphs
from qlower.frontend.decompose import decompose_unruled
from qlower.frontend.finite import non_finite_nodes
from qlower.frontend.masks import finite_fills
from qlower.frontend.pt2e_input import quantized_form
from qlower.frontend.quantize_fold import fold_constant_quantize
from qlower.frontend.rules import has_rule
from qlower.frontend.source import describe_node
from qlower.progress import progress_bar

Batch = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Captured:
    """``graph_module`` is what the importer reads: the converted (fake-quant) module when
    quantizing, else the exported float module (``float_graph``). ``quantized`` tells which."""

    float_model: nn.Module
    float_graph: GraphModule
    graph_module: GraphModule
    quantized: bool
    seconds: dict[str, float] = field(default_factory=dict)  # per PT2E stage: export, prepare, calibrate, convert


def _as_batch(batch: object) -> Batch:
    if isinstance(batch, torch.Tensor):
        return (batch,)
    if isinstance(batch, (tuple, list)):
        return tuple(batch)
    raise InputError(f"a calibration batch must be a tensor or a tuple of tensors, got {type(batch).__name__}")


def export_module(model: nn.Module, example_inputs: Sequence[torch.Tensor], static: bool = False) -> GraphModule:
    """``torch.export`` to pre-dispatch ATen (what PT2E annotates), without the guard check node;
    what is computed from constants only folded, ops without a rule (for a ``static`` quantized
    import or not) decomposed.

    Non-strict export is tried first; strict export is the fallback (torch 2.13's
    non-strict mode fails on a model without inputs whose forward feeds plain
    tensor attributes straight into an op).
    """
    args = tuple(example_inputs)
    errors = []
    program = None
    user_line = None
    for strict in (False, True):
        try:
            with warnings.catch_warnings(), _attributes_kept(model):
                warnings.simplefilter("ignore")
                program = torch.export.export(model, args, strict=strict)
            break
        except Exception as e:  # noqa: BLE001  (export raises many unrelated types)
            user_line = user_line or _model_line(model, e)
            errors.append(f"{'strict' if strict else 'non-strict'} export: {type(e).__name__}: {e}")
    if program is not None:
        with _stage("export"):
            gm = program.module(check_guards=False)
            _reject_fake_constants(gm, model)
            fold_constant_subgraphs(gm)  # first: what is folded needs no decomposition (constant_fold.py)
            return decompose_unruled(gm, lambda t: has_rule(t, static))
    detail = "\n".join(line[:600] for line in errors)
    where = f" at {user_line}" if user_line else ""
    raise UnsupportedOpError(f"torch.export could not capture {type(model).__name__}{where}:\n{detail}\n"
                             "Make the forward exportable (no data-dependent control flow) and try again.")


@contextlib.contextmanager
def _attributes_kept(model: nn.Module) -> Iterator[None]:
    """No module of ``model`` keeps an attribute that tracing added.

    A forward that caches a tensor on its module (``self.anchors = ...``, as detection heads do) leaves
    a fake tensor there when traced; torch.export puts back the attributes the instance had before,
    but keeps new ones (those that shadowed a class attribute), so the next export (another target,
    verify, sensitivity) would read the fake tensor as a constant, and the eager model would fail.
    """
    before = [(m, set(m.__dict__)) for m in model.modules()]
    try:
        yield
    finally:
        for m, names in before:
            for name in [k for k in m.__dict__ if k not in names]:
                del m.__dict__[name]


def _is_fake(t: object) -> bool:
    return isinstance(t, torch._subclasses.fake_tensor.FakeTensor)


def _reject_fake_constants(gm: GraphModule, model: nn.Module) -> None:
    """A constant without data: the model holds a fake tensor that an earlier trace of it left."""
    fake = [n.target for n in gm.graph.find_nodes(op="get_attr") if _is_fake(attrgetter(n.target)(gm))]
    if not fake:
        return
    held = [f"{path + '.' if path else ''}{name}" for path, m in model.named_modules()
            for name, v in vars(m).items() if _is_fake(v)]
    where = f"model attribute(s) {', '.join(held)}" if held else f"graph constant(s) {', '.join(fake)}"
    raise UnsupportedOpError(
        f"{type(model).__name__}'s forward reads {where}, a FakeTensor (a tensor without data) that an earlier "
        "torch.export or torch.compile of this model stored while tracing (a forward that caches tensors on its "
        "module); compile a freshly built model, or delete the attribute so that the forward computes it again")


def _model_line(model: nn.Module, error: BaseException) -> str | None:
    """The deepest line of the model's own source file in ``error``'s traceback (where export gave up)."""
    try:
        source = inspect.getsourcefile(type(model))
    except TypeError:
        return None
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == source]
    return f"{frames[-1].filename}:{frames[-1].lineno} ({frames[-1].line})" if frames else None


def _reject_unfolded_batch_norm(gm: GraphModule) -> None:
    """prepare_pt2e folds BatchNorm into a preceding conv/linear, and an eval-mode one with constant
    statistics becomes an integer per-channel affine map (channel_affine.py); one that is still
    left can't be integer (and convert_pt2e would spend a minute trying QAT folding patterns on it)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "overloadpacket", None) is torch.ops.aten.batch_norm:
            raise UnsupportedOpError(
                f"{node.target} (node '{node.name}') {describe_node(node)}: a BatchNorm that is neither folded "
                "into a conv/linear nor an eval-mode per-channel affine map with constant statistics can't be "
                "integer; call model.eval(), or let it run in float (QuantConfig(fallback='float'))")


def capture(model: nn.Module, example_inputs: Sequence[torch.Tensor], quant: QuantConfig | None,
            calibration: Iterable[object] | None, progress: bool = True, fold_weights: bool = True,
            fast_paths: bool = True) -> Captured:
    """Export ``model`` (put in eval mode) and, when ``quant`` is given, quantize it with PT2E.

    Calibration runs every batch through the prepared model; it is needed in
    dynamic mode too (weight observers only see the weights during a forward).
    ``fold_weights=False`` leaves each weight as ``dequantize(quantize(float weight))``
    (same values; what the importer reads is folded): sensitivity analysis
    switches quantization points off one by one, weights included.
    ``fast_paths=False`` takes torchao's own way where qlower has a faster one that must quantize
    alike (tests compare the two): BatchNorm folding left to prepare_pt2e (batch_norm_fold.py),
    weights observed at every calibration batch (quantizer.py's once-observers) and folded by
    convert_pt2e's constant folder (quantize_fold.py).
    """
    if quant is not None and quantized_form(model) is not None:
        raise ConfigError(f"this {type(model).__name__} is quantized already (a QAT or PT2E model, form "
                          f"'{quantized_form(model)}'): quantizing it again would treat its fake-quants or q/dq nodes "
                          "as float layers. qlower.compile takes its quantization as given; to quantize it or "
                          "measure its sensitivity, pass the float model")
    model = model.eval()
    if quant is None:
        gm = export_module(model, example_inputs)
        return Captured(model, gm, gm, quantized=False)
    batches = [_as_batch(b) for b in (calibration or ())]
    if not batches:
        raise InputError("quantization needs at least one calibration batch (a tuple of input tensors); "
                         "pass e.g. [example_inputs]")
    # one bar over the whole of PT2E, its slowest stage: export, prepare, each batch, convert
    with progress_bar(progress, total=len(batches) + 3, desc="quantizing: export", unit="step") as bar:
        return _quantize(model, example_inputs, quant, batches, bar, fold_weights, fast_paths)


def prepare(gm: GraphModule, quant: QuantConfig, batches: list[tuple], fast_paths: bool = True) -> GraphModule:
    """The exported ``gm`` (rewritten in place) ready for calibration: BatchNorms folded, annotated by
    the QlowerQuantizer, observers inserted by prepare_pt2e. Observers pass their input through, so
    it computes what the float model computes, up to float rounding."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from qlower.frontend.quantizer import QlowerQuantizer

    fold_constant_subgraphs(gm)  # computed weights become weights (constant_fold.py; export_module did it already)
    if fast_paths or quant.rewrites_weights:
        fold_batch_norms(gm)  # before prepare_pt2e, whose own fold is slow and can be wrong (batch_norm_fold.py)
    rewrite_weights(gm, quant, batches)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantizer = QlowerQuantizer(quant, observe_weights_once=fast_paths)
        finite_fills(gm)  # mask fills: -inf -> -1e30, a row masked everywhere is uniform, never NaN (masks.py)
        quantizer.keep_float = non_finite_nodes(gm, batches)
        prepared = prepare_pt2e(gm, quantizer)
    if quant.fallback == "error":
        _reject_unfolded_batch_norm(prepared)
    return prepared


def rewrite_weights(gm: GraphModule, quant: QuantConfig, batches: list[tuple]) -> None:
    """The float graph's weight rewrites a QuantConfig asks for, in place, BatchNorms folded first:
    equalization and SmoothQuant (function unchanged), then bias correction of what remains."""
    from qlower.frontend.bias_correction import correct_biases
    from qlower.frontend.equalization import equalize
    from qlower.frontend.smoothquant import smooth

    if quant.equalize or quant.smooth is not None:
        before = _float_outputs(gm, batches)
        if quant.equalize:
            equalize(gm, batches, quant.absorb_bias)
        if quant.smooth is not None:
            smooth(gm, batches, quant.smooth)
        _check_same_function(before, _float_outputs(gm, batches),
                             "equalize=True" if quant.equalize else f"smooth={quant.smooth}")
    if quant.bias_correction:
        correct_biases(gm, batches, quant)


def _float_outputs(gm: GraphModule, batches: list[tuple]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [o for b in batches for o in pytree.tree_leaves(gm(*b)) if isinstance(o, torch.Tensor)]


def _check_same_function(before: list[torch.Tensor], after: list[torch.Tensor], what: str) -> None:
    """Equalization and SmoothQuant promise the float function unchanged: a model where a rewrite
    breaks that promise is refused, never compiled as another model (checked on the calibration data)."""
    for b, a in zip(before, after, strict=True):
        if not b.is_floating_point():
            continue
        tolerance = 1e-4 * max(1.0, float(b.abs().max()))
        diff = float((a - b).abs().max()) if b.numel() else 0.0
        if not diff <= tolerance:
            raise ConfigError(f"QuantConfig({what}) changed this model's float function on the calibration data "
                              f"(max difference {diff:.3g}, allowed {tolerance:.3g}): qlower refuses to compile "
                              "another model than yours; compile without it")


def _graph_copy(gm: GraphModule) -> GraphModule:
    """``gm`` with copies of only what its graph reads: a deep copy copies whatever else the module
    holds too (a leftover of tracing may not even be copyable)."""
    graph = copy.deepcopy(gm.graph)
    root: dict[str, object] = {}
    for node in graph.nodes:
        if node.op == "get_attr":
            value = attrgetter(node.target)(gm)
            if isinstance(value, nn.Parameter):
                root[node.target] = nn.Parameter(value.detach().clone(), requires_grad=value.requires_grad)
            elif isinstance(value, torch.Tensor):
                root[node.target] = value.detach().clone()
            else:
                root[node.target] = copy.deepcopy(value)
        elif node.op == "call_module":
            root[node.target] = copy.deepcopy(gm.get_submodule(node.target))
    return GraphModule(root, graph)


@contextlib.contextmanager
def _stage(name: str) -> Iterator[None]:
    """An unexpected exception in a stage of capture becomes a qlower error that names the stage."""
    try:
        yield
    except QlowerError:
        raise
    except Exception as e:  # noqa: BLE001  (PyTorch and torchao raise many unrelated types)
        raise UnsupportedOpError(f"capture failed in its {name} stage: {type(e).__name__}: {str(e)[:2000]}") from e


def _quantize(model: nn.Module, example_inputs: Sequence[torch.Tensor], quant: QuantConfig,
              batches: list[tuple], bar: tqdm, fold_weights: bool = True, fast_paths: bool = True) -> Captured:
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[stage] = round(now - clock, 4)
        clock = now

    gm = export_module(model, example_inputs, static=quant.mode == "static")
    bar.update()
    with warnings.catch_warnings(), _stage("export"):
        warnings.simplefilter("ignore")
        float_graph = _graph_copy(gm)  # gm is rewritten in place (constant and BatchNorm folding, observers)
    lap("export")
    bar.set_description("quantizing: prepare")
    with _stage("prepare"):
        prepared = prepare(gm, quant, batches, fast_paths)

    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bar.update()
        lap("prepare")
        bar.set_description("quantizing: calibrate")
        with torch.no_grad(), _stage("calibrate"):
            for batch in batches:
                prepared(*batch)
                bar.update()
        lap("calibrate")
        bar.set_description("quantizing: convert")
        with _stage("convert"):
            # weights are folded by quantize_fold.py on the fast path: torchao's folder interprets the whole graph
            converted = convert_pt2e(prepared, fold_quantize=fold_weights and not fast_paths)
            if fold_weights and fast_paths:
                fold_constant_quantize(converted)
            round_biases(converted)  # the int32 biases deployment adds (bias_rounding.py)
        bar.update()
        lap("convert")
        bar.set_description("quantized")
    return Captured(model, float_graph, converted, quantized=True, seconds=seconds)
