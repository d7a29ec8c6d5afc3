"""The SCENARIOS.md models through the frontend: the properties each scenario depends on hold in the IR."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from qlower import zoo
from qlower.frontend import QuantConfig, capture_and_import
from qlower.passes import fold_constants
from qlower.reference import run_graph
from qlower.testing.frontend import fake_quant_agreement
from qlower.zoo.scenarios import s3_variant

DYNAMIC_BOUND = 1e-5  # IR vs fake-quant, max |diff| / max |fake-quant output|; measured <= 5e-7


def _import(name, size=None, **config):
    model, example, quant, calibration = zoo.get(name, size)
    if config:
        quant = dataclasses.replace(quant, **config)
    return model, example, calibration, capture_and_import(model, example, quant, calibration, progress=False)


def test_s1_relu_zero_point_is_owned_by_the_concat_and_clamp_stays():
    model, example, calibration, result = _import("s1_conv_relu_cat")
    (clamp,) = [op for op in result.graph.ops if op.kind == "clamp"]
    (concat,) = [op for op in result.graph.ops if op.kind == "concat"]
    relu_q = clamp.result.quant
    assert relu_q.qmin == -127 and relu_q.qmax == 127
    assert relu_q.zero_point[0] != relu_q.qmin and -114 <= relu_q.zero_point[0] <= -108  # ~ -111
    assert clamp.attrs["min"] == relu_q.zero_point[0]  # the code of 0.0: relu can't fold into qmin
    assert all(v.quant == relu_q for v in concat.operands[0]) and concat.result.quant == relu_q
    cmp = fake_quant_agreement(result, [example] + calibration)
    assert cmp.outputs.max_step <= 1 and cmp.outputs.exact_share >= 0.99, str(cmp)
    assert cmp.layers.max_step <= 1 and cmp.layers.exact_share >= 0.99, str(cmp)


def _s3_expected(parts, x=None):
    """Codes of each part at the fixed scale 1/127 in [-127, 127], from the ramp formulas (float64)."""
    h = np.broadcast_to(np.linspace(-1 + 1 / 5, 1 - 1 / 5, 5)[None, :], (4, 5))
    v = np.broadcast_to(np.linspace(-1 + 1 / 4, 1 - 1 / 4, 4)[:, None], (4, 5))
    values = {"h": h, "v": v, "v_half": v / 2, "small": np.linspace(-0.1, 0.1, 20).reshape(4, 5)}
    if x is not None:
        values["x"] = x.numpy().reshape(4, 5).astype(np.float64)
    return np.stack([np.clip(np.rint(values[p] * 127), -127, 127) for p in parts])[None]


def _run_folded(result, inputs=()):
    folded = fold_constants(result.graph).graph
    out = run_graph(folded, [t.numpy() for t in inputs])[0]
    return folded, np.rint(out.astype(np.float64) * 127)


def test_s3_constant_concat_folds_to_the_exact_codes():
    _, _, _, result = _import("s3_const_cat")
    folded, codes = _run_folded(result)
    assert "concat" not in folded.count_ops()
    assert codes[0, 0].tolist() == [[-102, -51, 0, 51, 102]] * 4
    assert codes[0, 1].T.tolist() == [[-95, -32, 32, 95]] * 5
    np.testing.assert_array_equal(codes, _s3_expected(("h", "v")))


@pytest.mark.parametrize("kind,parts", [("hh", ("h", "h")), ("vh", ("v", "h")),
                                        ("three_scales", ("h", "v_half", "small")), ("const_runtime", ("h", "x"))])
def test_s3_variants(kind, parts):
    model, example, quant, calibration = s3_variant(kind)
    result = capture_and_import(model, example, quant, calibration, progress=False)
    _, codes = _run_folded(result, example)
    np.testing.assert_array_equal(codes, _s3_expected(parts, example[0] if example else None))


@pytest.mark.parametrize("granularity", ["per_tensor", "per_row"])
def test_s0_dynamic_biasless_close_to_fake_quant(granularity):
    model, example, calibration, result = _import("s0_dynamic_biasless", 16, granularity=granularity)
    graph = result.graph
    kinds = graph.count_ops()
    assert kinds["conv2d"] == 11 and "quantize" not in kinds  # stem, 3 x (dw, pw), 3 twins, mix
    dq = [op for op in graph.ops if op.kind == "dynamic_quantize"]
    assert {op.attrs["granularity"] for op in dq} == ({"per_tensor", "per_row"} if granularity == "per_row"
                                                      else {"per_tensor"})
    # no bias stays None; the twins with a bias (non-zero and all-zero) add it after dequantizing
    convs = [op for op in graph.ops if op.kind == "conv2d"]
    assert all(op.operands[2] is None for op in convs)
    users = graph.users()
    twins = [op for op in convs if op.operands[1].shape == (32, 1, 1, 64)]
    adds = [[u for u in users[users[op.result][0].result] if u.kind == "add"] for op in twins]
    assert sorted(len(a) for a in adds) == [0, 1, 1]
    zero_bias = [graph.constant_data(a[0].operands[1]) for a in adds if a]
    assert sorted(float(np.abs(b).max()) for b in zero_bias)[0] == 0.0
    _check_dynamic(result, [example] + calibration)


def _check_dynamic(result, batches):
    for batch in batches:
        ir = run_graph(result.graph, [x.numpy() for x in batch])[0]
        with torch.no_grad():
            fq = result.fake_quant(*batch).numpy()
        assert np.abs(ir - fq).max() <= DYNAMIC_BOUND * np.abs(fq).max()


def test_s2_dynamic_per_channel_binary_first_in_line():
    model, example, calibration, result = _import("s2_perchannel_binary")
    muls = [op for op in result.graph.ops if op.kind == "mul"]
    assert muls and all(op.result.quant is None for op in muls)  # float: dynamic mode quantizes gemms only
    const = [v for v in muls[0].operands if result.graph.constant_data(v) is not None][0]
    assert const.shape == (1, 3, 1, 1)  # the input stays in PyTorch layout until a conv needs NHWC
    _check_dynamic(result, [example] + calibration)


def test_s2_static():
    model, example, quant, calibration = zoo.get("s2_perchannel_binary")
    result = capture_and_import(model, example, QuantConfig(), calibration, progress=False)
    per_channel = [op for op in result.graph.ops if op.kind == "mul" and op.result.quant.is_per_channel]
    assert len(per_channel) == 1  # x * scale, held exactly as ±1 codes with per-channel scales
    cmp = fake_quant_agreement(result, [example] + calibration)
    assert cmp.outputs.max_step <= 1 and cmp.outputs.exact_share >= 0.99, str(cmp)
    assert cmp.layers.max_step <= 1 and cmp.layers.exact_share >= 0.99, str(cmp)


def test_s4_attention():
    model, example, calibration, result = _import("s4_attention")
    kinds = result.graph.count_ops()
    assert kinds["matmul"] == 2 and kinds["intdiv"] == 1 and "softmax" not in kinds
    cmp = fake_quant_agreement(result, [example] + calibration)
    assert cmp.layers.max_step <= 1 and cmp.layers.exact_share >= 0.99, str(cmp)
    # end to end a 1-step logit difference moves a softmax output by several steps
    assert cmp.outputs.max_step <= 4 and cmp.outputs.exact_share >= 0.95, str(cmp)
