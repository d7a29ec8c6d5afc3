"""LiteRT interpreters are cached by the model's content (SHA-256) and settings, in a bounded,
thread-safe cache: two models with the same ``hash()`` never share an interpreter (issue 26)."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch
from torch import nn

import qlower
from qlower.backends.litert import backend
from qlower.backends.litert.backend import MODEL_BLOB, LiteRtBackend


class SameHash(bytes):
    """Bytes whose ``hash()`` is the same for every content: what a collision looks like."""

    def __hash__(self) -> int:
        return 7


def _payload(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = (torch.randn(1, 3, 8, 8),)
    prog = qlower.compile(model, x, target="litert", progress=False)
    assert len(prog.partitions) == 1
    return prog.partitions[0].payload


def _inputs(payload, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for t in payload.input_types:
        if t.dtype.numpy.kind == "f":
            out.append(rng.standard_normal(t.shape).astype(t.dtype.numpy))
        else:
            info = np.iinfo(t.dtype.numpy)
            out.append(rng.integers(info.min, info.max, t.shape, endpoint=True).astype(t.dtype.numpy))
    return out


@pytest.fixture(scope="module")
def payloads():
    return _payload(0), _payload(1)


def test_models_with_equal_hash_do_not_share_an_interpreter(payloads):
    a, b = payloads
    x = _inputs(a, 0)
    want = [LiteRtBackend().execute(p, x) for p in (a, b)]
    assert any(not np.array_equal(u, v) for u, v in zip(*want)), "the two models must compute different things"
    collide = [dataclasses.replace(p, blobs={MODEL_BLOB: SameHash(p.blobs[MODEL_BLOB])}) for p in (a, b)]
    assert hash(collide[0].blobs[MODEL_BLOB]) == hash(collide[1].blobs[MODEL_BLOB])
    assert len(a.blobs[MODEL_BLOB]) == len(b.blobs[MODEL_BLOB])   # length alone can't tell them apart either
    backend._interpreters.clear()
    for p, w in zip(collide, want):
        for got, expected in zip(LiteRtBackend().execute(p, x), w):
            np.testing.assert_array_equal(got, expected)


def test_the_cache_is_bounded(payloads, monkeypatch):
    monkeypatch.setattr(backend, "_CACHE_SIZE", 3)
    backend._interpreters.clear()
    backend._digests.clear()
    a, b = payloads
    x = _inputs(a, 0)
    for threads in range(1, 6):
        for p in (a, b):
            LiteRtBackend().execute(dataclasses.replace(p, meta={**p.meta, "threads": threads}), x)
            assert len(backend._interpreters) <= 3 and len(backend._digests) <= 3
    assert len(backend._interpreters) == 3


def test_concurrent_runs_get_their_own_answers(payloads):
    backend._interpreters.clear()
    a, b = payloads
    jobs = [(p, _inputs(a, seed)) for seed in range(8) for p in (a, b)]
    want = [LiteRtBackend().execute(p, x) for p, x in jobs]
    backend._interpreters.clear()
    got: list = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def work(i: int) -> None:
        start.wait()
        got[i] = LiteRtBackend().execute(*jobs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, w in zip(got, want):
        for u, v in zip(g, w):
            np.testing.assert_array_equal(u, v)
