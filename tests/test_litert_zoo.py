"""Every zoo model and scenario S0-S4 (static configurations) exported to .tflite and run by the stock
LiteRT interpreter: bit-exact with qlower's reference interpreter under LiteRT's reference kernels
(BUILTIN_REF). The file under test is the one ``qlower compile zoo:NAME --target litert --format tflite
-o F`` writes; the same program compiled in-process says what the reference computes.

Image models run at 32x32 (the architecture is the same at any size). Dynamic configurations (S0, S2)
compile for ``litert`` with their run-time quantization on the host; a whole-program .tflite of them is
refused with the op's name, since TFLite has no builtin for run-time scales.

Every one of them is also lowered once more from its canonical program with ``kernels="xnnpack"`` (the
frontend's work shared) and run under LiteRT's XNNPACK delegate at 1 and 2 threads, and four of them with
``kernels="builtin"`` (LiteRT's optimized builtin kernels): bit-exact with the reference interpreter on that
program's form, on the example and on a seeded random batch. (benchmarks/litert_exactness.py measures every
family on every zoo model at its own size.)
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from ai_edge_litert.interpreter import Interpreter, OpResolverType

import qlower
from qlower import cli, zoo
from qlower.api import lower_graph
from qlower.backends.litert.backend import with_threads
from qlower.errors import UnsupportedOpError
from qlower.frontend.config import QuantConfig
from qlower.reference import run_graph

SIZE = 32


def _get(name: str):
    size = SIZE if zoo.default_size(name) else None
    return (size, *zoo.get(name, size=size))


STATIC = [n for n in zoo.names() if n not in ("s0_dynamic_biasless", "s2_perchannel_binary")]


def numpy_inputs(example) -> list[np.ndarray]:
    return [x.detach().numpy() if hasattr(x, "detach") else np.asarray(x) for x in example]


def run_litert(model: bytes, inputs) -> list[np.ndarray]:
    it = Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    details = it.get_input_details()
    assert len(details) == len(inputs)
    for d, x in zip(details, inputs):
        it.set_tensor(d["index"], np.ascontiguousarray(x, dtype=d["dtype"]))
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


@pytest.mark.slow
@pytest.mark.parametrize("name", STATIC)
def test_zoo_model_exported_by_the_cli_is_bit_exact_in_litert(name, tmp_path: Path):
    size, model, example, cfg, calibration = _get(name)
    path = tmp_path / f"{name}.tflite"
    argv = ["compile", f"zoo:{name}", "--target", "litert", "--format", "tflite", "-o", str(path)]
    assert cli.main(argv + (["--size", str(size)] if size else [])) == 0
    written = path.read_bytes()

    prog = qlower.compile(model, example, target="litert", quant=cfg, calibration=calibration, progress=False)
    again = Path(prog.export(tmp_path / "again.tflite", format="tflite")).read_bytes()
    assert written == again, "the CLI's file is the program's export (deterministic)"
    inputs = numpy_inputs(example)
    want = run_graph(prog.source, inputs)
    got = run_litert(written, inputs)
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    # the litert target runs that very model in-process
    for w, g in zip(want, prog.run(*inputs)):
        np.testing.assert_array_equal(g, w)
    for kernels in ("xnnpack", "builtin") if name in BUILTIN else ("xnnpack",):
        assert_kernels_exact(prog, example, kernels)


BUILTIN = ("mobilenet_v2", "s4_attention", "unet_tiny", "timm_vit_tiny")


def _batches(example) -> list[list[np.ndarray]]:
    """The example, and a seeded random batch of the same shapes (integer inputs kept)."""
    gen = torch.Generator().manual_seed(29)
    other = [torch.randn(x.shape, generator=gen).numpy() if x.is_floating_point() else x.numpy() for x in example]
    return [numpy_inputs(example), other]


def assert_kernels_exact(prog, example, kernels: str, dynamic: bool = False) -> None:
    """``prog``'s canonical program lowered once for litert with ``kernels``, run (XNNPACK: at 1 and 2 threads):
    bit-exact with the reference interpreter on its form (run-time-quantized outputs within 1e-5)."""
    lowered = lower_graph(prog.canonical_graph, "litert", backend_options={"kernels": kernels})
    assert lowered.partitions or not prog.partitions, "the kernels took none of what the reference kernels did"
    for batch in _batches(example):
        want = run_graph(lowered.source, batch)
        for threads in (1, 2) if kernels == "xnnpack" else (None,):
            got = with_threads(lowered, threads).run(*batch)
            assert len(got) == len(want)
            for w, g in zip(want, got):
                assert g.dtype == w.dtype and g.shape == w.shape
                if dynamic:
                    np.testing.assert_allclose(g, w, rtol=1e-5, atol=0)
                else:
                    np.testing.assert_array_equal(g, w, err_msg=f"{threads} thread(s)")


@pytest.mark.slow
def test_s2_with_static_quantization_exports_bit_exact(tmp_path: Path):
    _, model, example, _, calibration = _get("s2_perchannel_binary")
    prog = qlower.compile(model, example, target="litert", quant=QuantConfig(), calibration=calibration,
                          progress=False)
    path = prog.export(tmp_path / "s2.tflite", format="tflite")
    inputs = numpy_inputs(example)
    for w, g in zip(run_graph(prog.source, inputs), run_litert(Path(path).read_bytes(), inputs)):
        np.testing.assert_array_equal(g, w)
    assert_kernels_exact(prog, example, "xnnpack")


@pytest.mark.slow
def test_dynamic_scenario_runs_on_litert_and_refuses_a_whole_tflite(tmp_path: Path):
    _, model, example, cfg, calibration = _get("s0_dynamic_biasless")
    assert cfg.mode == "dynamic"
    prog = qlower.compile(model, example, target="litert", quant=cfg, calibration=calibration, progress=False)
    inputs = numpy_inputs(example)
    for w, g in zip(run_graph(prog.source, inputs), prog.run(*inputs)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=0)
    with pytest.raises(UnsupportedOpError, match="dynamic_quantize"):
        prog.export(tmp_path / "s0.tflite", format="tflite")
    assert_kernels_exact(prog, example, "xnnpack", dynamic=True)
