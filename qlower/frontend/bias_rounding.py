"""The fake-quant model's biases rounded as deployment rounds them: int32 codes at ``s_in * s_w``.

convert_pt2e leaves a conv / linear bias in float, while every program adds it to the int32 accumulator
as ``round_half_even(b / (s_in * s_w[c]))`` (rules/gemm.py). Where the accumulator's scale is coarse next
to the output's (4-bit weights: a requantization multiplier ``s_in * s_w / s_out`` above 1), that rounding
alone moves the output by more than a step, so the fake-quant model would not be the model deployed and
verify's one-step bound between the reference and the fake-quant model would not hold.
``round_biases`` writes each such bias as the float value of its int32 codes; the importer quantizes that
value back to the same codes (checked here), so the program is unchanged and the fake-quant model computes
what it runs.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.fx import GraphModule, Node

from qlower.frontend.constants import attribute_tensor

aten = torch.ops.aten
GEMMS = {aten.conv1d.default, aten.conv2d.default, aten.linear.default}  # the ops rules/gemm.py accumulates


def round_biases(gm: GraphModule) -> int:
    """Replace, in place, the float bias of every conv / linear whose input and weight are dequantized
    with constant scales by ``codes * s_in * s_w`` (float32), ``codes`` the int32 the importer computes;
    returns how many. A bias whose codes don't fit int32 (the importer refuses it) is left as it is."""
    from qlower.frontend.pt2e_input import accumulator_scales  # here: pt2e_input imports this module

    rounded = 0
    for gemm in list(gm.graph.nodes):
        if gemm.op != "call_function" or gemm.target not in GEMMS or len(gemm.args) < 3:
            continue
        bias = gemm.args[2]
        if not isinstance(bias, Node) or bias.op != "get_attr":
            continue
        value = attribute_tensor(gm, bias)
        scales = accumulator_scales(gm, gemm)
        if value.dtype != torch.float32 or value.dim() != 1 or scales is None or scales.size not in (1, value.numel()):
            continue
        b = value.detach().double().numpy()
        codes = np.rint(b / scales)
        if np.abs(codes).max(initial=0) > np.iinfo(np.int32).max:
            continue
        exact = (codes * scales).astype(np.float32)
        if not np.array_equal(np.rint(exact.astype(np.float64) / scales), codes):
            continue  # beyond float32's precision: the importer would round the value otherwise
        name = f"_qlower_rounded_bias_{gemm.name}"
        gm.register_buffer(name, torch.from_numpy(exact))
        with gm.graph.inserting_before(gemm):
            node = gm.graph.get_attr(name)
        node.meta.update(bias.meta)
        gemm.replace_input_with(bias, node)
        rounded += 1
    if rounded:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return rounded
