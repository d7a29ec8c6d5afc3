"""qlower.zoo: every model builds, runs, exports, and has the property its scenario depends on.

Expected values are independent of the zoo code: shapes from the architectures'
definitions, S1's zero point from the min/max arithmetic of an asymmetric
observer, S3's codes from SCENARIOS.md, digits accuracy from labels.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qlower.zoo as zoo
from qlower.frontend.config import QuantConfig
from qlower.zoo import digits, scenarios

NAMES = [
    "tiny_cnn", "mobilenet_v2", "resnet18", "vit_block", "digits_cnn",
    "s0_dynamic_biasless", "s1_conv_relu_cat", "s2_perchannel_binary", "s3_const_cat", "s4_attention",
    "mobilenet_v3_small", "efficientnet_lite", "convnext_block", "timm_vit_tiny", "mobilevit_block", "unet_tiny",
    "ds_cnn_kws", "lstm_kws",
]  # fmt: skip
S = 32  # test size for every resizable model

# (input shapes, output shape) at size S
SHAPES = {
    "tiny_cnn": ([(1, 3, S, S)], (1, 10)),
    "mobilenet_v2": ([(1, 3, S, S)], (1, 1000)),
    "resnet18": ([(1, 3, S, S)], (1, 1000)),
    "vit_block": ([(1, 3, S, S)], (1, 10)),
    "digits_cnn": ([(1, 1, 8, 8)], (1, 10)),
    "s0_dynamic_biasless": ([(1, 3, S, S)], (1, 10)),
    "s1_conv_relu_cat": ([(1, 3, S, S), (1, 4, S, S)], (1, 8, S, S)),
    "s2_perchannel_binary": ([(1, 3, S, S)], (1, 8, S, S)),
    "s3_const_cat": ([], (1, 2, 4, 5)),
    "s4_attention": ([(1, 16, 32)], (1, 16, 32)),
}
BN_MODELS = ["tiny_cnn", "mobilenet_v2", "resnet18", "digits_cnn"]


@pytest.fixture(scope="module", autouse=True)
def zoo_cache(tmp_path_factory: pytest.TempPathFactory):
    """Point the digits cache at a fresh directory for this module (trained at most once here)."""
    path = tmp_path_factory.mktemp("qlower_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QLOWER_CACHE_DIR", str(path))
        yield path


def build(name: str) -> zoo.ZooModel:
    return zoo.get(name, S if zoo.default_size(name) else None)


_BUILT: dict[str, zoo.ZooModel] = {}  # test_builds_runs_and_exports's builds, per process


def built(name: str) -> zoo.ZooModel:
    """The model test_builds_runs_and_exports built in this process (else a new build), for the tests
    that only read it: building mobilenet_v2 or resnet18 estimates BN statistics on 256 images."""
    if name not in _BUILT:
        _BUILT[name] = build(name)
    return _BUILT[name]


def test_names_describe_and_unknown_name():
    assert zoo.names() == NAMES
    for name in NAMES:
        line = zoo.describe(name)
        assert line.startswith(name + ": ") and "\n" not in line
    with pytest.raises(ValueError) as err:
        zoo.get("resnet50")
    assert all(name in str(err.value) for name in NAMES)
    with pytest.raises(ValueError):
        zoo.describe("nope")


def test_size_is_rejected_where_it_cannot_apply():
    for name in ("s3_const_cat", "s4_attention", "digits_cnn"):
        with pytest.raises(ValueError, match=name):
            zoo.get(name, size=32)
    with pytest.raises(ValueError, match="size"):
        zoo.get("resnet18", size=4)
    with pytest.raises(ValueError, match="multiple"):
        zoo.get("vit_block", size=36)


def test_default_sizes():
    assert [zoo.default_size(n) for n in ("mobilenet_v2", "resnet18", "tiny_cnn")] == [224, 224, 32]
    m, ex, _, cal = zoo.get("mobilenet_v2")
    assert ex[0].shape == (1, 3, 224, 224) and all(b[0].shape == (1, 3, 224, 224) for b in cal)
    with torch.no_grad():
        assert m(*ex).shape == (1, 1000)


@pytest.mark.parametrize("name", list(SHAPES))  # the edge models: tests/test_zoo_edge_models.py
def test_builds_runs_and_exports(name: str):
    rng_before = torch.get_rng_state()
    model, example, config, calibration = _BUILT[name] = build(name)
    assert torch.equal(torch.get_rng_state(), rng_before), "building must not disturb the global RNG"
    in_shapes, out_shape = SHAPES[name]

    assert isinstance(model, nn.Module) and not model.training
    assert all(p.dtype == torch.float32 for p in model.state_dict().values() if p.is_floating_point())
    assert isinstance(config, QuantConfig)
    assert isinstance(example, tuple) and [tuple(t.shape) for t in example] == in_shapes
    assert isinstance(calibration, list) and 1 <= len(calibration) <= 8
    for batch in calibration:
        assert isinstance(batch, tuple) and [tuple(t.shape) for t in batch] == in_shapes

    with torch.no_grad():
        outs = [model(*batch) for batch in [example, *calibration]]
    for out in outs:
        assert out.shape == out_shape and out.dtype == torch.float32
        assert torch.isfinite(out).all()
    stacked = torch.stack(outs)
    if in_shapes:  # different inputs give different outputs
        assert stacked.std(dim=0).mean() > 1e-3 * stacked.abs().mean() > 0
    else:  # no inputs: a constant model
        assert stacked.abs().max() > 0 and all(torch.equal(o, outs[0]) for o in outs)

    exported = torch.export.export(model, example)
    with torch.no_grad():
        for batch in [example, calibration[-1]]:
            torch.testing.assert_close(exported.module()(*batch), model(*batch), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(SHAPES))
def test_deterministic(name: str):
    a, b = built(name), build(name)  # b is always a new build
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    for x, y in zip([a.example_inputs, *a.calibration_batches], [b.example_inputs, *b.calibration_batches]):
        assert all(torch.equal(u, v) for u, v in zip(x, y))


@pytest.mark.parametrize("name", BN_MODELS)
def test_batchnorm_statistics_match_fresh_data(name: str):
    """Running stats must describe the data the model sees, not the (0, 1) defaults."""
    model = built(name).model  # read only: the hooks below are removed again
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms
    seen: dict[nn.Module, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args: seen.__setitem__(mod, args[0])) for m in norms]
    g = torch.Generator().manual_seed(7)
    shape = (16, 1, 8, 8) if name == "digits_cnn" else (16, 3, S, S)
    x = digits.dataset()[2][:64] if name == "digits_cnn" else torch.randn(*shape, generator=g)
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    for m in norms:
        assert not torch.allclose(m.running_var, torch.ones_like(m.running_var))
        assert not torch.allclose(m.running_mean, torch.zeros_like(m.running_mean))
        data = seen[m].double()
        mean, var = data.mean(dim=(0, 2, 3)), data.var(dim=(0, 2, 3))
        sd = m.running_var.double().sqrt()
        z = ((mean - m.running_mean.double()) / sd).abs().median()
        ratio = (var / m.running_var.double()).median()
        assert z < 0.35 and 0.5 < ratio < 2.0, (name, float(z), float(ratio))


def test_s0_biasless_convs_and_identical_twins():
    model, _, config, _ = zoo.get("s0_dynamic_biasless")
    assert config.mode == "dynamic" and config.granularity == "per_tensor"
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert any(c.groups == c.in_channels > 1 for c in convs), "needs depthwise convs"
    with_bias = [c for c in convs if c.bias is not None]
    assert len(with_bias) <= 2 and len(convs) >= 10
    # identical weights, separate tensors: one without bias, one with a non-zero bias, one with an all-zero bias
    nobias = [c for c in convs if c.bias is None]
    twins = [
        (a, b)
        for a in nobias
        for b in with_bias
        if a.weight.shape == b.weight.shape and torch.equal(a.weight, b.weight)
    ]
    assert len(twins) == 2
    biases = sorted((b.bias.abs().max().item() for _, b in twins))
    assert biases[0] == 0.0 and biases[1] > 0.01
    assert all(a.weight.data_ptr() != b.weight.data_ptr() for a, b in twins)


@pytest.mark.parametrize("size", [None, 32])
def test_s1_relu_zero_point_is_not_qmin(size):
    model, example, config, calibration = zoo.get("s1_conv_relu_cat", size)
    assert (config.act_qmin, config.act_qmax, config.symmetric_acts, config.mode) == (-127, 127, False, "static")
    assert config.per_channel and (config.weight_qmin, config.weight_qmax) == (-127, 127)
    with torch.no_grad():
        relu = [F.relu(F.conv2d(x, model.conv1.weight, model.conv1.bias, padding=1)) for x, _ in calibration]
        ys = [y for _, y in calibration]
    lo = min(0.0, *(float(t.min()) for t in relu + ys))
    hi = max(0.0, *(float(t.max()) for t in relu + ys))
    assert lo < -0.06  # y reaches below zero: the concat's domain is not relu's [0, max]
    scale = (hi - lo) / (127 - (-127))
    zp = round(-127 - lo / scale)
    assert zp == -111
    relu_alone_zp = round(-127 - 0.0 / (max(float(t.max()) for t in relu) / 254))
    assert relu_alone_zp == -127  # what relu would pick on its own: folding it into the clamp would be wrong


def s3_codes(out: torch.Tensor) -> np.ndarray:
    return np.round(out.double().numpy() * 127).astype(np.int64)


def test_s3_output_is_the_exact_ramps():
    model, example, config, calibration = zoo.get("s3_const_cat")
    assert example == () and calibration == [()]
    assert config.fixed == {"output": (1 / 127, 0, -127, 127)}
    assert (config.act_qmin, config.act_qmax, config.symmetric_acts) == (-127, 127, True)
    out = model()
    h = np.linspace(-1 + 1 / 5, 1 - 1 / 5, 5)
    v = np.linspace(-1 + 1 / 4, 1 - 1 / 4, 4)
    np.testing.assert_allclose(out[0, 0].double().numpy(), np.broadcast_to(h, (4, 5)), rtol=0, atol=1e-7)
    np.testing.assert_allclose(out[0, 1].double().numpy(), np.broadcast_to(v[:, None], (4, 5)), rtol=0, atol=1e-7)
    codes = s3_codes(out)
    assert (codes[0, 0] == [-102, -51, 0, 51, 102]).all()  # every row
    assert (codes[0, 1].T == [-95, -32, 32, 95]).all()  # every column


def test_s3_variants():
    h_codes, v_codes = [-102, -51, 0, 51, 102], [[-95], [-32], [32], [95]]
    hh = scenarios.s3_variant("hh")
    assert (s3_codes(hh.model())[0] == h_codes).all() and hh.example_inputs == ()
    vh = s3_codes(scenarios.s3_variant("vh").model())[0]
    assert (vh[0] == v_codes).all() and (vh[1] == h_codes).all()
    three = scenarios.s3_variant("three_scales").model()
    assert three.shape == (1, 3, 4, 5)
    peaks = [float(three[0, c].abs().max()) for c in range(3)]
    assert peaks == pytest.approx([0.8, 0.375, 0.1], abs=1e-6)  # three different input scales
    np.testing.assert_allclose(three[0, 2].double().numpy().ravel(), np.linspace(-0.1, 0.1, 20), atol=1e-7)
    mixed = scenarios.s3_variant("const_runtime")
    (x,) = mixed.example_inputs
    assert x.shape == (1, 1, 4, 5) and len(mixed.calibration_batches) >= 4
    out = mixed.model(x)
    assert (s3_codes(out)[0, 0] == h_codes).all() and torch.equal(out[0, 1], x[0, 0])
    for kind in scenarios.S3_KINDS:
        variant = scenarios.s3_variant(kind)
        assert variant.quant_config == zoo.get("s3_const_cat").quant_config
        exported = torch.export.export(variant.model, variant.example_inputs)
        torch.testing.assert_close(exported.module()(*variant.example_inputs), variant.model(*variant.example_inputs))
    with pytest.raises(ValueError, match="hh"):
        scenarios.s3_variant("diagonal")


def test_s2_input_feeds_per_channel_mul_add_and_a_conv_first():
    model, example, config, _ = zoo.get("s2_perchannel_binary")
    assert config.mode == "dynamic"
    exported = torch.export.export(model, example)
    (x,) = [n for n in exported.graph.nodes if n.op == "placeholder" and n.name == "x"]
    users = {str(u.target) for u in x.users}
    assert users == {"aten.mul.Tensor", "aten.add.Tensor", "aten.conv2d.default"}
    for user in x.users:
        if user.target != torch.ops.aten.conv2d.default:
            const = next(a for a in user.args if a is not x)
            assert tuple(const.meta["val"].shape) == (1, 3, 1, 1)


def test_s4_attention_op_chain():
    model, example, config, _ = zoo.get("s4_attention")
    assert config == QuantConfig()
    exported = torch.export.export(model, example)
    ops = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert ops.count("aten.linear.default") == 4 and ops.count("aten.matmul.default") == 2
    assert ops.count("aten.softmax.int") == 1 and ops.count("aten.permute.default") == 4
    assert ops[-1] == "aten.linear.default" and ops.index("aten.softmax.int") > 3 * ops.index("aten.linear.default")
    # the eager block equals textbook attention computed here from its weights
    (x,) = example
    q, k, v = (F.linear(x, m.weight, m.bias).reshape(1, 16, 2, 16).transpose(1, 2) for m in (model.q, model.k, model.v))
    # q's weights carry the 1/sqrt(16) scale already, so the plain product is the scaled logit
    attn = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
    expected = F.linear(attn.transpose(1, 2).reshape(1, 16, 32), model.proj.weight, model.proj.bias)
    torch.testing.assert_close(model(x), expected)
    logits = q @ k.transpose(-1, -2)
    assert 0.3 < float(logits.detach().std()) < 5  # softmax neither flat nor one-hot


def test_digits_trains_caches_and_reloads(zoo_cache, monkeypatch, tmp_path):
    x_train, y_train, x_test, y_test = digits.dataset()
    assert x_train.shape == (1437, 1, 8, 8) and x_test.shape == (360, 1, 8, 8)
    assert float(x_train.min()) == -1.0 and float(x_train.max()) == 1.0
    assert sorted(y_test.unique().tolist()) == list(range(10))

    model, example, config, calibration = zoo.get("digits_cnn")
    path = digits.cache_path()
    assert path.parent == zoo_cache and path.is_file()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(dim=1) == y_test).double().mean().item()
    assert accuracy >= 0.95, accuracy
    assert config == QuantConfig() and torch.equal(example[0], x_test[:1])
    for (batch,) in calibration:  # calibration images come from the training set
        assert (x_train == batch).flatten(1).all(dim=1).any()

    def no_training(*args, **kwargs):
        raise AssertionError("second call must load the cache, not train")

    monkeypatch.setattr(digits, "train", no_training)
    again = zoo.get("digits_cnn").model
    sa, sb = model.state_dict(), again.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)

    # a corrupt cache file is replaced by a retrained one (in another directory: keep the shared cache good)
    monkeypatch.setenv("QLOWER_CACHE_DIR", str(tmp_path))
    path = digits.cache_path()
    path.write_bytes(b"not a safetensors file")
    monkeypatch.setattr(digits, "train", lambda x, y: digits.DigitsCNN().eval())
    assert isinstance(zoo.get("digits_cnn").model, digits.DigitsCNN)
    assert isinstance(digits._load_cached(path), digits.DigitsCNN)
