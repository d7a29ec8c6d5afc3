"""What the tflm target does for the arena: an int8 program interface (option io=int8) and global averages
as one TFLM MEAN (tests/test_tflm_mean.py: the int16 sums of the planes too large for it), each bit-exact
on TFLM's interpreter with the reference."""

import numpy as np
import pytest
import tflite
import torch

import qlower
from qlower.backends.tflm import runner
from qlower.errors import ConfigError
from qlower.reference import run_graph


class _ConvMean(torch.nn.Module):
    """conv -> relu -> global average -> linear: the average's plane is ``size`` x ``size``."""

    def __init__(self, channels: int = 8):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.fc = torch.nn.Linear(channels, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def _compile(size: int, **options):
    gen = torch.Generator().manual_seed(size)
    example = (torch.randn(1, 3, size, size, generator=gen),)
    calibration = [(torch.randn(1, 3, size, size, generator=gen) * 2,) for _ in range(4)]
    return qlower.compile(_ConvMean().eval(), example, target="tflm", calibration=calibration, progress=False,
                          backend_options=options or None)


def _tensors(model: bytes) -> list[tuple[str, str, tuple]]:
    """(name, dtype, (scale, zero point) or ()) of each tensor of the model's first subgraph."""
    from qlower.backends.litert.flatbuffer import NUMPY_OF_TFLITE

    sg = tflite.Model.GetRootAsModel(model, 0).Subgraphs(0)
    out = []
    for i in range(sg.TensorsLength()):
        t = sg.Tensors(i)
        q = t.Quantization()
        quant = (float(q.Scale(0)), int(q.ZeroPoint(0))) if q is not None and q.ScaleLength() else ()
        out.append((t.Name().decode(), str(NUMPY_OF_TFLITE[t.Type()]), quant))
    return out


def _io(model: bytes) -> tuple[list[int], list[int]]:
    sg = tflite.Model.GetRootAsModel(model, 0).Subgraphs(0)
    return [sg.Inputs(i) for i in range(sg.InputsLength())], [sg.Outputs(i) for i in range(sg.OutputsLength())]


@pytest.mark.parametrize("size", [16, 12])
def test_a_global_mean_is_one_tflm_mean_bit_exact(size):
    """16x16 ReLU'd codes: the sums reach -128 * 256; the program's mean rounds as TFLM's MEAN (tflm.mean) and
    the file holds one MEAN, no copy of the plane and no lookup table."""
    prog = _compile(size)
    assert prog.graph.count_ops() == {"delegate": 1}, prog.explain()
    assert "tflm.mean" in [r.name for r in prog.rewrites]
    (part,) = prog.partitions
    ops = part.payload.meta["tflite_ops"]
    assert ops.get("MEAN") == 1 and "SUM" not in ops and "GATHER" not in ops, ops
    rng = np.random.default_rng(size)
    for scale in (0.5, 3, 1000):   # 1000: every code at an end, the sums at their bounds
        x = (rng.normal(size=(1, 3, size, size)) * scale).astype(np.float32)
        for g, w in zip(prog.run(x), run_graph(prog.source, [x])):
            np.testing.assert_array_equal(g, w)
    x = np.full((1, 3, size, size), -1000, np.float32)
    for g, w in zip(prog.run(x), run_graph(prog.source, [x])):
        np.testing.assert_array_equal(g, w)


@pytest.mark.slow
def test_ds_cnn_kws_averages_with_one_mean_no_wider_than_its_peak():
    """ds_cnn_kws: its 25x5x64 average is one MEAN (no int16 copy of the plane, no lookup table), so the arena is
    the convolutions' 16,000 B plus the tail."""
    from qlower import zoo

    model, example, cfg, calibration = zoo.get("ds_cnn_kws")
    prog = qlower.compile(model, example, target="tflm", quant=cfg, calibration=calibration, progress=False,
                          backend_options={"io": "int8"})
    (part,) = prog.partitions
    ops = part.payload.meta["tflite_ops"]
    assert ops.get("MEAN") == 1 and "SUM" not in ops and "SPLIT_V" not in ops, ops
    # 16,000 B of activations plus the tail (tensors, nodes, kernels' data): the float32 form needed 40,000 + tail
    assert part.payload.meta["arena_bytes"] < 16_000 + 10_000
    rng = np.random.default_rng(4)
    inputs = [rng.normal(size=x.shape).astype(np.float32) * 2 for x in example]
    for g, w in zip(prog.run(*inputs), run_graph(prog.source, inputs)):
        np.testing.assert_array_equal(g, w)


def test_io_int8_the_tflite_takes_and_returns_the_codes_bit_exact(tmp_path):
    prog, ref = _compile(8, io="int8"), _compile(8)
    # the boundary ops stay on the host, named; the program still takes and returns floats, the same numbers
    assert prog.graph.count_ops() == {"delegate": 1, "quantize": 1, "dequantize": 1}, prog.explain()
    assert "io=int8" in prog.explain()
    (part,), (ref_part,) = prog.partitions, ref.partitions
    assert part.payload.meta["arena_bytes"] < ref_part.payload.meta["arena_bytes"]
    rng = np.random.default_rng(5)
    x = rng.normal(size=(1, 3, 8, 8)).astype(np.float32) * 2
    for g, w in zip(prog.run(x), ref.run(x)):
        np.testing.assert_array_equal(g, w)

    path = tmp_path / "m.tflite"
    prog.export(path)
    model = path.read_bytes()
    tensors = _tensors(model)
    (i,), (o,) = _io(model)
    quantize = next(op for op in prog.source.ops if op.kind == "quantize")
    dequantize = next(op for op in prog.source.ops if op.kind == "dequantize")
    for t, v in ((tensors[i], quantize.result), (tensors[o], dequantize.operands[0])):
        q = v.type.quant
        assert t == (v.name, "int8", (float(np.float32(q.scale[0])), int(q.zero_point[0])))
    # the file on TFLM, fed the reference's codes, returns the reference's codes
    _, env = run_graph(prog.source, [x], keep_all=True)
    codes_in, codes_out = env[quantize.result], env[dequantize.operands[0]]
    arena = runner.smallest_arena(model)
    (got,) = runner.run(model, arena, [codes_in])
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, codes_out)
    # the float32 interface's file takes the floats
    ref.export(tmp_path / "f.tflite")
    f = _tensors((tmp_path / "f.tflite").read_bytes())
    assert f[_io((tmp_path / "f.tflite").read_bytes())[0][0]][1] == "float32"


def test_io_must_be_float32_or_int8():
    with pytest.raises(ConfigError, match="io"):
        _compile(8, io="int4")

