"""Coverage sweep: every op of the catalogue (qlower/testing/op_catalog.py) on every target.

Each case is quantized (static int8, the default QuantConfig), imported and
optimised once, then lowered with ``lower_graph`` for each target. Per target:
- the compile neither crashes nor refuses the case;
- the target's outputs are bit-exact with the reference interpreter running the
  program's source graph (``Program.run`` never runs the reference interpreter:
  host ops run on the CPU kernels, partitions on their backend);
- the op is integer on the target, or each of its ops left on the host is named
  in ``prog.decisions`` with a reason (reference and cpu: integer, or float
  fallbacks named in the decisions).
Ethos-U targets (Vela) are marked slow; they run in CI like the rest.

A case failing here is a compiler finding (a refusal, a mismatch or an
unexplained host op), not a test to silence.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch.utils import _pytree as pytree

from qlower.reference import run_graph
from qlower.testing import op_catalog
from qlower.testing.coverage import HOST_FLOAT, HOST_INTEGER, INTEGER_ON_TARGET, REFUSED, Prepared, classify, prepare
from qlower.testing.op_catalog import Fn, OpCase

FAST_TARGETS = ("reference", "cpu", "tosa-1.0+int")
ETHOS_TARGETS = ("ethos-u85-256", "ethos-u55-128")
CASES = [pytest.param(c.key, id=c.key) for c in op_catalog.CASES]
# ops that stay float fallbacks (no integer rule is planned): the fallback test has cases even once every
# catalogue op is integer; a tuple result with int64 indices, an int64 graph input, a binary float op
FALLBACK_ONLY = [OpCase("fallback", "topk", lambda: Fn(lambda x: torch.topk(x, 2, dim=3)), ((1, 4, 4, 4),), ("act",)),
                 OpCase("fallback", "cumsum_int", lambda: Fn(lambda i: torch.cumsum(i, 1)), ((1, 8),), ("int",)),
                 OpCase("fallback", "atan2", lambda: Fn(torch.atan2), ((1, 4, 4, 4),) * 2, ("act", "act"))]
_BY_KEY = {c.key: c for c in (*op_catalog.CASES, *FALLBACK_ONLY)}


@functools.cache
def _prepared(key: str) -> Prepared | Exception:
    try:
        return prepare(_BY_KEY[key])
    except Exception as e:  # noqa: BLE001  (a refusal is reported per target by the test)
        return e


@functools.cache
def _reference_outputs(key: str) -> list[np.ndarray]:
    prep = _prepared(key)
    return run_graph(prep.graph, [x.numpy() for x in prep.inputs])


def _mismatch(got: list[np.ndarray], want: list[np.ndarray]) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} outputs, the reference has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: {g.dtype}{list(g.shape)} vs the reference's {w.dtype}{list(w.shape)}"
        if not np.array_equal(g, w, equal_nan=g.dtype.kind == "f"):
            diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
            return (f"output {i}: {int((diff != 0).sum())} of {g.size} elements differ "
                    f"(max |diff| {np.nanmax(diff):.6g})")
    return None


def _sweep(key: str, targets: tuple[str, ...]) -> None:
    case = op_catalog.get(key)
    prep = _prepared(key)
    if isinstance(prep, Exception):
        pytest.fail(f"{key}: {classify(prep, case).describe()} (for every target: the frontend refused it)")
    want = _reference_outputs(key)
    problems = []
    for target in targets:
        try:
            prog = prep.lower(target)
        except Exception as e:  # noqa: BLE001  (collected, so one message shows every target)
            problems.append(f"{target}: {classify(e, case).describe()}")
            continue
        try:
            got = prog.run(*prep.inputs)
        except Exception as e:  # noqa: BLE001
            problems.append(f"{target}: compiled, but running it raised {type(e).__name__}: {e}")
            continue
        place = classify(prog, case)
        assert place.cls != REFUSED
        bad = _mismatch(got, want)
        if bad:
            problems.append(f"{target}: not bit-exact with the reference interpreter: {bad}")
        if place.cls in (HOST_FLOAT, HOST_INTEGER):
            for op in place.unnamed:
                problems.append(f"{target}: {place.cls}: host op {op.kind} %{op.results[0].name} is not named "
                                f"in prog.decisions ({place.describe()})")
            for d in place.host:
                if not getattr(d, "reason", "x"):
                    problems.append(f"{target}: host op %{d.op.results[0].name} has an empty reason")
        else:
            assert place.cls == INTEGER_ON_TARGET
    assert not problems, f"{key}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("key", CASES)
def test_sweep_host_and_tosa(key: str) -> None:
    _sweep(key, FAST_TARGETS)


@pytest.mark.slow
@pytest.mark.parametrize("key", CASES)
def test_sweep_ethos_u(key: str) -> None:
    _sweep(key, ETHOS_TARGETS)


# -- the classifier itself, on programs whose placement is known -------------------------------------------------
def test_classifier_tells_the_classes_apart() -> None:
    """conv2d is integer everywhere; the float fallback of a case is host float on every target;
    an exception is a refusal."""
    conv = op_catalog.get("linalg/conv2d_dilated_grouped")
    prep = _prepared(conv.key)
    assert not isinstance(prep, Exception), prep
    for target in ("reference", "tosa-1.0+int"):
        place = classify(prep.lower(target), conv)
        assert place.cls == INTEGER_ON_TARGET and "conv2d" in place.kinds, place.describe()
    fallback = _fallback_cases()[0]
    prep = _prepared(fallback.key)
    tosa = classify(prep.lower("tosa-1.0+int"), fallback)
    assert tosa.cls == HOST_FLOAT and not tosa.unnamed and "aten" in tosa.kinds, tosa.describe()
    assert classify(ValueError("no"), conv).cls == REFUSED


# -- the float fallback: the reference's result of an aten op is eager PyTorch's ----------------------------------
FALLBACK_CANDIDATES = (*(c.key for c in FALLBACK_ONLY), "reduction/cumsum", "normalisation/layer_norm",
                       "linalg/addmm", "resampling/bilinear_align_corners")


def _fallback_cases():
    """Catalogue cases whose program still has a float fallback (``aten``) op."""
    out = []
    for key in FALLBACK_CANDIDATES:
        prep = _prepared(key)
        if not isinstance(prep, Exception) and any(op.kind == "aten" for op in prep.graph.ops):
            out.append(_BY_KEY[key])
    return out


def _torch_arg(array: np.ndarray, val) -> torch.Tensor:
    """An IR array as the tensor the fx node received (its recorded dtype; PT2E dequantize nodes: float32)."""
    t = torch.from_numpy(np.array(array))  # a writable copy
    return t.to(val.dtype) if isinstance(val, torch.Tensor) else t.to(torch.float32)


def test_fallback_reference_equals_eager_pytorch() -> None:
    cases = _fallback_cases()
    assert cases, f"none of {FALLBACK_CANDIDATES} has a float fallback any more: pick other cases"
    checked = 0
    for case in cases:
        prep = _prepared(case.key)
        _, env = run_graph(prep.graph, [x.numpy() for x in prep.inputs], keep_all=True)
        nodes = {n.name: n for n in prep.frontend.fake_quant.graph.nodes}
        for op in prep.graph.ops:
            if op.kind != "aten":
                continue
            node = nodes[op.origin.node]
            assert str(node.target) == op.attrs["target"], (node.target, op.attrs["target"])
            # the fx node's own arguments, its tensor arguments replaced (in order) by the IR's arrays
            operands = iter(op.input_values())
            flat, spec = pytree.tree_flatten((node.args, node.kwargs))
            flat = [_torch_arg(env[next(operands)], a.meta.get("val")) if isinstance(a, torch.fx.Node) else a
                    for a in flat]
            args, kwargs = pytree.tree_unflatten(flat, spec)
            with torch.no_grad():
                expected = node.target(*args, **kwargs)
            expected = expected if isinstance(expected, (tuple, list)) else (expected,)
            assert len(expected) == len(op.results)
            for r, e in zip(op.results, expected):
                got, e = env[r], e.numpy()
                assert got.shape == e.shape, (case.key, op.attrs["target"])
                if e.dtype.kind in "iu":  # integer results cross the IR as plain int32
                    assert got.dtype.kind == "i" and np.array_equal(got.astype(np.int64), e.astype(np.int64))
                else:
                    assert got.dtype == e.dtype and np.array_equal(got, e, equal_nan=True), (case.key, r.name)
                checked += 1
    assert checked >= 4, checked  # topk's two results, cumsum_int, atan2 at least
