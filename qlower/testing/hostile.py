"""Forged program files, as an attacker writes them: for the hardening tests and
``benchmarks/hostile_inputs.py``.

Each forgery is a function returning the program file's bytes and the inputs to run it
with. The graphs are built with GraphBuilder and saved with ``program_to_bytes`` (whose
own checks see only the IR, not what a stored ATen call would do), or the saved header
is edited and sealed again with a fresh checksum (the checksum guards against accidents,
not against a forger). Loading, then running, each must end in a QlowerError: never a
crash, a hang or a result.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.program.fileformat import program_to_bytes
from qlower.program.program import Program
from qlower.reference.aten_fallback import Operand, encode_call

INT32 = DType.INT32
PLAIN32 = QuantSpec.plain_integer(INT32)
F32 = DType.FLOAT32
_HEAD = struct.Struct("<8sIQ32s")

Forgery = Callable[[], tuple[bytes, list[np.ndarray]]]


def plain_int(shape: tuple[int, ...]) -> TensorType:
    return TensorType(shape, INT32, PLAIN32)


def floats(shape: tuple[int, ...]) -> TensorType:
    return TensorType(shape, F32)


def aten_program(inputs: list[TensorType], calls: list[tuple[str, list, dict, tuple[str, ...],
                                                             tuple[TensorType, ...], tuple[str, ...]]],
                 target: str = "reference", meta: dict | None = None) -> bytes:
    """A host program of float-fallback calls, written without the loader's checks. ``calls``:
    (target, args, kwargs, in_dtypes, out_types, out_dtypes) where an ``Operand(i)`` or a
    ``("value", k)`` in args names graph input i / the k-th result of the calls so far."""
    b = GraphBuilder("forged")
    values = [b.input(f"x{i}", t) for i, t in enumerate(inputs)]
    made: list[Any] = []
    last = None
    for j, (name, args, kwargs, in_dtypes, out_types, out_dtypes) in enumerate(calls):
        operands: list[Any] = []

        def mark(a, operands=operands):
            if isinstance(a, Operand):
                operands.append(values[a.index])
                return Operand(len(operands) - 1)
            if isinstance(a, tuple) and len(a) == 2 and a[0] == "value":
                operands.append(made[a[1]])
                return Operand(len(operands) - 1)
            if isinstance(a, list):
                return [mark(e, operands) for e in a]
            return a
        args2 = [mark(a) for a in args]
        kwargs2 = {k: mark(v) for k, v in kwargs.items()}
        res = b.op("aten", tuple(operands), target=name, args=encode_call(args2, kwargs2), in_dtypes=in_dtypes,
                   out_types=out_types, out_dtypes=out_dtypes, name=f"call{j}")
        res = res if isinstance(res, tuple) else (res,)
        made.extend(res)
        last = res[0]
    graph = verify_graph(b.build([last]))
    return program_to_bytes(Program(target, graph, graph, meta=dict(meta or {})))


def seal(body: bytes) -> bytes:
    """A program file around ``body`` with a correct checksum."""
    return _HEAD.pack(b"\x89QLOWER\n", 1, len(body), hashlib.sha256(body).digest()) + body


def edit_header(data: bytes, change: Callable[[dict], None],
                change_arrays: Callable[[dict, dict], None] | None = None) -> bytes:
    """The file with its program header changed by ``change`` (and its tensors by
    ``change_arrays(header, arrays)``), sealed again."""
    body = data[_HEAD.size:]
    n = int.from_bytes(body[:8], "little")
    header = json.loads(json.loads(body[8:8 + n])["__metadata__"]["qlower"])
    change(header)
    arrays = {name: np.frombuffer(info["data"], dtype=_NP[info["dtype"]]).reshape(info["shape"]).copy()
              for name, info in safetensors.deserialize(body)}
    if change_arrays is not None:
        change_arrays(header, arrays)
    return seal(safetensors.numpy.save(arrays, metadata={"qlower": json.dumps(header)}))


def graphs_of(header: dict) -> list[dict]:
    """Every encoded graph of a program header: host, source, partition subgraphs."""
    out = [header["host"]] + ([header["source"]] if header["source"] else [])
    return out + [p["subgraph"] for p in header["partitions"]]


def ops_of(header: dict, kind: str) -> list[dict]:
    return [op for g in graphs_of(header) for op in g["ops"] if op["kind"] == kind]


def edit_raw_header(data: bytes, change: Callable[[str], str]) -> bytes:
    """The file with its program header's JSON text changed by ``change`` (e.g. a duplicate key)."""
    body = data[_HEAD.size:]
    n = int.from_bytes(body[:8], "little")
    text = json.loads(body[8:8 + n])["__metadata__"]["qlower"]
    arrays = {name: np.frombuffer(info["data"], dtype=_NP[info["dtype"]]).reshape(info["shape"])
              for name, info in safetensors.deserialize(body)}
    return seal(safetensors.numpy.save(arrays, metadata={"qlower": change(text)}))


_NP = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64,
       "F32": np.float32, "F64": np.float64}


# -- the forgeries ---------------------------------------------------------------------------

def pool_backward() -> tuple[bytes, list[np.ndarray]]:
    """max_pool2d_with_indices_backward with indices of 1e9 made by an aten.full (SIGSEGV in ATen)."""
    idx_t = plain_int((1, 1, 2, 2))
    data = aten_program([floats((1, 1, 2, 2)), floats((1, 1, 4, 4))], [
        ("aten.full.default", [[1, 1, 2, 2], 10**9], {"dtype": _dtype("int64")}, (), (idx_t,), ("int64",)),
        ("aten.max_pool2d_with_indices_backward.default",
         [Operand(0), Operand(1), [2, 2], [2, 2], [0, 0], [1, 1], False, ("value", 0)], {},
         ("float32", "float32", "int64"), (floats((1, 1, 4, 4)),), ("float32",)),
    ])
    return data, [np.ones((1, 1, 2, 2), np.float32), np.ones((1, 1, 4, 4), np.float32)]


def embedding_backward() -> tuple[bytes, list[np.ndarray]]:
    """embedding_dense_backward(scale_grad_by_freq=True) with an out-of-range index from the input (SIGSEGV)."""
    data = aten_program([floats((3, 4)), plain_int((3,))], [
        ("aten.embedding_dense_backward.default", [Operand(0), Operand(1), 10, -1, True], {},
         ("float32", "int64"), (floats((10, 4)),), ("float32",)),
    ])
    return data, [np.ones((3, 4), np.float32), np.array([0, 10**9, 2], np.int32)]


def int_min_div() -> tuple[bytes, list[np.ndarray]]:
    """div.Scalar_mode of int32 INT32_MIN by -1, rounding "trunc" (SIGFPE)."""
    data = aten_program([plain_int((2,))], [
        ("aten.div.Scalar_mode", [Operand(0), -1], {"rounding_mode": "trunc"}, ("int32",), (plain_int((2,)),),
         ("int32",)),
    ])
    return data, [np.array([5, -2**31], np.int32)]


def _dtype(name: str):
    import torch

    return getattr(torch, name)


def _one_call(target: str, args: list, kwargs: dict, inputs: list[TensorType], in_dtypes: tuple[str, ...],
              out: TensorType, out_dtype: str, values: list[np.ndarray]) -> Forgery:
    def forge() -> tuple[bytes, list[np.ndarray]]:
        return aten_program(inputs, [(target, args, kwargs, in_dtypes, (out,), (out_dtype,))]), values
    return forge


# forged fallbacks: (name, forgery, when it must be refused: "load" or "run")
FALLBACKS: list[tuple[str, Forgery, str]] = [
    ("max_pool2d_with_indices_backward, indices 1e9", pool_backward, "load"),
    ("embedding_dense_backward, index 1e9", embedding_backward, "load"),
    ("div.Scalar_mode INT32_MIN / -1 trunc", int_min_div, "run"),
    ("empty_strided (uninitialised memory)", _one_call(
        "aten.empty_strided.default", [[4, 4], [4, 1]], {}, [floats((1,))], (), floats((4, 4)), "float32",
        [np.zeros(1, np.float32)]), "load"),
    ("empty.memory_format", _one_call(
        "aten.empty.memory_format", [[4, 4]], {}, [floats((1,))], (), floats((4, 4)), "float32",
        [np.zeros(1, np.float32)]), "load"),
    ("as_strided past the storage", _one_call(
        "aten.as_strided.default", [Operand(0), [64], [1]], {}, [floats((4,))], ("float32",), floats((64,)),
        "float32", [np.zeros(4, np.float32)]), "load"),
    ("avg_pool2d_backward", _one_call(
        "aten.avg_pool2d_backward.default", [Operand(0), Operand(1), [2, 2], [2, 2], [0, 0], False, True, None],
        {}, [floats((1, 1, 2, 2)), floats((1, 1, 4, 4))], ("float32", "float32"), floats((1, 1, 4, 4)),
        "float32", [np.ones((1, 1, 2, 2), np.float32), np.ones((1, 1, 4, 4), np.float32)]), "load"),
    ("gather, index 1e9 from the input", _one_call(
        "aten.gather.default", [Operand(0), 0, Operand(1)], {}, [floats((3,)), plain_int((2,))],
        ("float32", "int64"), floats((2,)), "float32", [np.zeros(3, np.float32), np.array([0, 10**9], np.int32)]),
     "run"),
    ("index_select, index -1", _one_call(
        "aten.index_select.default", [Operand(0), 0, Operand(1)], {}, [floats((3,)), plain_int((1,))],
        ("float32", "int64"), floats((1,)), "float32", [np.zeros(3, np.float32), np.array([-1], np.int32)]), "run"),
    ("embedding, index 1e9", _one_call(
        "aten.embedding.default", [Operand(0), Operand(1)], {}, [floats((3, 2)), plain_int((1,))],
        ("float32", "int64"), floats((1, 2)), "float32", [np.zeros((3, 2), np.float32), np.array([10**9], np.int32)]),
     "run"),
    ("index.Tensor, index -4 of 3", _one_call(
        "aten.index.Tensor", [Operand(0), [Operand(1)]], {}, [floats((3,)), plain_int((1,))],
        ("float32", "int64"), floats((1,)), "float32", [np.zeros(3, np.float32), np.array([-4], np.int32)]), "run"),
    ("scatter.value, index 1e9", _one_call(
        "aten.scatter.value", [Operand(0), 0, Operand(1), 1.0], {}, [floats((3,)), plain_int((1,))],
        ("float32", "int64"), floats((3,)), "float32", [np.zeros(3, np.float32), np.array([10**9], np.int32)]),
     "run"),
    ("remainder.Tensor by zero", _one_call(
        "aten.remainder.Tensor", [Operand(0), Operand(1)], {}, [plain_int((1,)), plain_int((1,))],
        ("int32", "int32"), plain_int((1,)), "int32", [np.array([7], np.int32), np.array([0], np.int32)]), "run"),
    ("fmod.Scalar INT32_MIN by -1", _one_call(
        "aten.fmod.Scalar", [Operand(0), -1], {}, [plain_int((1,))], ("int32",), plain_int((1,)), "int32",
        [np.array([-2**31], np.int32)]), "run"),
    ("div.Tensor_mode floor INT32_MIN by -1", _one_call(
        "aten.div.Tensor_mode", [Operand(0), Operand(1)], {"rounding_mode": "floor"},
        [plain_int((1,)), plain_int((1,))], ("int32", "int32"), plain_int((1,)), "int32",
        [np.array([-2**31], np.int32), np.array([-1], np.int32)]), "run"),
    ("duplicate key in a fallback's arguments", lambda: (edit_raw_header(
        _one_call("aten.relu.default", [Operand(0)], {}, [floats((2,))], ("float32",), floats((2,)), "float32",
                  [])()[0],
        lambda text: text.replace('\\"kwargs\\":{}', '\\"kwargs\\":{},\\"kwargs\\":{}', 1)),
        [np.zeros(2, np.float32)]), "load"),
]


# -- resource limits -----------------------------------------------------------------------------

def huge_matmuls(n: int = 8192, count: int = 240) -> tuple[bytes, list[np.ndarray]]:
    """``count`` chained n x n x n aten.mm (240 x 8192^3: an hour of work from a small file)."""
    t = floats((n, n))
    calls = [("aten.mm.default", [Operand(0) if i == 0 else ("value", i - 1), Operand(0)], {},
              ("float32", "float32"), (t,), ("float32",)) for i in range(count)]
    return aten_program([floats((n, n))], calls), []


def many_fulls(gib_each: float = 1.0, count: int = 6) -> tuple[bytes, list[np.ndarray]]:
    """``count`` aten.full of ``gib_each`` GiB, added up (5 GB of peak memory from 2 KB)."""
    n = int(gib_each * 2**30 / 4)
    t = floats((n,))
    calls: list = []
    for _ in range(count):
        calls.append(("aten.full.default", [[n], 1.0], {"dtype": _dtype("float32")}, (), (t,), ("float32",)))
    acc = 0
    for i in range(1, count):
        calls.append(("aten.add.Tensor", [("value", acc), ("value", i)], {}, ("float32", "float32"), (t,),
                      ("float32",)))
        acc = len(calls) - 1
    return aten_program([floats((1,))], calls), [np.zeros(1, np.float32)]


def program_threads(threads: int) -> tuple[bytes, list[np.ndarray]]:
    data, values = _one_call("aten.relu.default", [Operand(0)], {}, [floats((2,))], ("float32",), floats((2,)),
                             "float32", [np.zeros(2, np.float32)])()
    return edit_header(data, lambda h: h["meta"].__setitem__("threads", threads)), values


# -- subgraphs that type inference accepts and the reference can't run --------------------------

def small_int8_graph():
    """conv2d (constant weight and bias) -> rescale -> clamp: what the verifier forgeries edit."""
    b = GraphBuilder("small")
    q = QuantSpec.per_tensor(0.05, 0)
    x = b.input("x", TensorType((1, 6, 6, 2), DType.INT8, q))
    wq = QuantSpec.per_tensor(0.02, 0, qmin=-127, qmax=127)
    rng = np.random.default_rng(30)
    # a 1x2 kernel: a dilation along H changes nothing in the types (what a forger edits unnoticed)
    w = b.constant(rng.integers(-127, 128, (3, 1, 2, 2)).astype(np.int8), wq, name="w")
    bias = b.constant(rng.integers(-500, 500, 3).astype(np.int32), QuantSpec.accumulator(q, wq, None), name="bias")
    c = b.op("conv2d", x, w, bias, name="conv")
    r = b.op("rescale", c, out=QuantSpec.per_tensor(0.1, 0), name="rq")
    cl = b.op("clamp", r, min=0, max=127, name="relu")
    return verify_graph(b.build([cl]))


def _bias_at_int32_max(header: dict, arrays: dict) -> None:
    for op in ops_of(header, "constant"):
        if op["results"][0]["name"] == "bias":
            key = op["attrs"]["data"]["tensor"]
            arrays[key] = np.full_like(arrays[key], 2**31 - 1)


def _set_clamp_max(header: dict) -> None:
    for op in ops_of(header, "clamp"):
        op["attrs"]["max"] = 1000


def _negative_dilation(header: dict) -> None:
    for op in ops_of(header, "conv2d"):
        op["attrs"]["dilation"] = {"tuple": [-1, 1]}


def verifier_forgery(target: str, what: str) -> bytes:
    """``small_int8_graph`` compiled for ``target`` and saved, then edited: ``what`` is "bias"
    (INT32_MAX), "clamp" (an int8 clamp to 1000) or "dilation" (negative)."""
    from qlower.api import lower_graph

    data = program_to_bytes(lower_graph(small_int8_graph(), target))
    if what == "bias":
        return edit_header(data, lambda h: None, _bias_at_int32_max)
    return edit_header(data, _set_clamp_max if what == "clamp" else _negative_dilation)


def payload_threads(target: str, threads: object) -> bytes:
    """``small_int8_graph`` compiled for ``target``, every payload's meta threads set to ``threads``."""
    from qlower.api import lower_graph

    def change(h: dict) -> None:
        for p in h["partitions"]:
            p["payload"]["meta"]["threads"] = threads
    return edit_header(program_to_bytes(lower_graph(small_int8_graph(), target)), change)
