"""Trained zoo models (digits at 32x32) and accuracy measurement (``qlower.evaluate``, ``qlower accuracy``).

Expected accuracies come from the labels and from the models run directly, never from the
accuracy code under test. The trained weights live in the user's cache like any user's
(``$QLOWER_CACHE_DIR``), so the suite trains each model once per machine.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
from torch import nn

import qlower
from qlower import zoo
from qlower.cli import main
from qlower.errors import InputError
from qlower.verification.accuracy import measure_accuracy
from qlower.zoo import trained, weights_cache
from qlower.zoo.training import fit, shift

TRAINED = ["mobilenet_v2", "resnet18", "timm_vit_tiny", "mobilenet_v3_small"]
CNNS = {"mobilenet_v2", "resnet18", "mobilenet_v3_small"}


def test_trained_names_and_refusals():
    assert zoo.trained_names() == ["digits_cnn", *TRAINED]
    with pytest.raises(ValueError, match="has no trained weights.*mobilenet_v2"):
        zoo.get("tiny_cnn", trained=True)
    with pytest.raises(ValueError, match="takes 32x32"):
        zoo.get("resnet18", size=64, trained=True)
    with pytest.raises(ValueError, match="no trained weights"):
        zoo.held_out("unet_tiny")


def test_digits_at_32_are_the_8x8_split_upsampled():
    x_train, y_train, x_test, y_test = trained.dataset()
    small = zoo.digits.dataset()
    assert x_train.shape == (1437, 3, 32, 32) and x_test.shape == (360, 3, 32, 32)
    assert torch.equal(y_train, small[1]) and torch.equal(y_test, small[3])
    # bilinear x4 without corner alignment: the centre 2x2 of each 4x4 block weighs its source pixel
    # by at least 0.875^2, and pixels lie in [-1, 1], so it is within 2 * (1 - 0.875^2) of it
    centres = x_test[:, 0].reshape(360, 8, 4, 8, 4)[:, :, 1:3, :, 1:3]
    assert (centres - small[2][:, 0, :, None, :, None]).abs().max() <= 2 * (1 - 0.875**2) + 1e-6
    assert torch.equal(x_test[:, 0], x_test[:, 2])


def test_shift_moves_each_image_by_its_own_offset():
    x = torch.zeros(64, 1, 9, 9)
    x[:, :, 4, 4] = 1.0
    moved = shift(x, 2, torch.Generator().manual_seed(0))
    rows, cols = (moved[:, 0] == 1).nonzero()[:, 1:].T
    assert len(rows) == 64  # one bright pixel per image, nothing lost at the edges
    assert rows.min() >= 2 and rows.max() <= 6 and cols.min() >= 2 and cols.max() <= 6
    assert len(set(zip(rows.tolist(), cols.tolist()))) > 10  # offsets differ between images
    assert torch.equal(shift(x, 0, torch.Generator()), x)


def test_fit_is_deterministic_in_its_seed():
    x, y = torch.randn(96, 1, 8, 8, generator=torch.Generator().manual_seed(1)), torch.arange(96) % 10

    def make() -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

    a, b = (fit(make, x, y, seed=7, epochs=2, lr=1e-2, shift_pixels=1).state_dict() for _ in range(2))
    c = fit(make, x, y, seed=8, epochs=2, lr=1e-2, shift_pixels=1).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_concurrent_requests_train_once(tmp_path):
    calls = []
    started = threading.Barrier(3)

    def train() -> nn.Module:
        calls.append(1)
        return nn.Linear(2, 2)

    def want() -> None:
        started.wait()
        results.append(weights_cache.cached_or_trained(lambda: nn.Linear(2, 2), tmp_path / "m.safetensors", train))

    results: list[nn.Module] = []
    threads = [threading.Thread(target=want) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(results) == 3
    assert all(torch.equal(r.weight, results[0].weight) for r in results)


def test_loading_a_cached_model_leaves_the_global_rng_alone(tmp_path):
    path = tmp_path / "m.safetensors"
    weights_cache.cached_or_trained(lambda: nn.Linear(4, 4), path, lambda: nn.Linear(4, 4))
    state = torch.get_rng_state()
    loaded = weights_cache.load_cached(lambda: nn.Linear(4, 4), path)
    assert loaded is not None
    assert torch.equal(torch.get_rng_state(), state)   # the caller's next draws don't depend on a cache hit


def _accuracy(picks: np.ndarray, labels: torch.Tensor) -> float:
    return float(np.mean(picks == labels.numpy()[: len(picks)]))


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINED)
def test_trained_model_learns_digits_and_int8_keeps_it(name):
    """fp32 ≥ 95% on the held-out digits; the int8 cpu program within 1 point of it for the CNNs (at most
    one image of 120) and within 3 for the ViT (its LayerNorm, softmax and GELU are approximated in int8)."""
    model, example, cfg, calibration = zoo.get(name, trained=True)
    (x,), y = zoo.held_out(name)
    x_train = trained.dataset()[0]
    assert x.shape == (360, 3, 32, 32) and example[0].shape == (1, 3, 32, 32)
    for (batch,) in calibration:  # calibrated on training images, evaluated on held-out ones
        assert (x_train == batch).flatten(1).all(dim=1).any()
    with torch.no_grad():
        fp32 = _accuracy(model(x).argmax(dim=1).numpy(), y)
    assert fp32 >= 0.95, fp32
    # the int8 program on every third held-out image (CI's time budget; the closing notes measure all 360)
    prog = qlower.compile(model, example, target="cpu", quant=cfg, calibration=calibration, progress=False)
    some = range(0, len(y), 3)
    with torch.no_grad():
        fp32_some = float(np.mean([int(model(x[i:i + 1]).argmax()) == int(y[i]) for i in some]))
    int8 = float(np.mean([int(np.argmax(prog.run(x[i:i + 1])[0])) == int(y[i]) for i in some]))
    assert int8 >= fp32_some - (0.01 if name in CNNS else 0.03), (fp32_some, int8)


@pytest.mark.slow
def test_evaluate_scores_the_float_model_and_the_program():
    model, example, cfg, calibration = zoo.get("resnet18", trained=True)
    data = zoo.held_out("resnet18")
    report = qlower.evaluate(model, example, data, target="tosa-1.0+int", quant=cfg, calibration=calibration,
                             limit=40, progress=False)
    (x,), y = data
    with torch.no_grad():
        assert report.fp32 == _accuracy(model(x[:40]).argmax(dim=1).numpy(), y)
    prog = qlower.compile(model, example, target="tosa-1.0+int", quant=cfg, calibration=calibration, progress=False)
    assert report.program == _accuracy(np.array([np.argmax(prog.run(x[i:i + 1])[0]) for i in range(40)]), y)
    assert report.images == 40 and report.target == "tosa-1.0+int" and report.cycles is None
    # programs that pick what fake-quant picks can't differ from it by more than the rest
    assert abs(report.program - report.fake_quant) <= 1 - report.agreement + 1e-12
    assert "tosa-1.0+int" in report.table() and "40 held-out" in report.table()


def test_evaluate_rejects_malformed_data_before_compiling():
    model, example, _, _ = zoo.get("digits_cnn")
    x = torch.zeros(4, 1, 8, 8)
    for data, match in (((x, torch.zeros(3, dtype=torch.int64)), "expected 3 inputs along dim 0"),
                        ((x, torch.zeros(4, 1, dtype=torch.int64)), "1-D integer"),
                        ((x, torch.zeros(4)), "1-D integer"),
                        (x, "pair"),
                        ((x[:0], torch.zeros(0, dtype=torch.int64)), "no inputs")):
        with pytest.raises(InputError, match=match):
            qlower.evaluate(model, example, data, progress=False)
    prog = qlower.compile(model, example, target="cpu", progress=False)
    for limit in (0, -1, 1.5):
        with pytest.raises(InputError, match="limit"):
            measure_accuracy(prog, (x, torch.zeros(4, dtype=torch.int64)), limit=limit, progress=False)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_accuracy_prints_and_writes_json(capsys, tmp_path):
    out_json = tmp_path / "acc.json"
    code, out, _ = _run(capsys, "accuracy", "zoo:digits_cnn", "--target", "cpu", "--limit", "30",
                        "--json", str(out_json))
    assert code == 0, out
    (result,) = json.loads(out_json.read_text())
    model, _, _, _ = zoo.get("digits_cnn")
    (x,), y = zoo.held_out("digits_cnn")
    with torch.no_grad():
        assert result["fp32"] == _accuracy(model(x[:30]).argmax(dim=1).numpy(), y)
    assert result["images"] == 30 and result["target"] == "cpu"
    assert f"{100 * result['program']:.2f}%" in out and "fake-quant" in out


@pytest.mark.parametrize("argv, message", [
    (("accuracy", "zoo:tiny_cnn"), "no trained weights"),
    (("accuracy", "model.py:make"), "takes a trained zoo model"),
    (("accuracy", "zoo:digits_cnn", "--limit", "0"), "--limit must be at least 1"),
    (("verify", "zoo:unet_tiny", "--trained"), "no trained weights"),
])
def test_cli_accuracy_refusals(capsys, argv, message):
    code, _, err = _run(capsys, *argv)
    assert code == 2 and message in err
