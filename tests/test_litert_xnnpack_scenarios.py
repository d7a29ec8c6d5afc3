"""The op catalogue (qlower/testing/op_catalog.py) on ``litert`` with LiteRT's XNNPACK delegate at 1 and 2 threads.

Per case: quantized and imported once, lowered once for ``litert`` with ``kernels="xnnpack"`` (the program
takes XNNPACK's roundings and forms before partitioning), then run by the stock interpreter at 1 and at 2
threads (``with_threads``: the same payloads); each run is bit-exact with the reference interpreter on the
program's form (``program.source``; each rewrite's bound against the canonical graph is checked by
tests/test_rewrite_declarations.py). Ops LiteRT can't take stay on the host, as on every target.
Every zoo model and scenario runs the same way in tests/test_litert_zoo.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from qlower.api import lower_graph
from qlower.backends.litert.backend import with_threads
from qlower.reference import run_graph
from qlower.testing import op_catalog
from qlower.testing.coverage import prepare

CASES = [pytest.param(c.key, id=c.key) for c in op_catalog.CASES]


@pytest.mark.parametrize("key", CASES)
def test_catalogue_case_is_bit_exact_under_xnnpack_at_1_and_2_threads(key: str) -> None:
    prep = prepare(op_catalog.get(key))
    prog = lower_graph(prep.graph, "litert", backend_options={"kernels": "xnnpack"})
    inputs = [x.numpy() for x in prep.inputs]
    want = run_graph(prog.source, inputs)
    for threads in (1, 2):
        got = with_threads(prog, threads).run(*inputs)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            g = np.asarray(g)
            assert g.dtype == w.dtype and g.shape == w.shape, (threads, i)
            np.testing.assert_array_equal(g, w, err_msg=f"{key}: output {i}, {threads} thread(s)")
