"""The ``litert`` target: compile, partition, run in LiteRT with each kernel family, save and load,
and refuse hostile payloads before LiteRT's native code reads them."""

import dataclasses
import threading

import numpy as np
import pytest
import torch

import qlower
from qlower.backends.litert.verify import builtin_counts, verify_tflite
from qlower.errors import InputError, InvalidProgramError
from qlower.program.fileformat import program_from_bytes, program_to_bytes
from qlower.reference import run_graph

SEED = 20261123


class ConvNet(torch.nn.Module):
    """Three input channels first (XNNPACK requantizes that conv in float32), a residual add, a linear."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = y + self.c2(y)
        return self.fc(y.mean((2, 3)))


def _model():
    torch.manual_seed(SEED)
    model = ConvNet().eval()
    gen = torch.Generator().manual_seed(SEED)
    example = (torch.randn(1, 3, 12, 12, generator=gen),)
    calibration = [(torch.randn(1, 3, 12, 12, generator=gen),) for _ in range(4)]
    return model, example, calibration


@pytest.fixture(scope="module")
def programs():
    model, example, calibration = _model()
    return {k: qlower.compile(model, example, target="litert", calibration=calibration, progress=False,
                              backend_options={"kernels": k}) for k in ("reference", "builtin", "xnnpack")}


def _inputs(n=6):
    gen = torch.Generator().manual_seed(SEED + 1)
    return [torch.randn(1, 3, 12, 12, generator=gen).numpy() * 2 for _ in range(n)]


def test_whole_graph_is_one_litert_partition(programs):
    prog = programs["reference"]
    assert len(prog.partitions) == 1 and prog.partitions[0].backend == "litert"
    assert [op.kind for op in prog.graph.ops if op.kind != "constant"] == ["delegate"]
    meta = prog.partitions[0].payload.meta
    assert meta["kernels"] == "reference" and "bit-exact" in meta["exactness"]
    # the depthwise conv, and the mean over H and W: an average pool, its window sums a float depthwise conv
    assert meta["tflite_ops"]["CONV_2D"] == 1 and meta["tflite_ops"]["DEPTHWISE_CONV_2D"] == 2
    assert _int8_adds(prog.partitions[0].payload.blobs["model.tflite"]) == 1, "the residual add: TFLite's ADD"


def _int8_adds(model: bytes) -> int:
    """ADD operators writing int8 tensors (TFLite's quantized ADD kernel)."""
    import tflite
    from tflite.BuiltinOperator import BuiltinOperator
    from tflite.TensorType import TensorType

    m = tflite.Model.GetRootAsModel(model, 0)
    sg = m.Subgraphs(0)
    ops = (sg.Operators(i) for i in range(sg.OperatorsLength()))
    return sum(m.OperatorCodes(op.OpcodeIndex()).BuiltinCode() == BuiltinOperator.ADD
               and sg.Tensors(op.Outputs(0)).Type() == TensorType.INT8 for op in ops)


@pytest.mark.parametrize("kernels", ["reference", "builtin", "xnnpack"])
def test_every_kernel_family_is_bit_exact(programs, kernels):
    prog = programs[kernels]
    for x in _inputs():
        np.testing.assert_array_equal(prog.run(x)[0], run_graph(prog.source, [x])[0])
    meta = prog.partitions[0].payload.meta
    assert "bit-exact" in meta["exactness"] and "execution" not in meta   # nothing for `qlower run` to caution
    assert kernels in meta["exact_kernels"]


def test_xnnpack_program_takes_xnnpacks_rounding_and_add_at_1_and_2_threads(programs):
    """The model compiled for XNNPACK: float32 requantization in every conv, XNNPACK's ADD; its reference
    computes what the delegate computes at 1 and 2 threads (test_litert_xnnpack.py shows that the data
    tells the roundings apart)."""
    prog = programs["xnnpack"]
    roundings = {op.attrs["rounding"] for op in prog.source.ops if op.kind == "rescale"}
    assert {"fp32", "integer_multiplier"} <= roundings and "double_half_up" not in roundings
    gen = torch.Generator().manual_seed(SEED + 2)
    for x in [torch.randn(1, 3, 12, 12, generator=gen).numpy() * 3 for _ in range(10)]:
        want = run_graph(prog.source, [x])[0]
        for threads in (1, 2):
            np.testing.assert_array_equal(_with_meta(prog, threads=threads).run(x)[0], want)


def _delegated(model: bytes, threads: int = 1) -> list[str]:
    """The operators LiteRT runs once the default delegates took their share ("DELEGATE" for each)."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=model, num_threads=threads)
    it.allocate_tensors()
    ops = it._get_ops_details()   # the original operators, then one node per delegated subgraph
    return [o["op_name"] for o in ops if o["op_name"] == "DELEGATE"]


def test_xnnpack_payload_takes_xnnpacks_own_forms_and_runs_as_one_delegate(programs, tmp_path):
    """QUANTIZE, MEAN, one int8 ADD and DEQUANTIZE instead of the exact plain-integer forms (CAST,
    FLOOR_MOD, GATHER, a float depthwise conv of ones), which XNNPACK doesn't take and which split
    its subgraph."""
    payload = programs["xnnpack"].partitions[0].payload
    ops = payload.meta["tflite_ops"]
    assert payload.meta["forms"] == "native" and programs["reference"].partitions[0].payload.meta["forms"] == "exact"
    assert {"QUANTIZE", "MEAN", "DEQUANTIZE"} <= set(ops) and ops["DEPTHWISE_CONV_2D"] == 1
    assert not {"CAST", "GATHER", "FLOOR_MOD", "MUL", "SUM"} & set(ops)
    assert _int8_adds(payload.blobs["model.tflite"]) == 1
    assert _delegated(payload.blobs["model.tflite"]) == ["DELEGATE"]
    exact = programs["reference"].partitions[0].payload.blobs["model.tflite"]
    assert len(_delegated(exact)) > 1, "the exact forms split XNNPACK's subgraph (why native forms exist)"
    # the file a user deploys has the forms the partition runs
    with open(programs["xnnpack"].export(tmp_path / "m.tflite"), "rb") as f:
        deployed = f.read()
    assert builtin_counts(deployed) == ops and _delegated(deployed) == ["DELEGATE"]


class _Mean(torch.nn.Module):
    def forward(self, x):
        return x.mean((2, 3))


def test_xnnpack_quantize_mean_dequantize_are_exact():
    """QUANTIZE, MEAN and DEQUANTIZE alone in XNNPACK (test_litert_xnnpack.py draws the MEAN's cases)."""
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(1, 16, 7, 7, generator=gen)
    calibration = [(torch.randn(1, 16, 7, 7, generator=gen) * 2,) for _ in range(4)]
    prog = qlower.compile(_Mean().eval(), (x,), target="litert", calibration=calibration, progress=False,
                          backend_options={"kernels": "xnnpack"})
    assert set(prog.partitions[0].payload.meta["tflite_ops"]) >= {"QUANTIZE", "MEAN", "DEQUANTIZE"}
    for x in [torch.randn(1, 16, 7, 7, generator=gen).numpy() * 2 for _ in range(20)]:
        np.testing.assert_array_equal(prog.run(x)[0], run_graph(prog.source, [x])[0])


def test_save_and_load_run_the_same_numbers_with_the_same_kernels(programs, tmp_path):
    for kernels, prog in programs.items():
        path = tmp_path / f"{kernels}.qlp"
        prog.save(path)
        again = qlower.load(path)
        assert again.partitions[0].payload.meta["kernels"] == kernels
        for x in _inputs(2):
            np.testing.assert_array_equal(again.run(x)[0], prog.run(x)[0])


def _with_model_bytes(prog, model: bytes):
    part = prog.partitions[0]
    payload = dataclasses.replace(part.payload, blobs={**part.payload.blobs, "model.tflite": model})
    return dataclasses.replace(prog, partitions=[dataclasses.replace(part, payload=payload)], _runner=None)


def test_an_altered_payload_byte_is_refused_at_load(programs):
    """A forger who flips a byte of model.tflite and reseals the file (the checksum is recomputed by
    program_to_bytes) gets an InvalidProgramError at load, wherever the byte is."""
    prog = programs["reference"]
    model = prog.partitions[0].payload.blobs["model.tflite"]
    rng = np.random.default_rng(SEED)
    for pos in [*rng.integers(0, len(model), 25), 0, 4, len(model) - 1]:
        forged = bytearray(model)
        forged[pos] ^= 1 + int(rng.integers(0, 255))
        data = program_to_bytes(_with_model_bytes(prog, bytes(forged)))
        with pytest.raises(InvalidProgramError, match="partition 'p0'"):
            program_from_bytes(data)
    truncated = program_to_bytes(_with_model_bytes(prog, model[:100]))
    with pytest.raises(InvalidProgramError):
        program_from_bytes(truncated)


def _with_meta(prog, **meta):
    part = prog.partitions[0]
    payload = dataclasses.replace(part.payload, meta={**part.payload.meta, **meta})
    return dataclasses.replace(prog, partitions=[dataclasses.replace(part, payload=payload)], _runner=None)


def test_native_forms_load_only_for_xnnpack_and_older_exact_xnnpack_payloads_still_load(programs):
    from qlower.backends.litert.export import export_tflite
    from qlower.backends.litert.verify import model_description

    native = programs["xnnpack"]
    with pytest.raises(InvalidProgramError, match="forms 'native' don't belong to its reference kernels"):
        program_from_bytes(program_to_bytes(_with_meta(native, kernels="reference")))
    with pytest.raises(InvalidProgramError, match="not what qlower writes"):
        program_from_bytes(program_to_bytes(_with_meta(native, forms="exact")))
    # a payload written before native forms: kernels xnnpack, exact forms, no "forms" key
    part = native.partitions[0]
    exact = export_tflite(part.subgraph, description=model_description(part.subgraph, "xnnpack"))
    old = _with_model_bytes(native, exact)
    old.partitions[0].payload.meta.pop("forms")
    again = program_from_bytes(program_to_bytes(old))
    x = _inputs(1)[0]
    np.testing.assert_array_equal(again.run(x)[0], native.run(x)[0])


def test_verify_rejects_malformed_models_with_a_reason_and_nothing_else(programs):
    model = programs["reference"].partitions[0].payload.blobs["model.tflite"]
    verify_tflite(model)
    for bad in (b"", b"TFL3", b"\x00" * 64, model[:len(model) // 2], model[:7] + b"X" + model[8:]):
        with pytest.raises(InvalidProgramError):
            verify_tflite(bad)
    rng = np.random.default_rng(SEED)
    rejected = 0
    for _ in range(300):
        forged = bytearray(model)
        for pos in rng.integers(0, min(len(model), 4096), int(rng.integers(1, 4))):   # the tables lie up front
            forged[pos] = int(rng.integers(0, 256))
        try:
            verify_tflite(bytes(forged))
        except InvalidProgramError:
            rejected += 1
    assert rejected > 50


def test_an_unverifiable_payload_in_memory_is_an_error_not_a_crash(programs):
    prog = _with_model_bytes(programs["reference"], b"TFL3" * 10)
    with pytest.raises(InvalidProgramError):
        prog.run(_inputs(1)[0])


def test_many_threads_run_one_program(programs):
    prog = programs["reference"]
    xs = _inputs(4)
    want = [run_graph(prog.source, [x])[0] for x in xs]
    errors = []

    def work(k):
        try:
            for i in range(25):
                np.testing.assert_array_equal(prog.run(xs[(i + k) % 4])[0], want[(i + k) % 4])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_bad_inputs_and_options_are_clear_errors(programs):
    x = _inputs(1)[0]
    x[0, 0, 0, 0] = np.nan
    with pytest.raises(InputError, match="NaN"):
        programs["reference"].run(x)
    with pytest.raises(InputError, match="shape"):
        programs["reference"].run(np.zeros((1, 3, 11, 12), np.float32))
    model, example, calibration = _model()
    with pytest.raises(ValueError, match="reference, builtin, xnnpack"):
        qlower.compile(model, example, target="litert", backend_options={"kernels": "fast"}, progress=False)


def test_verify_compares_every_layer_inside_the_partition():
    model, example, calibration = _model()
    report = qlower.verify(model, example, target="litert", calibration=calibration, progress=False)
    assert report.ok
    text = report.table()
    assert "litert" in text


def test_cli_format_errors_are_usage_errors(capsys):
    from qlower import cli

    assert cli.main(["compile", "zoo:tiny_cnn", "--size", "16", "--target", "litert", "--format", "tflite"]) == 2
    assert "--format tflite needs -o" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["compile", "zoo:tiny_cnn", "--format", "onnx", "-o", "x.onnx"])
    assert e.value.code == 2


def test_export_refuses_an_unknown_format(programs, tmp_path):
    with pytest.raises(ValueError, match="formats: tflite"):
        programs["reference"].export(tmp_path / "m.onnx", format="onnx")
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("side", [7, 40])
def test_a_global_mean_is_exact_on_litert_at_any_size(side):
    """A mean over H and W is an int16 average pool: a small one sums its windows in float32 (exact
    below 2**24), a 40x40 one in int32 (TFLite's SUM); both stay in the partition, bit-exact."""
    class Mean(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 1)

        def forward(self, x):
            return self.conv(x).mean((2, 3))

    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(1, 3, side, side, generator=gen)
    prog = qlower.compile(Mean().eval(), (x,), target="litert", calibration=[(x,), (x * 1.5,)], progress=False)
    ops = prog.partitions[0].payload.meta["tflite_ops"]
    assert ("SUM" in ops) == (side == 40) and len(prog.partitions) == 1
    assert not {d.op.kind for d in prog.decisions} - {"quantize", "dequantize", "transpose", "reshape"}
    np.testing.assert_array_equal(prog.run(x)[0], run_graph(prog.source, [x.numpy()])[0])


def test_without_a_thread_count_litert_uses_every_core_it_may(monkeypatch):
    """LiteRT on its own runs one thread; a program compiled without ``threads`` uses the cores the
    process may run on, as the cpu backend does, and an explicit count is kept."""
    import os

    import ai_edge_litert.interpreter as litert

    from qlower.backends.litert import backend

    seen = []
    real = litert.Interpreter

    def spy(*args, **kwargs):
        seen.append(kwargs["num_threads"])
        return real(*args, **kwargs)

    monkeypatch.setattr(litert, "Interpreter", spy)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    backend._interpreters.clear()
    model, example, calibration = _model()
    for threads in (None, 1):
        prog = qlower.compile(model, example, target="litert", calibration=calibration, progress=False,
                              backend_options={"kernels": "xnnpack", "threads": threads})
        prog.run(_inputs(1)[0])
    assert seen == [3, 1]


@pytest.mark.parametrize("kernels", ["reference", "xnnpack"])
def test_each_run_reads_its_own_input_whatever_its_layout(programs, kernels):
    """The runner writes each input into the interpreter's own buffer: a strided view, a read-only array (the
    host plan hands partitions read-only views) and a plain one, each run right after a run on another input,
    give the reference's codes for their own values (none of them reads the buffer the run before left)."""
    from qlower.backends.litert.backend import LiteRtBackend

    prog = programs[kernels]
    run = LiteRtBackend(kernels).execute
    payload = prog.partitions[0].payload
    xs = _inputs(4)
    wants = [run_graph(prog.source, [x])[0] for x in xs]
    for before, x, want in zip(xs[1:] + xs[:1], xs, wants):
        wide = np.zeros((1, 3, 24, 24), np.float32)
        wide[:, :, ::2, 1::2] = x
        frozen = x.copy()
        frozen.flags.writeable = False
        for y in (wide[:, :, ::2, 1::2], frozen, x):
            run(payload, [before])
            np.testing.assert_array_equal(run(payload, [y])[0], want)
            prog.run(before)
            np.testing.assert_array_equal(prog.run(y)[0], want)
