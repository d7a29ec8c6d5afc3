"""The PT2E quantizer: a torchao ``Quantizer`` that annotates an exported graph from a QuantConfig.

It only says *what* is quantized and how; torchao's observers measure ranges
and ``convert_pt2e`` writes the q/dq nodes that the importer folds into IR types.

Static mode (``QuantConfig.mode == "static"``):
- conv1d / conv2d / linear: input activation, int8 symmetric weights per output
  channel (or per tensor), bias left float (the importer quantizes it to int32
  with scale ``s_in * s_w[c]``; a weight scale is widened where the bias would not
  fit int32 at it, bias_fit.py). A single relu / relu6 / hardtanh / clamp user is
  fused: no q/dq between the op and the activation.
- add / sub / mul / div: activation operands quantized, constant operands (buffers,
  parameters, literals) left float so the importer can represent them exactly. An op reading or
  giving an integer tensor is left alone: it keeps PyTorch's integer semantics (rules/integer.py).
- concat and pass-through ops (reshape, permute, max_pool2d, slice, pad, ...) share
  one quantization domain with their inputs (SharedQuantizationSpec); pass-through
  ops on constants are left alone (the constant is quantized where it is used).
- pooling, reductions, softmax and pointwise non-linearities own their output domain.
- amax / amin / max / min keep their input's domain; argmax / argmin (and max.dim's indices) only
  quantize their input; LayerNorm / GroupNorm / InstanceNorm (native_* ops) quantize their input and
  their normalised result; a BatchNorm not folded into a conv / linear becomes ``channel_affine``
  (frontend/channel_affine.py), which owns its output domain.
- minimum, maximum, where, clamp by tensors and comparisons: the tensor operands (and the
  result, but for a comparison's bools) share one domain; constant operands stay float.
- a value that is NaN or infinite on the calibration data (finite.py) is not quantized, nor is
  any op reading it: no scale holds it, and a NaN may be what a later op relies on.
- attention masks (masks.py: fills at or below -1e30, ``-inf`` or ``torch.finfo(dtype).min``, in
  ``where`` / ``masked_fill`` / ``(1 - mask) * fill``, added to scores, scaled by positive numbers) are
  never quantized: the scores they mask are quantized where the mask meets them, the masked values stay
  float, and a softmax reading them quantizes only its result (rules/softmax.py reads the scores' codes
  and the mask). Any other op reading masked values is left float, and so is what reads its result.
- ``QuantConfig.fixed`` pins the observer of a value (and of its whole sharing
  group) to fixed qparams.

Dynamic mode: only conv / linear / matmul inputs are quantized, at run time,
symmetrically in ``[-act_qmax, act_qmax]`` (the IR's ``dynamic_quantize``;
``act_qmin`` is not used). With
``granularity="per_row"``, linear and matmul left operands get one scale per
token and 1x1 stride-1 convs one per pixel; other convs stay per tensor (a
kxk window mixes pixels, so a per-pixel scale would not factor out of the sum).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import replace

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.granularity import PerBlock, PerToken
from torchao.quantization.pt2e import (
    FixedQParamsObserver,
    MinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)
from torchao.quantization.pt2e._affine_quantization import AffineQuantizedPlaceholderObserver
from torchao.quantization.pt2e.observer import MappingType
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
    SharedQuantizationSpec,
)

from qlower.errors import InputError
from qlower.frontend.bias_fit import fit_biases
from qlower.frontend.channel_affine import replace_unfolded_batch_norm
from qlower.frontend.config import INT16_ACT_RANGE, FixedQParams, QuantConfig
from qlower.frontend.constants import written_nodes
from qlower.frontend.masks import masked
from qlower.frontend.observers import (
    PerChannelWeightMSEObserver,
    WeightMSEObserver,
    activation_observer,
    weight_observer,
)
from qlower.frontend.source import module_paths

aten = torch.ops.aten

GEMM = {aten.conv1d, aten.conv2d, aten.linear}
# weights whose output channels are axis 1: transposed convs ([in, out/groups, k...]) and addmm's mat2 [K, N]
GEMM_AXIS1 = {aten.conv_transpose1d, aten.conv_transpose2d, aten.addmm}
MATMUL = {aten.matmul, aten.bmm, aten.mm}
ACTIVATIONS = {aten.relu, aten.relu_, aten.relu6, aten.hardtanh, aten.hardtanh_, aten.clamp}
BINARY = {aten.add, aten.add_, aten.sub, aten.sub_, aten.mul, aten.mul_, aten.div, aten.div_}
CONCAT = {aten.cat, aten.concat, aten.stack}
SHARED = {
    aten.view, aten.reshape, aten._unsafe_view, aten.flatten, aten.permute, aten.transpose, aten.t,
    aten.max_pool2d, aten.slice, aten.select, aten.select_copy, aten.pad, aten.constant_pad_nd, aten.squeeze,
    aten.unsqueeze, aten.alias, aten.contiguous, aten.clone, aten.dropout, aten.expand, aten.detach, aten.unflatten,
    aten.upsample_nearest2d,
}
# more data movement (rules/indexing.py, rules/movement.py): the result keeps its input's domain
SHARED |= {aten.flip, aten.roll, aten.repeat, aten.index_select, aten.index, aten.gather, aten.reflection_pad1d,
           aten.reflection_pad2d, aten.replication_pad1d, aten.replication_pad2d}
# several results, read through getitem nodes, each in the input's domain
SPLIT = {aten.split, aten.split_with_sizes, aten.split_copy, aten.split_with_sizes_copy, aten.unbind}
# a constant table read at integer ids: the table quantized per tensor, the rows read keep its domain
LOOKUP = {aten.embedding}
OWN_OUTPUT = {
    aten.avg_pool2d, aten.adaptive_avg_pool2d, aten.adaptive_avg_pool1d, aten.mean, aten.sum, aten.softmax,
    aten._softmax, aten.sigmoid, aten.tanh, aten.hardswish, aten.hardswish_, aten.hardsigmoid, aten.gelu,
    aten.silu, aten.exp, aten.elu, aten.leaky_relu, aten.upsample_bilinear2d,
}
# unary ops imported as lookup tables (rules/pointwise.py) and log_softmax: own input and output domains
OWN_OUTPUT |= {
    aten.abs, aten.abs_, aten.neg, aten.neg_, aten.sqrt, aten.sqrt_, aten.rsqrt, aten.rsqrt_, aten.log, aten.log_,
    aten.reciprocal, aten.reciprocal_, aten.exp_, aten.pow, aten.pow_, aten.leaky_relu_, aten.elu_, aten.gelu_,
    aten.silu_, aten.mish, aten.mish_, aten.hardsigmoid_, aten.softplus, aten.celu, aten.celu_, aten.selu,
    aten.selu_, aten.sigmoid_, aten.tanh_, aten.log_sigmoid, aten.log_softmax, aten._log_softmax,
}

# reductions and normalisation (rules/reductions.py, rules/normalization.py): amax / amin (and max / min
# without dim) return one of their input's codes, argmax / argmin an index (only the input is quantized),
# max.dim / min.dim both (values in the input's domain); var and an unfolded BatchNorm own their output
SHARED |= {aten.amax, aten.amin}
ORDER_INDEX = {aten.argmax, aten.argmin}
EXTREMES = {aten.max, aten.min}
OWN_OUTPUT |= {aten.var, torch.ops.qlower.channel_affine}  # channel_affine: an unfolded BatchNorm
NORMS = {aten.native_layer_norm, aten.native_group_norm, aten._native_batch_norm_legit}  # results (out, ...)


SOFTMAX = {aten.softmax, aten._softmax}
COMPARE = {aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge}


def packet(node: Node):
    """The OpOverloadPacket of an aten call (so .default/.Tensor/.int overloads match alike)."""
    return getattr(node.target, "overloadpacket", None) if node.op == "call_function" else None


def _is_float(x: object) -> bool:
    """A node that may hold a float tensor (integer ids, indices and masks are never quantized)."""
    if not isinstance(x, Node):
        return False
    val = x.meta.get("val")
    return not isinstance(val, torch.Tensor) or val.dtype.is_floating_point


def _one_domain(node: Node, const: object = ()) -> tuple[list[Node], bool] | None:
    """Ops whose tensor operands share one domain (rules/compare.py): (those operands, whether the result
    shares it too; comparisons give bools). None for any other op. Constant operands (in ``const``) stay
    float: the importer quantizes them into the domain (exact for a pick or a comparison)."""
    p, target = packet(node), node.target
    if p in (aten.minimum, aten.maximum):
        operands, output = node.args[:2], True
    elif target == aten.where.self:
        if masked(node) is not None:  # a mask fill has no code (masks.py): left float
            return None
        operands, output = node.args[1:3], True
    elif p is aten.clamp and any(isinstance(a, Node) for a in (*node.args[1:], *node.kwargs.values())):
        operands, output = (node.args[0], *node.args[1:], *node.kwargs.values()), True
    elif p in COMPARE:
        operands, output = node.args[:2], False
    else:
        return None
    tensors = [a for a in operands if _is_float(a) and a not in const]
    return (tensors, output) if tensors else None


def _annotate(node: Node, inputs: dict[Node, object], output: object = None, share: bool = True) -> None:
    node.meta["quantization_annotation"] = QuantizationAnnotation(
        input_qspec_map=inputs, output_qspec=output, allow_implicit_sharing=share, _annotated=True)


class _ObserveOnce:
    """Observes the first tensor it is shown only. For a weight read straight from a parameter or
    buffer that no op writes, every calibration batch shows the same tensor, and per-channel
    min/max over a wide layer's weights costs about as much as the layer itself."""

    _observed = False

    def forward(self, x):
        if self._observed:
            return x
        self._observed = True
        return super().forward(x)


class OnceMinMaxObserver(_ObserveOnce, MinMaxObserver):
    pass


class OncePerChannelMinMaxObserver(_ObserveOnce, PerChannelMinMaxObserver):
    pass


class OnceWeightMSEObserver(_ObserveOnce, WeightMSEObserver):
    pass


class OncePerChannelWeightMSEObserver(_ObserveOnce, PerChannelWeightMSEObserver):
    pass


def _observe_once(spec: QuantizationSpec) -> QuantizationSpec:
    ctr = {MinMaxObserver: OnceMinMaxObserver, PerChannelMinMaxObserver: OncePerChannelMinMaxObserver,
           WeightMSEObserver: OnceWeightMSEObserver, PerChannelWeightMSEObserver: OncePerChannelWeightMSEObserver}
    return replace(spec, observer_or_fake_quant_ctr=ctr[spec.observer_or_fake_quant_ctr])


class _Constants:
    """Which nodes compute a constant (no graph input upstream), memoized in graph order."""

    def __init__(self, gm: GraphModule) -> None:
        self.const: set[Node] = set()
        for n in gm.graph.nodes:
            if n.op == "get_attr" or (n.op == "call_function" and all(a in self.const for a in n.all_input_nodes)):
                self.const.add(n)

    def __contains__(self, node: object) -> bool:
        return node in self.const


class QlowerQuantizer(Quantizer):
    """Annotates an exported (pre-dispatch ATen) graph according to ``config``."""

    def __init__(self, config: QuantConfig, observe_weights_once: bool = True) -> None:
        super().__init__()
        self.config = c = config
        self.observe_weights_once = observe_weights_once
        self._written: set[Node] = set()  # nodes ops write in place, found when annotating
        act_observer = activation_observer(c.observer, c.percentile)  # observers.py: range setting
        w_observer = weight_observer(c.weight_observer, c.per_channel)
        self.act = QuantizationSpec(
            dtype=torch.int8, quant_min=c.act_qmin, quant_max=c.act_qmax,
            qscheme=torch.per_tensor_symmetric if c.symmetric_acts else torch.per_tensor_affine,
            observer_or_fake_quant_ctr=act_observer)
        if c.per_channel:
            self.weight = QuantizationSpec(
                dtype=torch.int8, quant_min=c.weight_qmin, quant_max=c.weight_qmax,
                qscheme=torch.per_channel_symmetric, ch_axis=0, observer_or_fake_quant_ctr=w_observer)
        else:
            self.weight = QuantizationSpec(
                dtype=torch.int8, quant_min=c.weight_qmin, quant_max=c.weight_qmax,
                qscheme=torch.per_tensor_symmetric, observer_or_fake_quant_ctr=w_observer)
        self.weight_axis1 = self.weight
        if c.per_channel:
            self.weight_axis1 = QuantizationSpec(
                dtype=torch.int8, quant_min=c.weight_qmin, quant_max=c.weight_qmax,
                qscheme=torch.per_channel_symmetric, ch_axis=1, observer_or_fake_quant_ctr=w_observer)
        self.act16 = QuantizationSpec(
            dtype=torch.int16, quant_min=INT16_ACT_RANGE[0], quant_max=INT16_ACT_RANGE[1],
            qscheme=torch.per_tensor_symmetric, observer_or_fake_quant_ctr=act_observer)
        self.dyn_qmax = c.act_qmax
        self._node_overrides: dict[Node, FixedQParams] = {}
        self._edge_overrides: dict[tuple[Node, Node], FixedQParams] = {}
        self.keep_float: set[str] = set()  # nodes with non-finite results, and their users: left float

    # -- dynamic specs -------------------------------------------------------------------
    def _dynamic_per_tensor(self) -> QuantizationSpec:
        return QuantizationSpec(
            dtype=torch.int8, quant_min=-self.dyn_qmax, quant_max=self.dyn_qmax,
            qscheme=torch.per_tensor_symmetric, is_dynamic=True, observer_or_fake_quant_ctr=PlaceholderObserver)

    def _dynamic_blocked(self, granularity) -> QuantizationSpec:
        return QuantizationSpec(
            dtype=torch.int8, quant_min=-self.dyn_qmax, quant_max=self.dyn_qmax, is_dynamic=True,
            observer_or_fake_quant_ctr=AffineQuantizedPlaceholderObserver.with_args(
                mapping_type=MappingType.SYMMETRIC, target_dtype=torch.int8, granularity=granularity,
                eps=torch.finfo(torch.float32).eps, scale_dtype=torch.float32, zero_point_dtype=torch.int32))

    def _dynamic_input_spec(self, node: Node) -> QuantizationSpec:
        if self.config.granularity != "per_row":
            return self._dynamic_per_tensor()
        p = packet(node)
        if p in MATMUL or p is aten.linear:
            return self._dynamic_blocked(PerToken())
        x, w = node.args[0], node.args[1]
        args = node.normalized_arguments(node.graph.owning_module, normalize_to_only_use_kwargs=True)
        kw = args.kwargs if args is not None else {}
        padding = kw.get("padding", [0])
        pointwise = (all(k == 1 for k in w.meta["val"].shape[2:])  # 1x1: 'same' pads nothing either
                     and all(s == 1 for s in kw.get("stride", [1]))
                     and (isinstance(padding, str) or all(p == 0 for p in padding)))
        if not pointwise:
            return self._dynamic_per_tensor()
        shape = x.meta["val"].shape
        return self._dynamic_blocked(PerBlock((1, shape[1]) + (1,) * (len(shape) - 2)))

    # -- annotation ----------------------------------------------------------------------
    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """BatchNorms left unfolded (batch_norm_fold.py) become ``channel_affine`` (see channel_affine.py)."""
        return replace_unfolded_batch_norm(model) if self.config.mode == "static" else model

    def annotate(self, model: GraphModule) -> GraphModule:
        self._written = written_nodes(model)
        self._resolve_overrides(model)
        self._check_layer_dtypes(model)
        if self.config.mode == "dynamic":
            self._annotate_dynamic(model)
        else:
            self._annotate_static(model)
        return model

    def _annotate_dynamic(self, model: GraphModule) -> None:
        # No implicit sharing: torchao's convert can't give one run-time quantize several consumers.
        const = _Constants(model)
        for n in model.graph.nodes:
            p = packet(n)
            if p in GEMM and isinstance(n.args[1], Node) and n.args[1] in const:  # a run-time weight stays float
                _annotate(n, {n.args[0]: self._dynamic_input_spec(n), n.args[1]: self._weight(n.args[1], self.weight)},
                          share=False)
            elif p in MATMUL and all(isinstance(a, Node) and a not in const for a in n.args[:2]):
                # (a constant operand has no run-time scale to choose: such a matmul stays float)
                _annotate(n, {n.args[0]: self._dynamic_input_spec(n), n.args[1]: self._dynamic_per_tensor()},
                          share=False)

    def _fusable_activation(self, node: Node) -> Node | None:
        if node in self._node_overrides or len(node.users) != 1:
            return None
        user = next(iter(node.users))
        return user if packet(user) in ACTIVATIONS and _one_domain(user) is None else None

    def _weight(self, node: Node, spec: QuantizationSpec) -> QuantizationSpec:
        """``spec``, observed once when ``node`` is a parameter or buffer nothing writes."""
        once = self.observe_weights_once and node.op == "get_attr" and node not in self._written
        return _observe_once(spec) if once else spec

    def act_for(self, node: Node) -> QuantizationSpec:
        """The activation spec of ``node``'s result and of the inputs it reads: int16 or int8 by its module."""
        return self.act16 if self.config.act_dtype_of(module_paths(node)) == "int16" else self.act

    def _annotate_masks(self, model: GraphModule) -> set[Node]:
        """Mask values (masks.py) left float, the scores they mask quantized where the mask meets them;
        the nodes computing masks are returned."""
        chains: set[Node] = set()
        for n in model.graph.nodes:
            found = masked(n) if n.op == "call_function" and n not in chains else None
            if found is None:
                continue
            chains.update(found.chain)
            for c in found.chain:
                if found.scores is not None and found.scores in c.args and _is_float(found.scores):
                    _annotate(c, {found.scores: self.act_for(c)})
                elif "quantization_annotation" not in c.meta:
                    _annotate(c, {})
        return chains

    def _annotate_static(self, model: GraphModule) -> None:
        const = _Constants(model)
        masks = self._annotate_masks(model)
        for n in model.graph.nodes:
            p = packet(n)
            if p is None or "quantization_annotation" in n.meta:
                continue
            act = self.act_for(n)
            if n.name in self.keep_float or any(a.name in self.keep_float for a in n.all_input_nodes):
                continue  # NaN or inf on the calibration data: no quantization can hold it
            if any(a in masks for a in n.all_input_nodes):
                if p in SOFTMAX and _is_float(n.args[0]):
                    _annotate(n, {}, act)  # its result is finite; rules/softmax.py reads the scores and mask
                else:
                    masks.add(n)  # any other op on masked values: left float, and what it computes too
                continue
            if p in GEMM:
                if not isinstance(n.args[1], Node) or n.args[1] not in const:
                    continue  # weight computed at run time: left float (the importer reports it)
                fused = self._fusable_activation(n)
                _annotate(n, {n.args[0]: act, n.args[1]: self._weight(n.args[1], self.weight)}, None if fused else act)
                if fused is not None:
                    _annotate(fused, {}, act)
            elif p in GEMM_AXIS1:
                x, w = (n.args[1], n.args[2]) if p is aten.addmm else (n.args[0], n.args[1])
                if not isinstance(w, Node) or w not in const or not isinstance(x, Node):
                    continue  # weight computed at run time: left float
                fused = self._fusable_activation(n)
                _annotate(n, {x: act, w: self._weight(w, self.weight_axis1)}, None if fused else act)
                if fused is not None:
                    _annotate(fused, {}, act)
            elif p in MATMUL:
                _annotate(n, {a: act for a in n.args[:2] if isinstance(a, Node)}, act)
            elif p in BINARY and n not in const:  # constant arithmetic is folded at import
                if not all(_is_float(a) for a in (n, *n.args[:2]) if isinstance(a, Node)):
                    continue  # integer tensors keep PyTorch's integer semantics (rules/integer.py)
                inputs = {a: act for a in n.args[:2] if isinstance(a, Node) and a not in const}
                fused = self._fusable_activation(n) if p not in (aten.mul, aten.mul_, aten.div, aten.div_) else None
                _annotate(n, inputs, None if fused else act)
                if fused is not None:
                    _annotate(fused, {}, act)
            elif n not in const and _one_domain(n, const) is not None:
                tensors, shares_output = _one_domain(n, const)
                shared = SharedQuantizationSpec((tensors[0], n))
                _annotate(n, {a: act if i == 0 else shared for i, a in enumerate(tensors)},
                          shared if shares_output else None)
            elif p in CONCAT:
                tensors = [a for a in n.args[0] if isinstance(a, Node)]
                shared = SharedQuantizationSpec((tensors[0], n))
                _annotate(n, {a: act if i == 0 else shared for i, a in enumerate(tensors)}, shared)
            elif p in EXTREMES or p in ORDER_INDEX:
                self._annotate_extreme(n, const)
            elif p in NORMS and _is_float(n.args[0]) and n not in const:
                _annotate(n, {n.args[0]: act})  # its normalised result (getitem 0) owns its domain
                for item in n.users:
                    if item.op == "call_function" and item.target is operator.getitem and item.args[1] == 0:
                        _annotate(item, {}, act)
            elif p in SHARED:
                x = n.args[0]
                if _is_float(x) and n not in const:  # constants stay float until a consumer quantizes
                    _annotate(n, {x: act}, SharedQuantizationSpec((x, n)))
            elif p in SPLIT:
                x = n.args[0]
                if _is_float(x) and n not in const:
                    _annotate(n, {x: act})
                    for item in n.users:
                        if item.op == "call_function" and item.target is operator.getitem:
                            _annotate(item, {}, SharedQuantizationSpec((x, n)))
            elif p in LOOKUP:
                table = n.args[0]
                if _is_float(table) and table in const and n not in const:
                    _annotate(n, {table: act}, SharedQuantizationSpec((table, n)))
            elif (p in ACTIVATIONS or p in OWN_OUTPUT) and _is_float(n.args[0]):
                _annotate(n, {n.args[0]: act}, act)

    def _annotate_extreme(self, n: Node, const: _Constants) -> None:
        """argmax / argmin, max / min (whole tensor or along a dim): the input quantized; a value result
        shares its domain (through the getitem of ``max.dim``), an index result stays an integer."""
        x, name = n.args[0], n.target._overloadname
        if not _is_float(x) or n in const or name not in ("default", "dim"):
            return  # max.other / min.other (elementwise) are left alone
        act = self.act_for(n)
        if packet(n) in ORDER_INDEX:
            _annotate(n, {x: act})
        elif name == "default":
            _annotate(n, {x: act}, SharedQuantizationSpec((x, n)))
        else:
            _annotate(n, {x: act})
            for item in n.users:
                if item.op == "call_function" and item.target is operator.getitem and item.args[1] == 0:
                    _annotate(item, {}, SharedQuantizationSpec((x, n)))

    # -- fixed overrides -----------------------------------------------------------------
    def _resolve_overrides(self, model: GraphModule) -> None:
        self._node_overrides, self._edge_overrides = {}, {}
        nodes = list(model.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        for key, fixed in self.config.fixed.items():
            if key == "output":
                out = next(n for n in nodes if n.op == "output")
                for n in out.all_input_nodes:
                    self._node_overrides[n] = fixed
            elif key == "input" or key.startswith("input:"):
                index = 0 if key == "input" else _int_suffix(key)
                if not 0 <= index < len(placeholders):
                    raise InputError(f"QuantConfig.fixed[{key!r}]: the model has {len(placeholders)} input(s)")
                ph = placeholders[index]
                for user in ph.users:
                    self._edge_overrides[(ph, user)] = fixed
            else:
                targets = list(_module_outputs(nodes, key))
                if not targets:
                    known = sorted({m for n in nodes for m in module_paths(n) if m})
                    raise InputError(f"QuantConfig.fixed[{key!r}]: no module with that qualified name produces a "
                                     f"value in the exported graph; modules: {', '.join(known[:30])}")
                for n in targets:
                    self._node_overrides[n] = fixed

    def _check_layer_dtypes(self, model: GraphModule) -> None:
        """Every module named in ``layer_dtypes`` must hold an op of the graph (a typo would change nothing)."""
        known = {m for n in model.graph.nodes for m in module_paths(n) if m}
        for key in self.config.layer_dtypes:
            if key not in known:
                raise InputError(f"QuantConfig.layer_dtypes[{key!r}]: no module with that qualified name holds an op "
                                 f"of the exported graph; modules: {', '.join(sorted(known)[:30])}")

    def validate(self, model: GraphModule) -> None:
        for n in self._node_overrides:
            ann = n.meta.get("quantization_annotation")
            if ann is None or ann.output_qspec is None:
                raise InputError(f"QuantConfig.fixed: value '{n.name}' ({n.target}) is not quantized, so its "
                                 f"quantization can't be pinned; pin a quantized neighbour instead")

    def prepare_obs_or_fq_callback(self, model: GraphModule, edge_or_node_to_obs_or_fq: dict) -> None:
        """Swap the observer of every pinned value, for its whole sharing group; then give each gemm's
        weight a scale its bias fits at (bias_fit.py)."""
        pinned = [(self._node_overrides[k], k) for k in self._node_overrides]
        pinned += [(self._edge_overrides[k], k) for k in self._edge_overrides]
        for (scale, zero_point, qmin, qmax), key in pinned:
            old = edge_or_node_to_obs_or_fq.get(key)
            if old is None:
                continue
            # the value's own code type (int16 under A16W8), which the pinned range must fit
            dtype = getattr(old, "dtype", torch.int8)
            codes = torch.iinfo(dtype)
            if not codes.min <= qmin < qmax <= codes.max:
                raise InputError(f"QuantConfig.fixed: value {_describe(key)} is quantized to {str(dtype)[6:]} codes "
                                 f"[{codes.min}, {codes.max}]; the pinned range [{qmin}, {qmax}] doesn't fit them")
            new = FixedQParamsObserver(scale=scale, zero_point=zero_point, dtype=dtype,
                                       qscheme=torch.per_tensor_affine, quant_min=qmin, quant_max=qmax)
            for k, v in list(edge_or_node_to_obs_or_fq.items()):
                if v is old:
                    edge_or_node_to_obs_or_fq[k] = new
        fit_biases(model, edge_or_node_to_obs_or_fq)  # weight scales widened where a bias would pass int32


def _describe(key) -> str:
    """A pinned node, or an edge (producer, user), as the exported graph names it."""
    if isinstance(key, tuple):
        return f"'{key[0].name}' (into '{key[1].name}')"
    return f"'{key.name}'"


def _int_suffix(key: str) -> int:
    try:
        return int(key.split(":", 1)[1])
    except ValueError:
        raise InputError(f"QuantConfig.fixed: bad key {key!r}; use 'input:N' with N an integer") from None


def _module_outputs(nodes: Iterable[Node], path: str) -> Iterable[Node]:
    """Compute nodes inside module ``path`` whose result leaves it (the module's outputs)."""
    def inside(n: Node) -> bool:
        return path in module_paths(n)
    for n in nodes:
        if n.op == "call_function" and inside(n) and any(not inside(u) or u.op == "output" for u in n.users):
            yield n
