"""Fuzzing the program loader: a damaged or hostile file loads as a valid program or raises
InvalidProgramError, never anything else, and never hangs.

Three layers, from the outside in:
- raw: bytes of the whole file mutated (the envelope: magic, version, length, checksum);
- sealed: bytes of the body mutated and the checksum recomputed, as a forger would
  (the safetensors parser, the JSON parsers, the tensor checks);
- structured: the decoded JSON header mutated node by node (replaced with random JSON,
  deleted, duplicated, swapped) and re-sealed (every field check, type inference,
  verification, cross-references).

A file that loads must be a valid program: its graphs verify, and it saves and
reloads to the same text. Budget: ``QLOWER_FUZZ_EXAMPLES`` examples per layer (200
by default), each under a 2 s deadline.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from datetime import timedelta

import pytest
import safetensors.numpy
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from qlower.errors import InvalidProgramError
from qlower.ir import print_graph, verify_graph
from qlower.program.fileformat import program_from_bytes, program_to_bytes
from qlower.testing.programs import sample_programs

pytestmark = pytest.mark.fuzz

HEAD = struct.Struct("<8sIQ32s")
SEEDS = [program_to_bytes(p) for name, p in sorted(sample_programs().items())]
FUZZ = settings(max_examples=int(os.environ.get("QLOWER_FUZZ_EXAMPLES", "200")), deadline=timedelta(seconds=2),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], print_blob=True)


def _seal(body: bytes) -> bytes:
    return HEAD.pack(b"\x89QLOWER\n", 1, len(body), hashlib.sha256(body).digest()) + body


def _check(data: bytes) -> None:
    """The property: a valid program, or InvalidProgramError (any other exception fails the test)."""
    try:
        prog = program_from_bytes(data)
    except InvalidProgramError as e:
        msg = str(e)
        assert msg.startswith("program: ") and len(msg) > len("program: ")
        where = re.sub(r"\(.*|[^a-z ]", "", msg.removeprefix("program: ").split(":")[0])
        event("refused: " + " ".join(where.split()[:2]))  # where the loader stopped, for the statistics
        return
    event("loaded")
    graphs = [prog.graph, prog.source, *(p.subgraph for p in prog.partitions)]
    for g in graphs:
        verify_graph(g)
    again = program_from_bytes(program_to_bytes(prog))
    assert [print_graph(g, show_types=True) for g in (again.graph, again.source)] == \
           [print_graph(g, show_types=True) for g in (prog.graph, prog.source)]


# -- byte mutations ------------------------------------------------------------------------------

_pos = st.integers(0, 2**32)
_mutation = st.one_of(
    st.tuples(st.just("flip"), _pos, st.integers(0, 7)),
    st.tuples(st.just("set"), _pos, st.integers(0, 255)),
    st.tuples(st.just("insert"), _pos, st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), _pos, st.integers(1, 64)),
    st.tuples(st.just("truncate"), _pos),
    st.tuples(st.just("splice"), st.integers(0, len(SEEDS) - 1), _pos, st.integers(1, 256), _pos),
)


def _mutate(data: bytes, mutations) -> bytes:
    b = bytearray(data)
    for m in mutations:
        at = m[1] % (len(b) + 1) if m[0] != "splice" else m[4] % (len(b) + 1)
        if m[0] == "flip" and at < len(b):
            b[at] ^= 1 << m[2]
        elif m[0] == "set" and at < len(b):
            b[at] = m[2]
        elif m[0] == "insert":
            b[at:at] = m[2]
        elif m[0] == "delete":
            del b[at:at + m[2]]
        elif m[0] == "truncate":
            del b[at:]
        elif m[0] == "splice":
            other = SEEDS[m[1]]
            src = m[2] % len(other)
            b[at:at + m[3]] = other[src:src + m[3]]
    return bytes(b)


@FUZZ
@given(seed=st.integers(0, len(SEEDS) - 1), mutations=st.lists(_mutation, min_size=1, max_size=4))
def test_raw_byte_mutations(seed, mutations):
    _check(_mutate(SEEDS[seed], mutations))


@FUZZ
@given(seed=st.integers(0, len(SEEDS) - 1), mutations=st.lists(_mutation, min_size=1, max_size=4),
       header_bias=st.booleans())
def test_sealed_body_mutations(seed, mutations, header_bias):
    body = SEEDS[seed][HEAD.size:]
    if header_bias:  # aim at the safetensors header and the JSON in it, where the parsing is
        n = int.from_bytes(body[:8], "little") + 8
        mutations = [(m[0], m[1] % n, *m[2:]) if m[0] != "splice" else (*m[:4], m[4] % n) for m in mutations]
    _check(_seal(_mutate(body, mutations)))


# -- structured header mutations -------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.sampled_from(["int8", "int32", "float32", "t0", "t1", "per_row", "conv2d", "delegate", "p0", "x", ""]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["tuple", "float", "tensor", "quant", "dtype", "type", "name", "shape", "kind"]), inner,
        max_size=3),
    max_leaves=12,
)


def _nodes(tree, path=()):
    """Every (path, node) of a JSON tree, parents before children."""
    yield path, tree
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _nodes(v, (*path, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _nodes(v, (*path, i))


def _parent(tree, path):
    for key in path[:-1]:
        tree = tree[key]
    return tree


def _edit_header(header, action, pick, other, value):
    nodes = [p for p, _ in _nodes(header) if p]
    path = nodes[pick % len(nodes)]
    parent, key = _parent(header, path), path[-1]
    if action == "replace":
        parent[key] = value
    elif action == "delete":
        del parent[key]
    elif action == "duplicate" and isinstance(parent, list):
        parent.insert(key, json.loads(json.dumps(parent[key])))
    elif action == "swap":
        path2 = nodes[other % len(nodes)]
        if path2[:len(path)] != path and path[:len(path2)] != path2:  # neither inside the other
            parent2 = _parent(header, path2)
            parent[key], parent2[path2[-1]] = parent2[path2[-1]], parent[key]


@FUZZ
@given(seed=st.integers(0, len(SEEDS) - 1),
       edits=st.lists(st.tuples(st.sampled_from(["replace", "delete", "duplicate", "swap"]), _pos, _pos, _json),
                      min_size=1, max_size=3))
def test_structured_header_mutations(seed, edits):
    body = SEEDS[seed][HEAD.size:]
    n = int.from_bytes(body[:8], "little")
    header = json.loads(json.loads(body[8:8 + n])["__metadata__"]["qlower"])
    for edit in edits:
        _edit_header(header, *edit)
    arrays = safetensors.numpy.load(body)
    _check(_seal(safetensors.numpy.save(arrays, metadata={"qlower": json.dumps(header)})))
