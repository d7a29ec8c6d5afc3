"""Quantization-aware training with qlower's own quantization: ``prepare_qat(model, example_inputs, quant)``.

The model is exported in training mode and annotated by the QlowerQuantizer (the same QuantConfig
semantics as ``compile``: per-channel or per-tensor weights, activation range and dtype, int16 layers,
fixed values), with every observer replaced by a fake-quant that quantizes in the forward pass and lets
gradients through (straight-through estimator) - torchao's ``prepare_qat_pt2e``:

- activations: a moving average of each batch's min / max (torchao's default for QAT), frozen by
  ``freeze_ranges`` when the ranges should stop moving (the last epochs);
- weights: the current weights' min / max at every step (per channel or per tensor), so the scale
  compiled is the one of the weights compiled;
- conv -> batch norm folded so that it trains correctly (Krishnamoorthi 2018, as torchao's QAT does):
  the weight is scaled by s = gamma / sqrt(running var + eps) *before* its fake-quant, the conv's
  output divided by s (plus the conv's bias) and the batch norm applied with the batch's statistics.
  The weight quantized in training is the one deployment folds, while training normalises with true
  batch statistics; its output (after a fused ReLU / ReLU6 / clamp) is quantized, not the conv's:
  deployment has no separate conv result. In eval mode and at conversion the batch norm uses its
  running statistics, and conversion folds it: conv(x, q(w * s)) + beta + (bias - mean) * s.
  qlower's own rewrite, not torchao's pattern matcher, which takes over a minute on a small CNN.

``qlower.compile(qat_model, example_inputs, target)`` then converts a copy (batch norms to eval, folded,
each fake-quant's learned scale and zero point written as q/dq nodes) and compiles it as given, without
calibration (pt2e_input.py): every target is bit-exact with the reference as for any compile.
"""

from __future__ import annotations

import copy
import types
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e import (
    FixedQParamsObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
)
from torchao.quantization.pt2e.fake_quantize import FakeQuantize
from torchao.quantization.pt2e.quantizer import QuantizationSpec, SharedQuantizationSpec

from qlower.errors import ConfigError, QlowerError
from qlower.frontend.config import QuantConfig
from qlower.frontend.constants import attribute_tensor
from qlower.frontend.fake_quant import ExportableFakeQuantize, ExportableFixedQParamsFakeQuantize
from qlower.frontend.learned_scales import LearnedScaleFakeQuantize, learned_fake_quants
from qlower.frontend.quantizer import ACTIVATIONS, QlowerQuantizer, _annotate, _one_domain, packet
from qlower.frontend.source import describe_node

aten = torch.ops.aten
BATCH_NORMS = {aten.batch_norm, aten._native_batch_norm_legit, aten.cudnn_batch_norm}
CONVS = {aten.conv1d, aten.conv2d}  # what torchao's QAT fold takes (a linear -> batch norm trains in float)


def _fake_quant(spec: QuantizationSpec, weight: bool, learn: bool) -> QuantizationSpec:
    """``spec`` with its observer replaced by a fake-quant: weights observe each step's tensor only
    (averaging constant 1), activations a moving average; with ``learn``, the observed scale only
    initialises a learned one (learned_scales.py)."""
    if isinstance(spec.observer_or_fake_quant_ctr, type) and issubclass(spec.observer_or_fake_quant_ctr,
                                                                         FakeQuantize):
        return spec
    per_channel = spec.qscheme in (torch.per_channel_symmetric, torch.per_channel_affine)
    observer = MovingAveragePerChannelMinMaxObserver if per_channel else MovingAverageMinMaxObserver
    kwargs = {"averaging_constant": 1.0} if weight else {}
    if learn:
        return replace(spec, observer_or_fake_quant_ctr=LearnedScaleFakeQuantize.with_args(
            observer=observer, weight=weight, **kwargs))
    return replace(spec, observer_or_fake_quant_ctr=ExportableFakeQuantize.with_args(observer=observer, **kwargs))


LEARN_SCALES = {"none": (False, False), "weights": (True, False), "all": (True, True)}  # (weights, activations)
DEFAULT_LEARN_SCALES = "weights"


class QatQuantizer(QlowerQuantizer):
    """The QlowerQuantizer's annotation of a model exported in training mode, with fake-quants, its
    conv -> batch norm pairs first rewritten for training (``fuse_conv_bn``)."""

    def __init__(self, config: QuantConfig, learn_scales: str = "none") -> None:
        if config.mode != "static":
            raise ConfigError("prepare_qat trains static quantization: QuantConfig(mode='static'); dynamic "
                              "quantization chooses its activation scales at run time and has nothing to learn")
        super().__init__(config, observe_weights_once=False)
        self._fused: list[FusedConvBn] = []
        self._learn_weights, self._learn_activations = LEARN_SCALES[learn_scales]

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        self._fused = fuse_conv_bn(model)  # a lone batch norm trains (and runs) in float
        return model

    def annotate(self, model: GraphModule) -> GraphModule:
        for f in self._fused:
            act = self.act_for(f.conv)
            _annotate(f.conv, {f.conv.args[0]: act, f.conv.args[1]: self.weight}, None)
            for n in (*f.between, *f.scaling):
                _annotate(n, {}, None)
            users = list(f.bn.users)
            if (len(users) == 1 and packet(users[0]) in ACTIVATIONS and _one_domain(users[0]) is None
                    and f.bn not in self._node_overrides):
                _annotate(f.bn, {}, None)
                _annotate(users[0], {}, act)
            else:
                _annotate(f.bn, {}, act)
        super().annotate(model)
        weights = {id(self.weight), id(self.weight_axis1)}
        for node in model.graph.nodes:
            ann = node.meta.get("quantization_annotation")
            if ann is None:
                continue
            ann.input_qspec_map = {a: s if s is None or isinstance(s, SharedQuantizationSpec)
                                   else self._fake_quant(s, id(s) in weights) for a, s in ann.input_qspec_map.items()}
            if isinstance(ann.output_qspec, QuantizationSpec):
                ann.output_qspec = self._fake_quant(ann.output_qspec, False)
        return model

    def _fake_quant(self, spec: QuantizationSpec, weight: bool) -> QuantizationSpec:
        return _fake_quant(spec, weight, self._learn_weights if weight else self._learn_activations)

    def prepare_obs_or_fq_callback(self, model: GraphModule, edge_or_node_to_obs_or_fq: dict) -> None:
        """Pinned values (QuantConfig.fixed) keep their scale while training: a fixed-qparams fake-quant."""
        super().prepare_obs_or_fq_callback(model, edge_or_node_to_obs_or_fq)
        swapped: dict[int, ExportableFixedQParamsFakeQuantize] = {}
        for key, obs in list(edge_or_node_to_obs_or_fq.items()):
            if type(obs) is FixedQParamsObserver:
                if id(obs) not in swapped:
                    swapped[id(obs)] = ExportableFixedQParamsFakeQuantize(observer=FixedQParamsObserver.with_args(
                        scale=float(obs.scale), zero_point=int(obs.zero_point), dtype=obs.dtype,
                        qscheme=obs.qscheme, quant_min=obs.quant_min, quant_max=obs.quant_max))
                edge_or_node_to_obs_or_fq[key] = swapped[id(obs)]


# -- conv -> batch norm, for training and folded for deployment ------------------------------

@dataclass(frozen=True)
class FusedConvBn:
    """A rewritten pair: ``conv(x, w * s)`` whose result is divided by s (``between``: the division and
    the bias's add) before ``bn``."""

    conv: Node
    between: tuple[Node, ...]
    bn: Node
    scaling: tuple[Node, ...]  # s and the scaled weight, computed from parameters: never quantized


def fuse_conv_bn(gm: GraphModule) -> list[FusedConvBn]:
    """Rewrite, in place, every conv -> batch_norm whose conv only the batch norm reads and whose weight
    is a parameter: conv(x, w) [+ b] -> bn  becomes  conv(x, w * s) / s [+ b] -> bn, with
    s = gamma / sqrt(running var + eps) computed in the graph (gradients reach gamma; the running var
    is a buffer). The function is the float one, up to float rounding."""
    fused = []
    graph = gm.graph
    for bn in list(graph.nodes):
        if bn.op != "call_function" or bn.target != aten.batch_norm.default:
            continue
        conv, gamma, _, _, var = bn.args[:5]
        if (not isinstance(conv, Node) or packet(conv) not in CONVS or len(conv.users) != 1
                or not isinstance(conv.args[1], Node) or conv.args[1].op != "get_attr"
                or not isinstance(var, Node)):
            continue
        weight, bias = conv.args[1], conv.args[2] if len(conv.args) > 2 else None
        rank = weight.meta["val"].dim()
        eps = bn.args[7]
        before = set(graph.nodes)
        with graph.inserting_before(conv):
            std = graph.call_function(aten.sqrt.default, (graph.call_function(aten.add.Tensor, (var, eps)),))
            if gamma is not None:
                s = graph.call_function(aten.div.Tensor, (gamma, std))
            else:
                s = graph.call_function(aten.reciprocal.default, (std,))
            w_scaled = graph.call_function(aten.mul.Tensor, (weight, graph.call_function(
                aten.reshape.default, (s, [-1] + [1] * (rank - 1)))))
            new_conv = graph.call_function(conv.target, (conv.args[0], w_scaled, None, *conv.args[3:]),
                                           dict(conv.kwargs))
            per_channel = [1, -1] + [1] * (rank - 2)
            y = graph.call_function(aten.div.Tensor, (new_conv, graph.call_function(
                aten.reshape.default, (s, per_channel))))
            between = [y]
            if bias is not None:
                y = graph.call_function(aten.add.Tensor, (y, graph.call_function(
                    aten.reshape.default, (bias, per_channel))))
                between.append(y)
        for n in (new_conv, *between):
            n.meta.update({k: v for k, v in conv.meta.items() if k in ("stack_trace", "nn_module_stack",
                                                                     "source_fn_stack", "val")})
        bn.replace_input_with(conv, y)
        graph.erase_node(conv)
        scaling = tuple(n for n in graph.nodes if n not in before and n is not new_conv and n not in between)
        fused.append(FusedConvBn(new_conv, tuple(between), bn, scaling))
    graph.lint()
    gm.recompile()
    return fused


def fold_conv_bn(gm: GraphModule) -> int:
    """Fold, in place, every batch norm (in eval mode) that ``fuse_conv_bn`` rewrote: bn(conv(x, w * s) / s
    [+ b]) = conv(x, w * s) + beta + (b - mean) * s, the conv's new bias computed now (float32). The
    weight's fake-quant stays where it is, so the quantized weight is the one trained. Returns how many."""
    folded = 0
    graph = gm.graph
    for bn in list(graph.nodes):
        if bn.op != "call_function" or bn.target != aten.batch_norm.default:
            continue
        y, bias = bn.args[0], None
        if isinstance(y, Node) and y.target == aten.add.Tensor and len(y.users) == 1:
            y, bias = y.args[0], y.args[1].args[0]
        if not (isinstance(y, Node) and y.target == aten.div.Tensor and len(y.users) == 1
                and isinstance(y.args[0], Node) and packet(y.args[0]) in CONVS and y.args[0].args[2] is None):
            continue
        conv = y.args[0]
        gamma, beta, mean, var = (_tensor(gm, a) for a in bn.args[1:5])
        b = _tensor(gm, bias) if bias is not None else torch.zeros_like(mean)
        s = (gamma if gamma is not None else torch.ones_like(var)) / torch.sqrt(var + bn.args[7])
        divisor = _constant_value(gm, y.args[1])
        if divisor is None or divisor.numel() != s.numel() or not torch.allclose(divisor.flatten(), s, rtol=1e-5):
            continue  # not the division by s this fold undoes: left to torchao's convert
        new_bias = (beta if beta is not None else torch.zeros_like(mean)) + (b - mean) * s
        name = f"{conv.name}_folded_bias"
        gm.register_buffer(name, new_bias.detach().clone())
        with graph.inserting_before(conv):
            bias_node = graph.get_attr(name)
        conv.args = (conv.args[0], conv.args[1], bias_node, *conv.args[3:])
        bn.replace_all_uses_with(conv)
        graph.erase_node(bn)
        folded += 1
    graph.eliminate_dead_code()
    gm.recompile()
    return folded


def _constant_value(gm: GraphModule, node: object, depth: int = 8) -> torch.Tensor | None:
    """What ``node`` computes from parameters and buffers alone (a short chain of ATen ops), else None."""
    if not isinstance(node, Node) or depth == 0:
        return node if isinstance(node, (int, float, list, tuple)) else None
    if node.op == "get_attr":
        return attribute_tensor(gm, node).detach()
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    args = []
    for a in node.args:
        v = _constant_value(gm, a, depth - 1) if isinstance(a, Node) else a
        if v is None and a is not None:
            return None
        args.append(v)
    with torch.no_grad():
        out = node.target(*args, **node.kwargs)
    return out if isinstance(out, torch.Tensor) else None


def _tensor(gm: GraphModule, node: object) -> torch.Tensor | None:
    if node is None:
        return None
    if not isinstance(node, Node) or node.op != "get_attr":
        raise ConfigError(f"a batch norm's parameters must be parameters or buffers of the model; node '{node}' "
                          f"{describe_node(node) if isinstance(node, Node) else ''} is computed")
    return attribute_tensor(gm, node).detach()


def set_training(gm: GraphModule, mode: bool = True) -> GraphModule:
    """Switch the exported graph's batch norms (batch statistics in training unless
    ``freeze_batch_norms`` was called, else running statistics) and dropouts, and the fake-quants' range
    observation (on in training unless ``freeze_ranges`` was called; off in eval, so evaluating doesn't
    move the ranges): what ``.train()`` / ``.eval()`` do on a ``prepare_qat`` model."""
    from torchao.quantization.pt2e.fake_quantize import disable_observer, enable_observer

    changed, frozen_bn = False, getattr(gm, "qlower_frozen_bn", False)
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target == aten.batch_norm.default and n.args[5] != (batch_stats := mode and not frozen_bn):
            n.args = (*n.args[:5], batch_stats, *n.args[6:])
            changed = True
        elif n.target in (aten.dropout.default, aten.feature_dropout.default) and n.args[2] != mode:
            n.args = (*n.args[:2], mode, *n.args[3:])
            changed = True
    if changed:
        gm.recompile()
    nn.Module.train(gm, mode)
    gm.apply(enable_observer if mode and not getattr(gm, "qlower_frozen", False) else disable_observer)
    return gm


def prepare_qat(model: nn.Module, example_inputs: Sequence[torch.Tensor], quant: QuantConfig | None = None,
                calibration: Sequence[Sequence[torch.Tensor]] | None = None,
                learn_scales: str | bool = DEFAULT_LEARN_SCALES) -> GraphModule:
    """A trainable copy of ``model`` with qlower's quantization as fake-quants (``quant``, default
    ``QuantConfig()``; static only), its ranges initialised on ``calibration`` (default: the example
    inputs), in training mode. Train it as usual: ``.train()`` / ``.eval()`` switch its batch norms,
    dropout and range observation; ``freeze_ranges`` stops the ranges moving. Then
    ``qlower.compile(qat_model, example_inputs, target)`` compiles it with the learned scales, without
    calibration. The batch dimension (dim 0 of every input) is exported as dynamic when the model
    allows it, so training batches and the compile's example inputs may differ in batch size.

    ``learn_scales``: ``"weights"`` (the weights' scales are parameters trained with the model, LSQ,
    initialised from min/max: learned_scales.py), ``"all"`` (the activations' too), ``"none"`` (every
    scale follows min/max: the weights' current values, the activations' moving average); ``True`` is
    ``"all"``, ``False`` ``"none"``. ``scale_parameters(model)`` lists the learned ones."""
    from qlower.frontend.arguments import check_calibration, check_example_inputs, check_model, check_quant
    from qlower.frontend.capture import _stage

    learn_scales = _check_learn_scales(learn_scales)
    quant = check_quant(quant if quant is not None else QuantConfig())
    if quant.auto_int16:
        raise ConfigError("prepare_qat takes a QuantConfig without auto_int16: set layer_dtypes (the int16 "
                          "layers) yourself, e.g. from qlower.sensitivity")
    ptq_only = {k: v for k, v in (("observer", quant.observer), ("weight_observer", quant.weight_observer),
                                  ("equalize", quant.equalize), ("bias_correction", quant.bias_correction),
                                  ("smooth", quant.smooth)) if v not in ("minmax", False, None)}
    if ptq_only:
        raise ConfigError(f"prepare_qat trains its ranges (a moving average of min/max) and the weights themselves; "
                          f"{', '.join(f'{k}={v!r}' for k, v in ptq_only.items())} set(s) post-training calibration "
                          "or weight rewrites, which QAT would silently ignore: leave them at their defaults")
    quantizer = QatQuantizer(quant, learn_scales)
    model = check_model(model)
    example_inputs = check_example_inputs(example_inputs)
    calibration = [_batch_checked(b, i, example_inputs, check_calibration)
                   for i, b in enumerate(calibration if calibration is not None else [example_inputs])]
    gm = _export_for_training(copy.deepcopy(model).train(), example_inputs)
    with warnings.catch_warnings(), _stage("prepare"):
        warnings.simplefilter("ignore")
        prepared = _prepare_qat_pt2e(gm, quantizer)
    prepared.train = types.MethodType(set_training, prepared)
    prepared.eval = types.MethodType(lambda self: set_training(self, False), prepared)
    prepared.qlower_quant = quant
    prepared.qlower_name = type(model).__name__
    # initial ranges from the calibration batches, the batch norms on their running statistics
    set_training(prepared, False)
    prepared.apply(_observe)
    with torch.no_grad():
        for batch in calibration:
            prepared(*batch)
    for fq in learned_fake_quants(prepared):
        fq.start_learning()
    prepared.qlower_learn_scales = learn_scales
    return set_training(prepared, True)


def _check_learn_scales(learn_scales: object) -> str:
    if learn_scales is True or learn_scales is False:
        return "all" if learn_scales else "none"
    if not isinstance(learn_scales, str) or learn_scales not in LEARN_SCALES:
        raise ConfigError(f"prepare_qat's learn_scales={learn_scales!r}: choose one of "
                          f"{', '.join(map(repr, LEARN_SCALES))} (or True for 'all', False for 'none')")
    return learn_scales


def _prepare_qat_pt2e(gm: GraphModule, quantizer: QatQuantizer) -> GraphModule:
    """torchao's ``prepare_qat_pt2e`` without its conv -> batch norm fusion: the quantizer did its own,
    and torchao's pattern matcher spends seconds per model finding nothing more to fuse."""
    from torchao.quantization.pt2e.prepare import prepare
    from torchao.quantization.pt2e.utils import _get_node_name_to_scope

    meta = gm.meta
    scopes = _get_node_name_to_scope(gm)
    gm = quantizer.transform_for_annotation(gm)
    quantizer.annotate(gm)
    quantizer.validate(gm)
    gm = prepare(gm, scopes, is_qat=True, obs_or_fq_callback=quantizer.prepare_obs_or_fq_callback)
    gm.meta.update(meta)
    return gm


def _batch_checked(batch: object, index: int, example: tuple[torch.Tensor, ...], check) -> tuple:
    """``batch`` checked as compile checks calibration batches, but for its batch size (dim 0), which
    may differ from the example inputs'."""
    items = (batch,) if isinstance(batch, torch.Tensor) else batch
    if isinstance(items, (tuple, list)) and len(items) == len(example):
        example = tuple(torch.empty((x.shape[0], *e.shape[1:]), dtype=e.dtype)
                        if isinstance(x, torch.Tensor) and x.dim() == e.dim() > 0 else e for x, e in zip(items, example))
    try:
        return check([batch], example)[0]
    except QlowerError as e:
        raise type(e)(str(e).replace("calibration batch 0", f"calibration batch {index}")) from None


def _observe(module: nn.Module) -> None:
    from torchao.quantization.pt2e.fake_quantize import enable_observer

    enable_observer(module)


def _export_for_training(model: nn.Module, example_inputs: tuple[torch.Tensor, ...]) -> GraphModule:
    """torch.export in training mode, the batch dimension dynamic when the model allows it; ops without an
    import rule decomposed as ``compile`` does (nothing is folded: parameters stay trainable)."""
    from qlower.errors import UnsupportedOpError
    from qlower.frontend.decompose import decompose_unruled
    from qlower.frontend.rules import has_rule

    errors = []
    for dynamic in (True, False):
        shapes = tuple({0: torch.export.Dim.AUTO} if x.dim() else None for x in example_inputs) if dynamic else None
        # (a batch of 1 would be specialised: exported with two copies of it)
        args = tuple(torch.cat([x, x]) if dynamic and x.dim() and x.shape[0] == 1 else x for x in example_inputs)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                program = torch.export.export(model, args, dynamic_shapes=shapes, strict=False)
            return decompose_unruled(program.module(check_guards=False), lambda t: has_rule(t, True))
        except Exception as e:  # noqa: BLE001  (export raises many unrelated types)
            errors.append(f"{'dynamic' if dynamic else 'static'} batch: {type(e).__name__}: {str(e)[:600]}")
    raise UnsupportedOpError(f"torch.export could not capture {type(model).__name__} for training:\n"
                             + "\n".join(errors))


def freeze_ranges(model: GraphModule) -> GraphModule:
    """Stop the fake-quants of a ``prepare_qat`` model observing, and its learned scales learning: the
    scales stay where training left them, also through later ``.train()`` calls (the last epochs usually
    train with frozen ranges)."""
    from torchao.quantization.pt2e.fake_quantize import disable_observer

    model.qlower_frozen = True
    model.apply(disable_observer)
    for fq in learned_fake_quants(model):
        fq.stop_learning()
    return model


def freeze_batch_norms(model: GraphModule) -> GraphModule:
    """Make the batch norms of a ``prepare_qat`` model normalise with their running statistics, also
    through later ``.train()`` calls, and stop updating them: training then sees the conv folded exactly
    as deployment folds it (``fold_conv_bn``), and batch noise no longer moves the statistics the fold
    uses. Usual after the first steps of fine-tuning a trained model (its statistics are already right)."""
    model.qlower_frozen_bn = True
    return set_training(model, model.training)
