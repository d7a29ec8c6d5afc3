"""Data-movement ops on int8 codes, and integer graph inputs (token ids into an embedding).

Each op family is compiled once (PT2E quantization + import) and lowered for
reference, cpu and tosa-1.0+int. For every target the test checks that the op
is integer (no float ``aten`` fallback, the op's IR results are int8 codes),
that the target is bit-exact with the reference interpreter (the program's own
run against ``run_graph``, and the per-layer verification report), and that the
reference is within one quantization step of PyTorch's fake-quant model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qlower
from qlower.api import lower_graph
from qlower.backends.cpu import prepare
from qlower.backends.tosa import TosaBackend
from qlower.errors import CompileError, ExecutionError, InputError, VerificationError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph
from qlower.verification import verify_program

SEED = 7
TARGETS = ("reference", "cpu", "tosa-1.0+int")
MOVEMENT = {"slice", "concat", "reshape", "transpose", "pad", "gather"}


def _randn(*shape: int, seed: int = SEED) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class Around(nn.Module):
    """A conv (so the ops see int8 codes), then each op of a family on its result: one output per op."""

    def __init__(self, fns):
        super().__init__()
        self.fns = fns
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        return tuple(fn(y) for fn in self.fns)


def _split_cat(y, sizes, dim):
    parts = torch.split(y, sizes, dim=dim)
    return torch.cat([parts[-1], parts[0]], dim=dim)


def _vit_unbind(y):
    """timm's attention: ``q, k, v = qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)``."""
    qkv = y.flatten(2)[:, :3].transpose(1, 2).reshape(1, 6, 3, 2, 3).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    return torch.cat((q, k, v), dim=-1)


FAMILIES = {
    "split": [
        lambda y: _split_cat(y, [1, 3], 1),                       # split_with_sizes
        lambda y: _split_cat(y, 2, 3),                            # split.Tensor
        lambda y: torch.cat(torch.chunk(y, 3, dim=2)[::-1], dim=2),
        lambda y: torch.cat(y.unbind(1), dim=2),
        _vit_unbind,
        lambda y: y.select(1, 2),
        lambda y: y.narrow(2, 1, 3),
    ],
    "reorder": [
        lambda y: y.flip(2, 3),
        lambda y: torch.roll(y, (2, -1), (3, 1)),
        lambda y: torch.roll(y, 5),                                # flattened
        lambda y: torch.index_select(y, 3, torch.tensor([0, 5, 2, 2])),
        lambda y: torch.index_select(y, 1, torch.tensor([1, 2])),  # a run: one slice
        lambda y: torch.gather(y, 3, torch.tensor([[[[0, 5, 2]]]]).expand(1, 4, 6, 3)),
        lambda y: y[:, [1, 0, 3, 2]],                              # aten.index with one constant index
    ],
    "repeat": [
        lambda y: y.repeat(1, 2, 1, 2),
        lambda y: torch.tile(y, (2, 1)),
        lambda y: y[:, :1].expand(1, 3, 6, 6),
        lambda y: torch.stack([y, y.flip(1)], dim=2),
    ],
    "reshape": [
        lambda y: y[:, :1].squeeze(1).unsqueeze(0).flatten(2).unflatten(2, (3, 12)),
        lambda y: F.pixel_shuffle(y, 2),
        lambda y: F.pixel_unshuffle(y, 2),
    ],
    "pad": [
        lambda y: F.pad(y, (1, 2, 0, 1), value=0.5),
        lambda y: F.pad(y, (1, 2, 2, 1), mode="reflect"),
        lambda y: F.pad(y, (1, 2, 2, 1), mode="replicate"),
        lambda y: F.pad(y, (2, 1, 1, 0), mode="circular"),
        lambda y: F.pad(y.flatten(2), (3, 2), mode="reflect"),     # reflection_pad1d
        lambda y: F.pad(y.flatten(2), (0, 3), mode="replicate"),   # replication_pad1d
    ],
}


def _compile_all(model, example, calibration):
    """One import, lowered for every target (with the traces verification reads)."""
    base = qlower.compile(model, example, target="reference", calibration=calibration, progress=False,
                          trace=True)
    progs = {}
    for t in TARGETS:
        prog = base if t == "reference" else lower_graph(base.source, t, trace=True)
        prog.frontend = base.frontend
        progs[t] = prog
    return progs


def _check_exact(progs, inputs):
    graph = next(iter(progs.values())).source
    want = run_graph(graph, [np.asarray(x) for x in inputs])
    for t, prog in progs.items():
        got = prog.run(*[np.asarray(x) for x in inputs])
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w, err_msg=f"{t} differs from the reference interpreter")
        report = verify_program(prog, [tuple(torch.as_tensor(np.asarray(x)) for x in inputs)])
        assert report.ok, f"{t}: {report.problems}"
        for o in report.outputs:
            if o.ref_vs_fake_quant is not None:
                assert o.ref_vs_fake_quant.max_steps <= 1 + 1e-4, f"output {o.index}: {o.ref_vs_fake_quant}"
        compared = [r for r in report.layers if r.isolated_vs_fake_quant is not None]
        assert compared, "no layer compared with fake-quant"
        assert all(r.isolated_vs_fake_quant.max_steps <= 1 + 1e-4 for r in compared)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_movement_ops_are_integer_and_exact(family):
    torch.manual_seed(SEED)
    model = Around(FAMILIES[family]).eval()
    x = _randn(1, 3, 6, 6)
    calibration = [(x * s,) for s in (0.5, 1.0, 2.0)]
    progs = _compile_all(model, (x,), calibration)
    graph = progs["reference"].source
    assert not [op.attrs["target"] for op in graph.ops if op.kind == "aten"]
    moved = [op for op in graph.ops if op.kind in MOVEMENT]
    assert moved, "the ops vanished"
    for op in moved:  # on codes, in the input's domain
        assert op.result.dtype is DType.INT8, (op.kind, op.result.type)
    # TOSA takes every data-movement op (gathers at constant indices included)
    tosa = progs["tosa-1.0+int"]
    on_host = [(d.op.kind, d.reason) for d in tosa.decisions if d.op.kind in MOVEMENT]
    assert tosa.partitions and not on_host, on_host
    if family == "reorder":  # constant gathers: GATHER, and a flip is one REVERSE
        emitted = {k for p in tosa.partitions for k in p.payload.meta["tosa_ops"]}
        assert {"GATHER", "REVERSE"} <= emitted, emitted
    _check_exact(progs, (_randn(1, 3, 6, 6, seed=SEED + 1),))


class TokenModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(12, 8)
        self.fc = nn.Linear(8, 5)

    def forward(self, ids):
        return self.fc(F.relu(self.emb(ids)))


@pytest.fixture(scope="module")
def token_programs():
    torch.manual_seed(SEED)
    model = TokenModel().eval()
    g = torch.Generator().manual_seed(SEED)
    calibration = [(torch.randint(0, 12, (2, 6), generator=g),) for _ in range(3)]
    calibration.append((torch.arange(12).reshape(2, 6),))  # every row of the table observed
    return model, _compile_all(model, calibration[0], calibration)


def test_embedding_on_token_ids_is_integer_end_to_end(token_programs):
    model, progs = token_programs
    graph = progs["reference"].source
    assert graph.inputs[0].dtype is DType.INT32 and graph.inputs[0].quant.is_plain_integer
    assert not [op for op in graph.ops if op.kind == "aten"]
    (lookup,) = [op for op in graph.ops if op.kind == "gather"]
    assert lookup.result.dtype is DType.INT8 and lookup.operands[1] is graph.inputs[0]
    ids = np.array([[3, 0, 11, 7, 7, 1], [5, 9, 2, 10, 4, 6]], dtype=np.int64)
    _check_exact(progs, (ids,))
    # end to end against eager PyTorch: within the quantization error of an int8 table and output
    with torch.no_grad():
        eager = model(torch.from_numpy(ids)).numpy()
    for t, prog in progs.items():
        (out,) = prog.run(ids)
        assert out.shape == eager.shape and np.abs(out - eager).max() < 0.1 * np.abs(eager).max(), t
    # on TOSA the linear is delegated; the lookup stays on the host, where run-time ids are checked
    tosa = progs["tosa-1.0+int"]
    assert tosa.partitions and any(op.kind == "gather" for op in tosa.graph.ops)


@pytest.mark.parametrize("bad", [12, -1, 2**40])
def test_token_id_outside_the_table_is_a_clear_error(token_programs, bad):
    _, progs = token_programs
    ids = np.array([[3, 0, 1, 7, 7, 1], [5, 9, 2, bad, 4, 6]], dtype=np.int64)
    for prog in progs.values():
        with pytest.raises((ExecutionError, InputError), match=r"out of range|outside"):
            prog.run(ids)


class ReshapedIds(nn.Module):
    """Token ids reshaped before the lookup (they stay plain integers) and rows picked by a second
    integer input (index_select at run-time indices)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.fc = nn.Linear(8, 4)

    def forward(self, ids, rows):
        e = self.emb(ids.view(-1)).reshape(2, 3, 8)
        return self.fc(torch.index_select(e, 1, rows))


def test_reshaped_ids_and_run_time_index_select():
    torch.manual_seed(SEED)
    model = ReshapedIds().eval()
    calibration = [(torch.tensor([[1, 3, 9], [0, 2, 5]]), torch.tensor([2, 0])),
                   (torch.tensor([[4, 6, 7], [8, 1, 0]]), torch.tensor([1, 1]))]
    progs = _compile_all(model, calibration[0], calibration)
    graph = progs["reference"].source
    assert not [op for op in graph.ops if op.kind == "aten"]
    gathers = [op for op in graph.ops if op.kind == "gather"]
    assert len(gathers) == 2 and all(op.result.dtype is DType.INT8 for op in gathers)
    _check_exact(progs, (np.array([[9, 0, 4], [2, 2, 7]]), np.array([1, 2])))
    for prog in progs.values():
        with pytest.raises(ExecutionError, match="index 3 is out of range for axis 1 of size 3"):
            prog.run(np.array([[9, 0, 4], [2, 2, 7]]), np.array([3, 0]))


def test_gather_with_indices_outside_their_declared_range_never_reaches_tosa():
    """A graph (e.g. from a hostile program file) whose constant indices break their declared range:
    TOSA lowering refuses it (the TOSA reference model would abort), the host kernels raise."""
    b = GraphBuilder()
    x = b.input("x", TensorType((2, 5, 3), DType.INT8, QuantSpec.per_tensor(0.1, 3)))
    lying = b.constant(np.array([4, 7], np.int32), QuantSpec(DType.INT32, (1.0,), (0,), 0, 4))
    graph = b.build([b.op("gather", x, lying, axis=1)])
    with pytest.raises(VerificationError, match="constant indices reach outside the axis of size 5"):
        verify_graph(graph)   # the verifier refuses it for every target; each stage below refuses it too
    codes = np.arange(30, dtype=np.int8).reshape(2, 5, 3)
    with pytest.raises(CompileError, match="GATHER indices must be constants in 0..4"):
        TosaBackend().lower(graph, "tosa-1.0+int")
    with pytest.raises(ExecutionError, match="index 7 is out of range for axis 1 of size 5"):
        run_graph(graph, [codes])
    with pytest.raises(ExecutionError, match="index 7 is out of range for axis 1 of size 5"):
        prepare(graph).run([codes])
