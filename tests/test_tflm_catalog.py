"""The op catalogue (qlower/testing/op_catalog.py) on the ``tflm`` target.

Per case: the compile neither crashes nor refuses it; running the program (its
partitions on tflite-micro's interpreter, the rest on the host) is bit-exact
with the reference interpreter on the program's form (``program.source``:
the graph after the target's declared rewrites, TFLM's kernels' rounding;
each rewrite's bound against the canonical graph is checked by
tests/test_rewrite_declarations.py); and every op of the case left on the
host is named in ``program.decisions`` with a non-empty reason.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from qlower.reference import run_graph
from qlower.testing import op_catalog
from qlower.testing.coverage import HOST_FLOAT, HOST_INTEGER, INTEGER_ON_TARGET, Prepared, classify, prepare

CASES = [pytest.param(c.key, id=c.key) for c in op_catalog.CASES]


@functools.cache
def _prepared(key: str) -> Prepared:
    return prepare(op_catalog.get(key))


def _differences(got, want) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} outputs, the reference has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: {g.dtype}{list(g.shape)} vs the reference's {w.dtype}{list(w.shape)}"
        if not np.array_equal(g, w, equal_nan=g.dtype.kind == "f"):
            return f"output {i}: {int((g != w).sum())} of {g.size} elements differ"
    return None


@pytest.mark.parametrize("key", CASES)
def test_catalogue_case_is_bit_exact_on_tflm_its_host_ops_named(key: str) -> None:
    case, prep = op_catalog.get(key), _prepared(key)
    prog = prep.lower("tflm")
    got = prog.run(*prep.inputs)
    want = run_graph(prog.source, [x.numpy() for x in prep.inputs])
    bad = _differences(got, want)
    assert bad is None, f"{key} on tflm: not bit-exact with the reference on its form: {bad}"
    place = classify(prog, case)
    assert place.cls in (INTEGER_ON_TARGET, HOST_INTEGER, HOST_FLOAT), place.describe()
    assert not place.unnamed, f"{key}: host ops not named in prog.decisions: {place.describe()}"
    assert all(getattr(d, "reason", "x") for d in place.host), f"{key}: a host op without a reason: {place.describe()}"
