"""The ``tflm`` target: programs TensorFlow Lite Micro's own interpreter runs bit-exact with the reference.

Zoo models (reduced sizes: the architecture is the same at any size) and scenarios compile for
``tflm``; the partition runs on TFLM in a worker process and the whole-program .tflite export
(``--format tflite``) runs on TFLM too, both bit-exact with the reference interpreter on the
program's source (which carries TFLM's rounding). What TFLM has no kernel for stays a named host op;
a corrupt payload is an error with a reason, never a dead process; the recorded arena is the
smallest TFLM allocates and runs the model in.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

import qlower
from qlower import cli, zoo
from qlower.backends.tflm import runner
from qlower.backends.tflm.backend import MODEL_BLOB, TflmBackend
from qlower.contract import Payload
from qlower.errors import ExecutionError, UnsupportedOpError
from qlower.reference import run_graph

SIZE = 32


def _compile(name: str):
    size = SIZE if zoo.default_size(name) else None
    model, example, cfg, calibration = zoo.get(name, size=size)
    prog = qlower.compile(model, example, target="tflm", quant=cfg, calibration=calibration, progress=False)
    return prog, [x.detach().numpy() for x in example], size


def _inputs(example, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=x.shape).astype(x.dtype) for x in example]


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def _tflm_partition(prog):
    (part,) = prog.partitions
    assert part.backend == "tflm"
    return part


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny_cnn", "digits_cnn", "ds_cnn_kws", "mobilenet_v2", "resnet18",
                                  "mobilenet_v3_small"])
def test_zoo_model_runs_whole_on_tflm_bit_exact(name, tmp_path: Path):
    prog, example, _ = _compile(name)
    part = _tflm_partition(prog)
    assert prog.graph.count_ops() == {"delegate": 1}, "every op runs on TFLM"
    model = part.payload.blobs[MODEL_BLOB]
    assert part.payload.meta["flash_bytes"] == len(model)
    assert f"tensor arena {part.payload.meta['arena_bytes']:,} bytes" in prog.explain()
    exported = Path(prog.export(tmp_path / f"{name}.tflite", format="tflite")).read_bytes()
    for seed in range(3):
        inputs = example if seed == 0 else _inputs(example, seed)
        want = run_graph(prog.source, inputs)
        _assert_same(prog.run(*inputs), want)
        _assert_same(runner.run(exported, part.payload.meta["arena_bytes"], inputs), want)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["s0_dynamic_biasless", "s1_conv_relu_cat", "s4_attention", "vit_block"])
def test_scenario_is_bit_exact_on_tflm(name):
    """Partly on TFLM: host ops (BATCH_MATMUL, wide int32 requantization, dynamic quantization) split the
    fused forms of some ADDs and GEMMs; the split pieces stay on the host too (settle.py)."""
    prog, example, _ = _compile(name)
    assert prog.partitions, "some of the scenario runs on TFLM"
    for seed in range(2):
        inputs = example if seed == 0 else _inputs(example, seed)
        _assert_same(prog.run(*inputs), run_graph(prog.source, inputs))


@pytest.mark.slow
def test_cli_writes_the_tflm_file_and_the_arena_is_the_smallest(tmp_path: Path):
    path = tmp_path / "tiny.tflite"
    assert cli.main(["compile", "zoo:tiny_cnn", "--size", "16", "--target", "tflm", "--format", "tflite",
                     "-o", str(path)]) == 0
    model = path.read_bytes()
    arena = runner.smallest_arena(model)
    zeros = [np.zeros((1, 3, 16, 16), np.float32)]
    runner.run(model, arena, zeros)
    with pytest.raises(ExecutionError, match="TFLM"):
        runner.run(model, arena - 1, zeros)


class _PaddedMean(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.pool = torch.nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)

    def forward(self, x):
        return self.pool(torch.relu(self.conv(x)))


class _WideMean(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1), 1))


def test_a_mean_over_more_taps_than_a_table_takes_runs_on_tflm_bit_exact(monkeypatch):
    """576 taps left in the frontend's form (tflm.mean makes it one MEAN: switched off here, as for a plane
    beyond its table): the sums span ~147,000 integers, beyond one 2**16 table, so the mean is a bucketed
    lookup (lookup.py), checked here against the reference on random inputs."""
    from qlower.backends.tflm.mean import TflmMean

    kept = TflmBackend.rewrites
    monkeypatch.setattr(TflmBackend, "rewrites",
                        lambda self, target: tuple(r for r in kept(self, target) if not isinstance(r, TflmMean)))
    model = _WideMean().eval()
    example = (torch.randn(1, 3, 24, 24),)
    calibration = [(torch.randn(1, 3, 24, 24) * 2,) for _ in range(4)]
    prog = qlower.compile(model, example, target="tflm", calibration=calibration, progress=False)
    part = _tflm_partition(prog)
    assert prog.graph.count_ops() == {"delegate": 1}
    assert part.payload.meta["tflite_ops"].get("DIV"), "the bucket index"
    for seed in range(4):
        inputs = _inputs([x.numpy() for x in example], seed)
        inputs = [x * (1 + seed) for x in inputs]   # up to the clamps, where sums reach their ends
        _assert_same(prog.run(*inputs), run_graph(prog.source, inputs))


def test_ops_without_a_tflm_form_stay_on_the_host_named_with_a_reason(tmp_path: Path):
    model, example = _PaddedMean().eval(), (torch.randn(1, 3, 8, 8),)
    calibration = [(torch.randn(1, 3, 8, 8),) for _ in range(4)]
    prog = qlower.compile(model, example, target="tflm", calibration=calibration, progress=False)
    text = prog.explain()
    assert "avg_pool2d" in text and "padded average pool" in text
    assert prog.graph.count_ops().get("avg_pool2d") == 1
    inputs = [x.numpy() for x in example]
    _assert_same(prog.run(*inputs), run_graph(prog.source, inputs))
    with pytest.raises(UnsupportedOpError, match="avg_pool2d.*padded average pool"):
        prog.export(tmp_path / "m.tflite", format="tflite")


def _small_payload() -> tuple[Payload, list[np.ndarray]]:
    prog, example, _ = _compile("digits_cnn")
    return _tflm_partition(prog).payload, example


def test_a_saved_tflm_program_loads_and_runs_the_same(tmp_path: Path):
    prog, example, _ = _compile("digits_cnn")
    prog.save(tmp_path / "p.qlp")
    loaded = qlower.load(tmp_path / "p.qlp")
    _assert_same(loaded.run(*example), prog.run(*example))
    assert "tensor arena" in loaded.explain()


def test_corrupt_payloads_are_errors_with_a_reason_never_a_dead_process():
    payload, example = _small_payload()
    backend = TflmBackend()
    model = payload.blobs[MODEL_BLOB]
    for broken in (model[:100], model[:4] + b"XXXX" + model[8:], b"\xff\xff\xff\x7f" + model[4:],
                   model[:len(model) * 3 // 4]):
        bad = Payload(**{**payload.__dict__, "blobs": {MODEL_BLOB: broken}})
        with pytest.raises(ExecutionError):
            backend.execute(bad, example)
    # bytes no check has seen reach TFLM only in its worker: a crash or refusal there is an ExecutionError
    with pytest.raises(ExecutionError, match="TFLM"):
        runner.run(b"\x10\x00\x00\x00TFL3" + bytes(range(256)) * 4, 4096, example)
    # TFLM itself segfaults allocating into a 16-byte arena: that kills its worker, not this process
    with pytest.raises(ExecutionError, match="crashed.*SIGSEGV"):
        runner.run(model, 16, example)
    assert [y.shape for y in backend.execute(payload, example)] == [(1, 10)], "the pool still runs"
    # a payload read from a file must be exactly qlower's export of its subgraph, with a sane arena
    prog, _, _ = _compile("digits_cnn")
    sub = _tflm_partition(prog).subgraph
    assert backend.check_loaded(sub, payload) is None
    flipped = bytearray(model)
    flipped[-200] ^= 1
    assert "altered" in backend.check_loaded(sub, Payload(**{**payload.__dict__,
                                                            "blobs": {MODEL_BLOB: bytes(flipped)}}))
    huge = Payload(**{**payload.__dict__, "meta": {**payload.meta, "arena_bytes": 1 << 40}})
    assert "arena_bytes" in backend.check_loaded(sub, huge)


@pytest.mark.slow
def test_verify_compares_tflm_per_layer_inside_the_partition():
    model, example, cfg, calibration = zoo.get("tiny_cnn", size=16)
    report = qlower.verify(model, example, target="tflm", quant=cfg, calibration=calibration)
    assert report.ok, str(report)
    assert "tflm.kernel_rounding" in str(report)
    rows = report.as_dict()["layers"]
    inside = [r for r in rows if r["inside_partition"] and r["target_vs_ref"] is not None]
    assert len(inside) >= 4, "the traced run shows TFLM's own tensors inside the partition"
