"""The float host fallback (DESIGN.md rule 8): nothing exportable is refused.

An op without an integer rule becomes an ``aten`` op whose meaning is the core
ATen op it names. These tests check its semantics against eager PyTorch written
out here (never through the code under test), its placement and explanation,
that cpu is bit-exact with the reference around it, that the program file stores
it safely, and that composite ops are decomposed into integer pieces.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from torch import nn

import qlower
from qlower.errors import InputError, InvalidProgramError
from qlower.frontend import QuantConfig
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.program.irjson import TensorReader, TensorWriter, decode_graph, encode_graph
from qlower.reference import run_graph
from qlower.reference.aten_fallback import Operand, encode_call

SEED = 1234


def _line_of(fn, text: str) -> str:
    lines, start = inspect.getsourcelines(fn)
    return f"test_float_fallback.py:{start + next(i for i, line in enumerate(lines) if text in line)}"


class Mixed(nn.Module):
    """Integer conv/linear around ops without integer rules (cumsum, a floor division, nan_to_num)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = torch.cumsum(self.conv(x), dim=3).flatten(2).transpose(1, 2)
        y = self.fc(y)
        z = torch.div(y, y.abs() + 1, rounding_mode="floor")
        return z + y.sqrt().nan_to_num()


def _inputs(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(SEED))


@pytest.fixture(scope="module")
def mixed():
    torch.manual_seed(SEED)
    model = Mixed().eval()
    x = _inputs(1, 3, 8, 8)
    calibration = [(_inputs(1, 3, 8, 8) * s,) for s in (0.5, 1.0, 2.0)]
    return model, x, calibration


def _fallbacks(graph) -> list[str]:
    return [op.attrs["target"] for op in graph.ops if op.kind == "aten"]


def test_reference_fallback_is_the_eager_aten_op_on_the_dequantized_inputs(mixed):
    """Each fallback's reference result equals eager PyTorch's on the very same inputs."""
    model, x, calibration = mixed
    prog = qlower.compile(model, (x,), target="reference", calibration=calibration, progress=False)
    graph = prog.source
    assert "aten.cumsum.default" in _fallbacks(graph) and "aten.div.Tensor_mode" in _fallbacks(graph)
    _, env = run_graph(graph, [x.numpy()], keep_all=True)
    eager = {  # written out independently of qlower's argument encoding
        "aten.cumsum.default": lambda a: torch.cumsum(a, dim=3),  # fallbacks see PyTorch's layout (NCHW)
        "aten.div.Tensor_mode": lambda a, b: torch.div(a, b, rounding_mode="floor"),
        "aten.sqrt.default": torch.sqrt,
    }
    checked = 0
    for op in graph.ops:
        fn = eager.get(op.attrs.get("target")) if op.kind == "aten" else None
        if fn is None:
            continue
        args = [torch.from_numpy(env[v].copy()) for v in op.operands[0]]
        want = fn(*args).numpy()
        np.testing.assert_array_equal(env[op.results[0]], want)
        checked += 1
    assert checked >= 3


def test_cpu_is_bit_exact_with_the_reference_around_fallbacks(mixed):
    model, x, calibration = mixed
    ref = qlower.compile(model, (x,), target="reference", calibration=calibration, progress=False)
    cpu = qlower.compile(model, (x,), target="cpu", calibration=calibration, progress=False)
    want = run_graph(ref.source, [x.numpy()])
    for got, exp in zip(cpu.run(x), want):
        np.testing.assert_array_equal(got, exp)
    with torch.no_grad():
        eager = model(x).numpy()
    # int8 around float ops stays close to the float model (floor division may jump a whole unit
    # where one quantization step crosses an integer, so the bound is on the typical element)
    assert np.median(np.abs(want[0] - eager)) < 0.02


def test_fallbacks_split_partitions_and_explain_names_them(mixed):
    model, x, calibration = mixed
    prog = qlower.compile(model, (x,), target="tosa-1.0+int", calibration=calibration, progress=False)
    text = prog.explain()
    assert "no quantized rule for aten.cumsum.default; runs in float on the host" in text
    assert _line_of(Mixed.forward, "torch.cumsum") in text
    assert any(op.kind == "fully_connected" for p in prog.partitions for op in p.subgraph.ops)
    want = run_graph(prog.source, [x.numpy()])
    np.testing.assert_array_equal(prog.run(x)[0], want[0])
    cpu_prog = qlower.compile(model, (x,), target="cpu", calibration=calibration, progress=False)
    assert "aten.cumsum.default" in cpu_prog.explain()


def test_fallback_error_keeps_the_program_integer(mixed):
    model, x, calibration = mixed
    with pytest.raises(qlower.errors.UnsupportedOpError, match="cumsum.*fallback='error'"):
        qlower.compile(model, (x,), target="cpu", quant=QuantConfig(fallback="error"), calibration=calibration,
                       progress=False)


def test_program_with_fallbacks_round_trips(mixed, tmp_path):
    model, x, calibration = mixed
    prog = qlower.compile(model, (x,), target="cpu", calibration=calibration, progress=False)
    path = tmp_path / "mixed.qlp"
    prog.save(path)
    again = qlower.load(path)
    np.testing.assert_array_equal(again.run(x)[0], prog.run(x)[0])


def _fallback_graph(out_shape=(2, 1)):
    b = GraphBuilder("fb")
    x = b.input("x", TensorType((2, 5), DType.FLOAT32))
    plain = QuantSpec.plain_integer()
    top, where = b.op("aten", (x,), target="aten.max.dim", args=encode_call([Operand(0), 1, True], {}),
                      in_dtypes=("float32",), out_dtypes=("float32", "int64"),
                      out_types=(TensorType(out_shape, DType.FLOAT32), TensorType(out_shape, DType.INT32, plain)))
    return b.build([top, where])


def _reload(graph, target: str | None = None, args: str | None = None):
    """Save and load ``graph``, with the fallback's stored target or arguments replaced as a forger would."""
    writer = TensorWriter()
    encoded = encode_graph(graph, writer)
    attrs = encoded["ops"][0]["attrs"]
    attrs["target"] = target or attrs["target"]
    attrs["args"] = args or attrs["args"]
    return decode_graph(encoded, TensorReader(writer.arrays), "graph")


def test_two_result_fallback_runs_and_reloads():
    x = np.random.default_rng(SEED).standard_normal((2, 5)).astype(np.float32)
    top, where = run_graph(_reload(_fallback_graph()), [x])
    np.testing.assert_array_equal(top[:, 0], x.max(axis=1))
    np.testing.assert_array_equal(where[:, 0], x.argmax(axis=1))
    assert where.dtype == np.int32


@pytest.mark.parametrize("target, args, shape, message", [
    ("aten.layer_norm.default", None, (2, 1), "not in PyTorch's core ATen"),
    ("aten.add_.Tensor", None, (2, 1), "not in PyTorch's core ATen"),
    ("aten.atan2.out", None, (2, 1), "writes into its arguments"),
    ("aten.randn.default", None, (2, 1), "random"),
    ("aten.nosuchop.default", None, (2, 1), "no such op"),
    ("builtins.eval", None, (2, 1), "aten op"),
    ("aten.amax.default", '{"args":[{"input":0},[1],false],"kwargs":{}}', (2, 1), "produces"),
    (None, '{"args":[{"input":7}],"kwargs":{}}', (2, 1), "unknown tag or a bad value"),
    (None, '{"args":[{"pickle":"x"}],"kwargs":{}}', (2, 1), "unknown tag"),
    (None, "not json", (2, 1), "not valid JSON"),
    (None, '{"args":[{"input":0},"dim"],"kwargs":{}}', (2, 1), "rejects its stored arguments"),
    (None, None, (3, 1), "typed"),
])
def test_loader_rejects_hostile_fallback_calls(target, args, shape, message):
    with pytest.raises(InvalidProgramError, match=message):
        _reload(_fallback_graph(shape), target, args)


class TokenModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.fc = nn.Linear(8, 4)

    def forward(self, ids):
        return self.fc(self.emb(ids)).relu()


def test_integer_graph_inputs_token_ids():
    torch.manual_seed(SEED)
    model = TokenModel().eval()
    ids = torch.tensor([[1, 5, 15, 0, 7]])
    calibration = [(torch.randint(0, 16, (1, 5), generator=torch.Generator().manual_seed(s)),) for s in range(4)]
    ref = qlower.compile(model, (ids,), target="reference", calibration=calibration, progress=False)
    cpu = qlower.compile(model, (ids,), target="cpu", calibration=calibration, progress=False)
    assert ref.source.inputs[0].type.quant.is_plain_integer
    want = run_graph(ref.source, [ids.numpy()])[0]
    np.testing.assert_array_equal(cpu.run(ids.numpy())[0], want)
    with torch.no_grad():
        assert np.abs(want - model(ids).numpy()).max() < 0.1
    with pytest.raises(InputError, match="input 0 .* has dtype float32"):
        cpu.run(ids.numpy().astype(np.float32))
    with pytest.raises(InputError, match="outside int32"):
        cpu.run(np.array([[2**40, 0, 0, 0, 0]]))
    with pytest.raises(qlower.errors.ExecutionError):  # an id outside the table: an error, not a wrong number
        cpu.run(np.array([[99, 0, 0, 0, 0]]))


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(6, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        out, _ = self.lstm(x)
        a, b = out.chunk(2, dim=-1)
        return self.head(torch.cat([b, a], dim=-1)[:, -1])


def test_composite_ops_are_decomposed_into_integer_pieces():
    torch.manual_seed(SEED)
    model = Recurrent().eval()
    x = _inputs(1, 5, 6)
    prog = qlower.compile(model, (x,), target="cpu", calibration=[(x,), (x * 2,)], progress=False)
    kinds = prog.source.count_ops()
    targets = _fallbacks(prog.source)
    assert not any("lstm" in t or "chunk" in t for t in targets), targets
    assert kinds.get("fully_connected", 0) >= 5  # input and hidden projections of each step, and the head
    want = run_graph(prog.source, [x.numpy()])[0]
    np.testing.assert_array_equal(prog.run(x)[0], want)
    with torch.no_grad():
        assert np.abs(want - model(x).numpy()).max() < 0.1


def test_verification_report_names_fallbacks(mixed, tmp_path):
    model, x, calibration = mixed
    report = qlower.verify(model, (x,), target="tosa-1.0+int", calibration=calibration, progress=False)
    assert report.ok, report.problems
    cumsum = next(f for f in report.float_fallbacks if f["op"] == "aten.cumsum.default")
    assert _line_of(Mixed.forward, "torch.cumsum") in cumsum["source"]
    assert "runs in float on the host" in str(report)
    html = report.write_html(tmp_path / "r.html").read_text()
    assert "id='fallbacks'" in html and "aten.cumsum.default" in html


class FloatSoftmaxUnderMask(nn.Module):
    """A bool mask fills the float input with -inf, which has no int8 code, and the masked values are
    shifted: the softmax reads floats (a softmax of masked scores, scaled or not, is integer)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        mask = torch.ones(6, 6, dtype=torch.bool).tril()
        return self.fc(torch.softmax(x.masked_fill(~mask, float("-inf")) - 1.0, dim=-1))


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_host_only_programs_name_every_float_op(target):
    torch.manual_seed(SEED)
    model = FloatSoftmaxUnderMask().eval()
    x = _inputs(1, 6, 6)
    prog = qlower.compile(model, (x,), target=target, calibration=[(x,)], progress=False)
    named = {d.op for d in prog.decisions}
    boundary = {"constant", "quantize", "dequantize", "dynamic_quantize", "cast", "delegate"}
    float_ops = [op for op in prog.graph.ops if op.kind not in boundary and any(r.dtype.is_float for r in op.results)]
    assert float_ops and set(float_ops) <= named
    assert "float softmax" in prog.explain()


class IdsMask(nn.Module):
    """Comparisons and casts of integer graph inputs: PyTorch's integer semantics, in float on the host."""

    def forward(self, x, ids):
        mask = (ids > 2).to(torch.float32)
        return x * mask + ids.float()


@pytest.mark.parametrize("quant", [None, QuantConfig()], ids=["float", "int8"])
def test_comparisons_and_casts_of_integer_inputs(quant):
    x = _inputs(1, 5)
    ids = torch.tensor([[1, 2, 3, 40000, -7]])
    prog = qlower.compile(IdsMask(), (x, ids), target="cpu", quant=quant, progress=False)
    assert {"aten.gt.Scalar", "aten._to_copy.default"} <= set(_fallbacks(prog.source))
    want = IdsMask()(x, ids).numpy()
    got = prog.run(x, ids)[0]
    np.testing.assert_array_equal(run_graph(prog.source, [x.numpy(), ids.numpy()])[0], got)
    if quant is None:
        np.testing.assert_array_equal(got, want)
    else:  # the output is quantized; the ids enter exactly
        assert np.abs(got - want).max() <= (want.max() - want.min()) / 255 * 1.01
