"""A model quantized before it reaches qlower: torchao's ``convert_pt2e`` output (any quantizer), or a
QAT model prepared with ``prepare_qat_pt2e`` (``qlower.prepare_qat`` or another quantizer's), converted here.

Its quantize / dequantize nodes are taken as given: nothing is observed, calibrated or re-quantized.
What qlower's programs can't hold exactly is refused before import, naming the node, the user's source
line and what the target takes (``check_quantization``): per-channel activations, activation codes
other than int8 / int16, weights that are not symmetric int8 or quantized per channel along another axis
than the output channels, an int32 bias at another scale than ``s_in * s_w``. Nothing is silently changed:
an int32 bias at exactly ``s_in * s_w`` is handed to the importer as its float value, which the importer
quantizes back to the same codes.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.fx import GraphModule, Node

from qlower.errors import ConfigError, InputError, UnsupportedOpError
from qlower.frontend.bias_rounding import round_biases
from qlower.frontend.constants import attribute_tensor
from qlower.frontend.source import describe_node

ACTIVATION_DTYPES = (torch.int8, torch.int16)


@functools.cache
def _ops() -> dict[str, set]:
    """The q/dq ops by kind (looked up when first needed: torchao registers them on import)."""
    import torchao  # noqa: F401  (registers torch.ops.quantized_decomposed and torch.ops.torchao)

    qd, ao = torch.ops.quantized_decomposed, torch.ops.torchao
    return {
        "quantize": {qd.quantize_per_tensor.default, qd.quantize_per_tensor.tensor, qd.quantize_per_channel.default},
        "dequantize": {qd.dequantize_per_tensor.default, qd.dequantize_per_tensor.tensor,
                       qd.dequantize_per_channel.default},
        "per_channel": {qd.quantize_per_channel.default, qd.dequantize_per_channel.default},
        "affine": {ao.quantize_affine.default, ao.dequantize_affine.default},
    }


def _is_qdq(node: Node) -> bool:
    ops = _ops()
    return node.op == "call_function" and (node.target in ops["quantize"] or node.target in ops["dequantize"]
                                           or node.target in ops["affine"])


def _torchao_modules(model: nn.Module) -> tuple[bool, bool]:
    """(holds fake-quant modules, holds observers): a QAT-prepared or a PTQ-prepared PT2E model."""
    from torchao.quantization.pt2e.fake_quantize import FakeQuantizeBase
    from torchao.quantization.pt2e.observer import ObserverBase

    mods = list(model.modules())
    return any(isinstance(m, FakeQuantizeBase) for m in mods), any(isinstance(m, ObserverBase) for m in mods)


def quantized_form(model: object) -> str | None:
    """``"converted"`` (q/dq nodes from convert_pt2e), ``"qat"`` (fake-quant modules from prepare_qat_pt2e),
    ``"observed"`` (observers of prepare_pt2e, not yet converted) or None: a float model."""
    if not isinstance(model, GraphModule):
        return None
    fake_quant, observers = _torchao_modules(model)
    if fake_quant:
        return "qat"
    if observers:
        return "observed"
    return "converted" if any(_is_qdq(n) for n in model.graph.nodes) else None


def convert_qat(model: GraphModule) -> GraphModule:
    """A converted copy of the QAT-prepared ``model`` (left as it is: training may go on): batch norms
    in eval mode and folded into their convs, each fake-quant's learned scale and zero point written
    as q/dq nodes, the weights quantized."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    from qlower.frontend.qat import fold_conv_bn, set_training
    from qlower.frontend.quantize_fold import fold_constant_quantize

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = copy.deepcopy(model)
        set_training(converted, False)
        fold_conv_bn(converted)  # (torchao's convert folds what is left, slowly: pattern matching)
        converted = convert_pt2e(converted, fold_quantize=False)
        fold_constant_quantize(converted)
    return converted


def _static(gm: GraphModule, example_inputs: Sequence[torch.Tensor]) -> GraphModule:
    """``gm`` exported again for the example inputs' shapes when it was exported with a dynamic one
    (prepare_qat's batch dimension); the nodes keep their source lines and module paths."""
    shapes = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    if all(not isinstance(v, torch.Tensor) or all(isinstance(d, int) for d in v.shape) for v in shapes):
        return gm
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.export(gm, tuple(example_inputs), strict=False).module(check_guards=False)
    except Exception as e:  # noqa: BLE001  (export raises many unrelated types)
        raise UnsupportedOpError(f"exporting the quantized model for the example inputs' shapes failed: "
                                 f"{type(e).__name__}: {str(e)[:2000]}") from e


def float_version(gm: GraphModule) -> GraphModule:
    """A copy of the converted ``gm`` with its activations' quantize -> dequantize pairs removed: the model
    the user quantized, but with the weights it was given (dequantized), as no float weights are left."""
    ops = _ops()
    out = copy.deepcopy(gm)
    for node in list(out.graph.nodes):
        if node.op == "call_function" and node.target in ops["dequantize"]:
            q = node.args[0]
            if isinstance(q, Node) and q.op == "call_function" and q.target in ops["quantize"]:
                node.replace_all_uses_with(q.args[0])
    out.graph.eliminate_dead_code()
    out.recompile()
    return out


# -- what a program holds ------------------------------------------------------------------

_GEMM_OUTPUT_AXIS = {"conv1d": 0, "conv2d": 0, "conv3d": 0, "linear": 0, "conv_transpose1d": 1,
                     "conv_transpose2d": 1, "conv_transpose3d": 1}


def _params(node: Node) -> dict:
    """A q/dq node's arguments by name (input, scale(s), zero_point(s), [axis], quant_min, quant_max, dtype)."""
    names = (("input", "scales", "zero_points", "axis", "quant_min", "quant_max", "dtype")
             if node.target in _ops()["per_channel"]
             else ("input", "scale", "zero_point", "quant_min", "quant_max", "dtype"))
    values = dict(zip(names, node.args))
    values.update(node.kwargs)
    return values


def _constant(gm: GraphModule, node: object) -> torch.Tensor | None:
    """The tensor a get_attr node reads, else None."""
    if not isinstance(node, Node) or node.op != "get_attr":
        return None
    try:
        return attribute_tensor(gm, node)
    except LookupError:
        return None


def _gemm_reader(node: Node) -> tuple[Node, str, int] | None:
    """(the conv / linear reading ``node``, its op name, the argument position) when one does."""
    for user in node.users:
        name = getattr(getattr(user.target, "overloadpacket", None), "__name__", "")
        if user.op == "call_function" and name in _GEMM_OUTPUT_AXIS:
            for i, a in enumerate(user.args):
                if a is node:
                    return user, name, i
    return None


class _Refusal:
    """Builds the error for a q/dq node: what the user chose, and what ``target`` takes."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __call__(self, node: Node, chose: str, takes: str) -> UnsupportedOpError:
        where = describe_node(_located(node))
        return UnsupportedOpError(
            f"{node.target} (node '{node.name}') {where}: the model's quantization has {chose}, which target "
            f"'{self.target}' can't hold; it takes {takes}. qlower takes a quantized model's choices as given "
            "and changes none: quantize it so (or compile the float model and let qlower quantize it)")


def _located(node: Node) -> Node:
    """``node``, or the nearest node with a source line (PT2E's q/dq nodes often have none)."""
    from qlower.frontend.context import _located as located

    return located(node)


ACTIVATIONS_TAKEN = "activations quantized per tensor (one scale and zero point) as int8 or int16 codes"
WEIGHTS_TAKEN = ("int8 weights, symmetric (zero point 0), per tensor or per output channel (axis 0 of a "
                 "conv / linear weight, axis 1 of a transposed conv's)")


def check_quantization(gm: GraphModule, target: str) -> None:
    """Refuse (UnsupportedOpError naming the node and source line) every quantization choice in ``gm``
    that a program for ``target`` can't hold exactly; rewrite an int32 bias at scale ``s_in * s_w`` to
    its float value (the importer quantizes it back to the same codes). Dynamic quantization
    (choose_qparams) is left to the importer's rules."""
    ops = _ops()
    refuse = _Refusal(target)
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in ops["affine"]:
            scale = node.args[2] if len(node.args) > 2 else None
            if not (isinstance(scale, Node) and "choose_qparams" in str(scale.target)):
                raise refuse(node, "static torchao affine (block-wise) quantization", ACTIVATIONS_TAKEN + "; "
                             + WEIGHTS_TAKEN)
            continue
        if node.target not in ops["quantize"] and node.target not in ops["dequantize"]:
            continue
        p = _params(node)
        source = p["input"]
        constant = _constant(gm, source)
        per_channel = node.target in ops["per_channel"]
        dtype = p["dtype"]
        if constant is None and not (isinstance(source, Node) and source.op == "call_function"
                                     and source.target in ops["per_channel"]):
            # an activation (or a weight quantized at run time, which the importer names)
            if per_channel:
                raise refuse(node, f"per-channel activations (one scale per channel along axis {p['axis']})",
                             ACTIVATIONS_TAKEN)
            if dtype not in ACTIVATION_DTYPES:
                raise refuse(node, f"{_dtype_name(dtype)} activation codes", ACTIVATIONS_TAKEN)
            if dtype == torch.int16 and int(p["zero_point"]) != 0:
                raise refuse(node, f"int16 activations with zero point {int(p['zero_point'])}",
                             "int16 activations with zero point 0 (symmetric), int8 ones with any zero point")
            continue
        if node.target not in ops["dequantize"]:
            continue  # a constant's quantize (not folded by convert): its dequantize is checked
        if constant is None:
            constant = _constant(gm, source.args[0]) if isinstance(source, Node) else None
        reader = _gemm_reader(node)
        if reader is None:
            if per_channel:
                raise refuse(node, "a per-channel constant that no conv / linear reads as its weight",
                             "per-channel quantization for conv / linear weights only")
            continue  # a constant operand of another op: the importer quantizes into its domain
        gemm, op_name, position = reader
        if position == 2:
            _check_bias(gm, node, gemm, constant, p, refuse)
            continue
        if dtype != torch.int8:
            raise refuse(node, f"{_dtype_name(dtype)} weights of {op_name}", WEIGHTS_TAKEN)
        zps = p["zero_points"] if per_channel else p["zero_point"]
        zps = _constant(gm, zps) if isinstance(zps, Node) else torch.as_tensor(zps)
        if zps is not None and bool((zps != 0).any()):
            raise refuse(node, f"asymmetric weights of {op_name} (zero point {_first_nonzero(zps)})", WEIGHTS_TAKEN)
        if per_channel and constant is not None:
            axis = int(p["axis"]) % constant.dim()
            if axis != _GEMM_OUTPUT_AXIS[op_name]:
                raise refuse(node, f"{op_name} weights quantized per channel along axis {axis} (not the output "
                             f"channels, axis {_GEMM_OUTPUT_AXIS[op_name]})", WEIGHTS_TAKEN)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _check_bias(gm: GraphModule, node: Node, gemm: Node, codes: torch.Tensor | None, p: dict, refuse) -> None:
    """An int32 bias must sit at the accumulator's scale, input scale x weight scale (per channel):
    then it is the float value the importer quantizes back to exactly these codes."""
    takes = "a float bias, or int32 codes at scale input scale x weight scale with zero point 0"
    per_channel = node.target in _ops()["per_channel"]
    scales = p["scales"] if per_channel else p["scale"]
    scales = _constant(gm, scales) if isinstance(scales, Node) else torch.as_tensor(scales, dtype=torch.float64)
    zps = p["zero_points"] if per_channel else p["zero_point"]
    zps = _constant(gm, zps) if isinstance(zps, Node) else torch.as_tensor(zps)
    if codes is None or scales is None or p["dtype"] != torch.int32 or (zps is not None and bool((zps != 0).any())):
        raise refuse(node, f"a {_dtype_name(p['dtype'])} bias of {gemm.target}", takes)
    expected = accumulator_scales(gm, gemm)
    got = np.broadcast_to(scales.double().numpy(), codes.shape)
    if expected is None or not np.allclose(got, np.broadcast_to(expected, codes.shape), rtol=1e-6, atol=0):
        raise refuse(node, f"an int32 bias of {gemm.target} at scale {got.ravel()[:1]} (input scale x weight "
                     f"scale is {None if expected is None else np.ravel(expected)[:1]})", takes)
    value = (codes.double().numpy() * got).astype(np.float32)
    name = f"_qlower_float_bias_{gemm.name}"
    gm.register_buffer(name, torch.from_numpy(value))
    with gm.graph.inserting_before(gemm):
        float_bias = gm.graph.get_attr(name)
    float_bias.meta.update(node.meta)
    node.replace_all_uses_with(float_bias)


def accumulator_scales(gm: GraphModule, gemm: Node) -> np.ndarray | None:
    """input scale x weight scale(s) of a conv / linear whose operands are dequantized, else None."""
    def scale_of(dq: object) -> np.ndarray | None:
        if not isinstance(dq, Node) or dq.op != "call_function" or dq.target not in _ops()["dequantize"]:
            return None
        p = _params(dq)
        s = p.get("scales", p.get("scale"))
        s = _constant(gm, s) if isinstance(s, Node) else torch.as_tensor(s, dtype=torch.float64)
        return None if s is None else s.double().numpy()

    s_in, s_w = scale_of(gemm.args[0]), scale_of(gemm.args[1])
    return None if s_in is None or s_w is None else s_in * s_w


def _dtype_name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def _first_nonzero(t: torch.Tensor) -> int:
    return int(t.flatten()[(t.flatten() != 0).nonzero()[0, 0]])


# -- the frontend's entry --------------------------------------------------------------------

def check_inputs(gm: GraphModule, example_inputs: Sequence[torch.Tensor]) -> None:
    """The example inputs run through the quantized model (it was exported for inputs of one shape)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise InputError(f"the quantized model takes {len(placeholders)} input(s), example_inputs has "
                         f"{len(example_inputs)}")
    for i, (n, x) in enumerate(zip(placeholders, example_inputs)):
        val = n.meta.get("val")
        fixed = isinstance(val, torch.Tensor) and all(isinstance(d, int) for d in val.shape)
        if fixed and (tuple(val.shape) != tuple(x.shape) or val.dtype != x.dtype):
            raise InputError(f"example_inputs[{i}] is {x.dtype}{list(x.shape)}, the quantized model was exported "
                             f"for {val.dtype}{list(val.shape)}")


def check_quant_given(quant: object, model_quant: object) -> None:
    """A pre-quantized model brings its own quantization: ``quant`` may only choose the fallback."""
    from dataclasses import replace

    from qlower.frontend.config import QuantConfig

    if quant is None:
        raise ConfigError("the model is already quantized (a PT2E model with quantize/dequantize nodes); "
                          "quant=None can't compile it in float: pass the float model instead")
    base = model_quant if isinstance(model_quant, QuantConfig) else QuantConfig()
    if replace(quant, fallback=base.fallback) not in (base, QuantConfig()):
        raise ConfigError("the model is already quantized (a PT2E model with quantize/dequantize nodes): its "
                          "scales are used as given, so a QuantConfig can only set fallback; got "
                          f"{quant!r}")


def import_prequantized(model: GraphModule, example_inputs: Sequence[torch.Tensor], quant: object,
                        target: str = "reference"):
    """The FrontendResult of a pre-quantized ``model`` (see ``quantized_form``) for ``target``: its q/dq
    nodes checked and imported as they are. The fake-quant model is the converted graph; the float model
    is that graph without the activations' quantization (its weights stay the dequantized int8 ones)."""
    from qlower.frontend import FrontendResult
    from qlower.frontend.importer import import_graph

    form = quantized_form(model)
    if form == "observed":
        raise ConfigError("the model holds PT2E observers (prepare_pt2e, not yet converted): run its calibration "
                          "and torchao's convert_pt2e first, or compile the float model and let qlower quantize it")
    check_quant_given(quant, getattr(model, "qlower_quant", None))
    check_inputs(model, example_inputs)
    try:
        converted = convert_qat(model) if form == "qat" else copy.deepcopy(model)
    except Exception as e:  # noqa: BLE001  (torchao raises many unrelated types)
        raise UnsupportedOpError(f"converting the QAT model (torchao's convert_pt2e) failed: "
                                 f"{type(e).__name__}: {str(e)[:2000]}") from e
    converted = _static(converted, example_inputs)
    check_quantization(converted, target)
    round_biases(converted)  # the fake-quant model adds the int32 biases deployment adds (bias_rounding.py)
    imported = import_graph(converted, name=getattr(model, "qlower_name", type(model).__name__),
                            fallback=quant.fallback)
    graph = imported.graph
    float_graph = float_version(converted)
    return FrontendResult(graph=graph, float_model=float_graph, fake_quant=converted, float_graph=float_graph,
                          input_layouts=tuple(None for _ in graph.inputs),
                          output_layouts=tuple(None for _ in graph.outputs),
                          node_values=imported.node_values, float_reasons=imported.float_reasons)
