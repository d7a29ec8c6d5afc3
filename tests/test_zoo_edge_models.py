"""The edge zoo models: each builds deterministically, runs, exports, and exercises the ops it is there for.

Expected shapes come from the architectures' definitions (written out here, not
read from the zoo code); expected ops are the aten ops of ``torch.export``'s
graph before any decomposition.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import nn

import qlower.zoo as zoo
from qlower.frontend.config import QuantConfig

S = 32  # test size of every resizable model

# name → (example input shapes at size S, output shape, default size or None for a fixed input)
SHAPES: dict[str, tuple[list[tuple[int, ...]], tuple[int, ...], int | None]] = {
    "mobilenet_v3_small": ([(1, 3, S, S)], (1, 1000), 224),
    "efficientnet_lite": ([(1, 3, S, S)], (1, 1000), 224),
    "convnext_block": ([(1, 3, S, S)], (1, 10), 32),
    "timm_vit_tiny": ([(1, 3, S, S)], (1, 10), 32),
    "mobilevit_block": ([(1, 3, S, S)], (1, 10), 32),
    "unet_tiny": ([(1, 3, S, S)], (1, 4, S, S), 32),
    "ds_cnn_kws": ([(1, 1, 49, 10)], (1, 12), None),
    "lstm_kws": ([(1, 49, 10)], (1, 12), None),
}
NAMES = list(SHAPES)

# aten op packets each exported graph must contain (the ops the model is in the zoo for)
REQUIRED_OPS = {
    "mobilenet_v3_small": {"aten.hardswish", "aten.hardsigmoid", "aten.adaptive_avg_pool2d", "aten.mul", "aten.conv2d"},
    "efficientnet_lite": {"aten.hardtanh", "aten.silu", "aten.sigmoid", "aten.mul", "aten.conv2d"},
    "convnext_block": {"aten.layer_norm", "aten.permute", "aten.gelu", "aten.linear", "aten.mul", "aten.conv2d"},
    "timm_vit_tiny": {"aten.unbind", "aten.cat", "aten.expand", "aten.layer_norm", "aten.softmax", "aten.select"},
    "mobilevit_block": {"aten.layer_norm", "aten.silu", "aten.softmax", "aten.cat", "aten.permute", "aten.reshape"},
    "unet_tiny": {"aten.conv_transpose2d", "aten.upsample_bilinear2d", "aten.max_pool2d", "aten.cat"},
    "ds_cnn_kws": {"aten.conv2d", "aten.batch_norm", "aten.avg_pool2d", "aten.linear"},
    "lstm_kws": {"aten.lstm", "aten.linear"},
}
# models with depthwise convs: (kernel sizes of the depthwise convs that must appear)
DEPTHWISE_KERNELS = {
    "mobilenet_v3_small": {(3, 3), (5, 5)},
    "efficientnet_lite": {(3, 3), (5, 5)},
    "convnext_block": {(7, 7)},
    "ds_cnn_kws": {(3, 3)},
}
BN_MODELS = ["mobilenet_v3_small", "efficientnet_lite", "mobilevit_block", "unet_tiny", "ds_cnn_kws"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Small models on a shared machine: one intra-op thread avoids waiting on a descheduled second one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _size(name: str) -> int | None:
    return S if SHAPES[name][2] is not None else None


@functools.cache
def _build(name: str) -> zoo.ZooModel:
    return zoo.get(name, _size(name))


@functools.cache
def _exported(name: str) -> torch.export.ExportedProgram:
    model, example, _, _ = _build(name)
    return torch.export.export(model, example)


def _op_packets(ep: torch.export.ExportedProgram) -> set[str]:
    return {
        str(n.target.overloadpacket)
        for n in ep.graph_module.graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
    }


def test_registered_with_one_line_descriptions():
    for name in NAMES:
        assert name in zoo.names()
        line = zoo.describe(name)
        assert line.startswith(name + ": ") and "\n" not in line and len(line) > len(name) + 20
        assert zoo.default_size(name) == SHAPES[name][2]


@pytest.mark.parametrize("name", NAMES)
def test_builds_deterministically(name: str):
    rng_before = torch.get_rng_state()
    a = _build(name)
    b = zoo.get(name, _size(name))
    assert torch.equal(torch.get_rng_state(), rng_before), "building must not disturb the global RNG"
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    for x, y in zip([a.example_inputs, *a.calibration_batches], [b.example_inputs, *b.calibration_batches]):
        assert len(x) == len(y) and all(torch.equal(u, v) for u, v in zip(x, y))
    with torch.no_grad():
        assert torch.equal(a.model(*a.example_inputs), b.model(*b.example_inputs))


@pytest.mark.parametrize("name", NAMES)
def test_runs_with_designed_shapes(name: str):
    model, example, config, calibration = _build(name)
    in_shapes, out_shape, _ = SHAPES[name]
    assert isinstance(model, nn.Module) and not model.training
    assert not any(m.training for m in model.modules())
    assert all(t.dtype == torch.float32 for t in model.state_dict().values() if t.is_floating_point())
    assert isinstance(config, QuantConfig) and config == QuantConfig()  # static int8 default
    assert isinstance(example, tuple) and [tuple(t.shape) for t in example] == in_shapes
    assert isinstance(calibration, list) and 4 <= len(calibration) <= 8
    for batch in calibration:
        assert isinstance(batch, tuple) and [tuple(t.shape) for t in batch] == in_shapes
        assert not torch.equal(batch[0], example[0])  # calibration data is not the example

    with torch.no_grad():
        outs = [model(*batch) for batch in [example, *calibration]]
    for out in outs:
        assert tuple(out.shape) == out_shape and out.dtype == torch.float32
        assert torch.isfinite(out).all()
        assert out.std() > 1e-2 * out.abs().mean() > 0  # not constant over classes / pixels
    stacked = torch.stack(outs)
    assert stacked.std(dim=0).mean() > 1e-2 * stacked.abs().mean()  # different inputs, different outputs


@pytest.mark.parametrize("name", NAMES)
def test_exports_and_matches_eager(name: str):
    model, example, _, calibration = _build(name)
    exported = _exported(name)
    with torch.no_grad():
        for batch in [example, calibration[0], calibration[-1]]:
            torch.testing.assert_close(exported.module()(*batch), model(*batch), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_exported_graph_has_the_ops_the_model_is_for(name: str):
    ops = _op_packets(_exported(name))
    missing = REQUIRED_OPS[name] - ops
    assert not missing, f"{name}: {sorted(missing)} not in {sorted(ops)}"
    if name == "mobilevit_block":
        assert ops & {"aten.chunk", "aten.split", "aten.split_with_sizes"}, sorted(ops)
    if name in DEPTHWISE_KERNELS:
        kernels = set()
        for n in _exported(name).graph_module.graph.nodes:
            if n.op == "call_function" and n.target == torch.ops.aten.conv2d.default:
                weight = n.args[1].meta["val"]
                groups = n.args[6] if len(n.args) > 6 else 1
                if groups > 1 and groups == weight.shape[0] and weight.shape[1] == 1:
                    kernels.add(tuple(weight.shape[2:]))
        assert DEPTHWISE_KERNELS[name] <= kernels, (name, kernels)


def test_op_counts_match_the_architectures():
    """Counts from the architecture definitions: SE blocks, LayerNorms, attention heads' unbinds."""

    def count(name: str, op) -> int:
        return sum(n.target == op for n in _exported(name).graph_module.graph.nodes)

    aten = torch.ops.aten
    assert count("mobilenet_v3_small", aten.hardsigmoid.default) == 9  # SE in 9 of the 11 blocks
    assert count("efficientnet_lite", aten.silu.default) == 1
    assert count("efficientnet_lite", aten.hardtanh.default) == 1 + 1 + 2 * 7 + 1  # stem, dw-only, 7 MBConv, head
    assert count("convnext_block", aten.layer_norm.default) == 1 + 2 + 1  # stem, 2 blocks, head
    assert count("timm_vit_tiny", aten.layer_norm.default) == 2 * 2 + 1
    assert count("timm_vit_tiny", aten.unbind.int) == 2
    assert count("unet_tiny", aten.conv_transpose2d.input) == 1
    assert count("unet_tiny", aten.upsample_bilinear2d.vec) == 1
    assert count("unet_tiny", aten.conv2d.default) == 5 * 2 + 1
    assert count("ds_cnn_kws", aten.conv2d.default) == 1 + 2 * 4
    assert count("lstm_kws", aten.lstm.input) == 1


def test_sizes_accepted_and_rejected():
    for name, size, shape in (("convnext_block", 8, (1, 10)), ("timm_vit_tiny", 16, (1, 10)),
                              ("mobilevit_block", 8, (1, 10)), ("unet_tiny", 8, (1, 4, 8, 8))):  # fmt: skip
        model, example, _, calibration = zoo.get(name, size)
        assert example[0].shape == (1, 3, size, size) and calibration[0][0].shape == (1, 3, size, size)
        with torch.no_grad():
            assert tuple(model(*example).shape) == shape
    for name, size in (("mobilenet_v3_small", 16), ("efficientnet_lite", 8), ("convnext_block", 2),
                       ("timm_vit_tiny", 36), ("mobilevit_block", 30), ("unet_tiny", 30), ("unet_tiny", 2),
                       ("timm_vit_tiny", 0), ("unet_tiny", 32.0)):  # fmt: skip
        with pytest.raises(ValueError, match="size"):
            zoo.get(name, size)
    for name, size in (("ds_cnn_kws", 32), ("ds_cnn_kws", 49), ("lstm_kws", 10), ("lstm_kws", 49)):
        with pytest.raises(ValueError, match=name):
            zoo.get(name, size)


@pytest.mark.parametrize("name", BN_MODELS)
def test_batchnorm_statistics_match_fresh_data(name: str):
    """Running stats describe what each BN sees in eval mode on fresh random inputs, not the (0, 1) defaults.

    MobileNetV3's last-stage BN inputs (1x1 maps after hardswish and SE gates)
    are heavy-tailed (kurtosis 20-40): a few inputs carry half the variance, so
    one 128-input sample's variance can be 2.5x another's. Hence a loose bound per
    layer and a tight one on the median layer.
    """
    model = _build(name).model
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms
    seen: dict[nn.Module, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args: seen.__setitem__(mod, args[0])) for m in norms]
    shape = (16 if name == "unet_tiny" else 128, *SHAPES[name][0][0][1:])
    with torch.no_grad():
        model(torch.randn(*shape, generator=torch.Generator().manual_seed(7)))
    for h in hooks:
        h.remove()
    log_ratios = []
    for m in norms:
        assert not torch.allclose(m.running_var, torch.ones_like(m.running_var))
        assert not torch.allclose(m.running_mean, torch.zeros_like(m.running_mean))
        data = seen[m].double()
        mean, var = data.mean(dim=(0, 2, 3)), data.var(dim=(0, 2, 3))
        z = ((mean - m.running_mean.double()) / m.running_var.double().sqrt()).abs().median()
        ratio = (var / m.running_var.double()).median()
        assert z < 0.2 and 0.5 < ratio < 3.0, (name, float(z), float(ratio))
        log_ratios.append(abs(math.log(ratio)))
    assert sorted(log_ratios)[len(log_ratios) // 2] < 0.1


def test_mobilevit_fold_inverts_unfold():
    block = _build("mobilevit_block").model.block
    x = torch.randn(2, 5, 6, 8, generator=torch.Generator().manual_seed(3))
    patches = block.unfold(x)
    assert patches.shape == (2 * 4, 3 * 4, 5)
    # sequence p of image n holds pixel (2i + p // 2, 2j + p % 2) of patch (i, j), channels last
    assert torch.equal(patches[1 * 4 + 3, 2 * 4 + 1], x[1, :, 2 * 2 + 1, 1 * 2 + 1])
    assert torch.equal(block.fold(patches, 2, 6, 8), x)


def test_timm_vit_class_token_and_attention():
    """Class token first, position embedding for 1 + (S/8)^2 tokens, attention neither flat nor one-hot."""
    model, example, _, _ = _build("timm_vit_tiny")
    assert model.pos_embed.shape == (1, 1 + (S // 8) ** 2, 64) and model.cls_token.shape == (1, 1, 64)
    attn = model.blocks[0].attn
    with torch.no_grad():
        x = model.patch_embed(example[0]).flatten(2).transpose(1, 2)
        x = torch.cat((model.cls_token, x), dim=1) + model.pos_embed
        q, k, _ = attn.qkv(model.blocks[0].norm1(x)).reshape(1, 17, 3, 2, 32).permute(2, 0, 3, 1, 4).unbind(0)
        probs = torch.softmax(q @ k.transpose(-2, -1) * 32**-0.5, dim=-1)
    peak = probs.max(dim=-1).values
    assert 0.1 < float(peak.median()) < 0.9, float(peak.median())


def test_lstm_kws_uses_the_last_step():
    model, example, _, _ = _build("lstm_kws")
    assert (model.lstm.input_size, model.lstm.hidden_size, model.lstm.num_layers) == (10, 64, 1)
    assert model.lstm.batch_first
    with torch.no_grad():
        out, (h, _) = model.lstm(example[0])
        assert torch.equal(out[:, -1], h[0])
        torch.testing.assert_close(model(*example), model.fc(h[0]))
        # the recurrence carries early frames to the last step: changing frame 0 moves the logits
        changed = example[0].clone()
        changed[0, 0] += 3.0
        assert (model(changed) - model(*example)).abs().max() > 1e-3 * model(*example).abs().max()
