"""IR graphs <-> JSON-able dicts plus a table of NumPy arrays: the program file's inner layer.

Encoding is exact: value names, TensorTypes (QuantSpec floats as JSON numbers,
which Python writes with ``repr`` and reads back bit for bit), origins, op kinds,
operand structure (``null`` for an absent optional operand, a list for a variadic
one) and every attribute kind the op registry uses. Arrays (constant data, table
attributes) go to the tensor table by key; an array object shared by several ops
or graphs is stored once and shared again after loading.

Values are referenced by their position in definition order (graph inputs,
then each op's results), never by name: names are for people and need not be
unique.

Decoding trusts nothing. Every field is type-checked; a value reference must
point at a value defined before it; attribute types are checked against
``ATTR_CHECKS``; each op's result types are re-inferred from the op registry
(what ``GraphBuilder`` does: ``normalize_attrs`` then ``infer_types``) and must
equal the stored ones; the rebuilt graph must pass ``qlower.ir.verify_graph``. The op
is constructed directly rather than through ``GraphBuilder.op`` only because the
builder's ``fresh_name`` may rename a value, and names must round-trip exactly.
Any problem is an InvalidProgramError that says where it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from qlower.errors import InvalidProgramError, IRError, VerificationError
from qlower.ir import OPS, DType, Graph, Op, Origin, QuantSpec, TensorType, Value, verify_graph
from qlower.ir.opdefs import infer_types, normalize_attrs
from qlower.program.jsonchecks import (
    INT64_MAX,
    INT64_MIN,
    as_float,
    as_int,
    as_list,
    as_obj,
    as_str,
    enc_float,
    fail,
    json_kind,
)
from qlower.reference.aten_fallback import check_call

MAX_DIM = 2**31 - 1
MAX_ATTR_DEPTH = 8


# -- tensor table ------------------------------------------------------------------------

class TensorWriter:
    """Collects arrays for the tensor table; one key per distinct array object."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self._keys: dict[int, str] = {}
        self._keep: list[object] = []  # keeps ids stable while saving

    def add(self, array: np.ndarray | bytes) -> str:
        key = self._keys.get(id(array))
        if key is None:
            # (ascontiguousarray alone would turn a 0-d array into a 1-d one)
            data = np.frombuffer(array, np.uint8) if isinstance(array, bytes) else \
                np.ascontiguousarray(array).reshape(np.shape(array))
            key = f"t{len(self.arrays)}"
            self.arrays[key] = data
            self._keys[id(array)] = key
            self._keep.append(array)
        return key

    def index(self) -> dict[str, dict]:
        return {k: {"dtype": a.dtype.name, "shape": list(a.shape)} for k, a in self.arrays.items()}


class TensorReader:
    """The loaded tensor table; remembers which keys the header used."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.used: set[str] = set()

    def get(self, key: Any, where: str) -> np.ndarray:
        key = as_str(key, where)
        if key not in self.arrays:
            raise fail(where, f"refers to tensor '{key[:40]}', which the file doesn't contain")
        self.used.add(key)
        return self.arrays[key]


# -- types -------------------------------------------------------------------------------

def dec_dtype(x: Any, where: str) -> DType:
    try:
        return DType(as_str(x, where))
    except ValueError:
        raise fail(where, f"unknown dtype {x[:40]!r}; known: {[d.value for d in DType]}") from None


def enc_quant(q: QuantSpec) -> dict:
    return {"dtype": q.dtype.value, "scale": [enc_float(s) for s in q.scale], "zero_point": list(q.zero_point),
            "qmin": q.qmin, "qmax": q.qmax, "axis": q.axis, "dynamic": q.dynamic}


def dec_quant(x: Any, where: str) -> QuantSpec:
    d = as_obj(x, where, ("dtype", "scale", "zero_point", "qmin", "qmax", "axis", "dynamic"))
    scale = [as_float(s, f"{where} scale") for s in as_list(d["scale"], f"{where} scale")]
    zps = [as_int(z, f"{where} zero_point") for z in as_list(d["zero_point"], f"{where} zero_point")]
    if not scale or len(scale) != len(zps):
        raise fail(where, f"needs as many zero points as scales (at least one), got {len(scale)} and {len(zps)}")
    dynamic = d["dynamic"]
    if dynamic not in (None, "per_tensor", "per_row"):
        raise fail(where, f"dynamic must be null, 'per_tensor' or 'per_row', got {str(dynamic)[:40]!r}")
    axis = None if d["axis"] is None else as_int(d["axis"], f"{where} axis")
    return QuantSpec(dec_dtype(d["dtype"], f"{where} dtype"), tuple(scale), tuple(zps),
                     as_int(d["qmin"], f"{where} qmin"), as_int(d["qmax"], f"{where} qmax"), axis, dynamic)


def enc_type(t: TensorType) -> dict:
    return {"shape": list(t.shape), "dtype": t.dtype.value, "quant": None if t.quant is None else enc_quant(t.quant)}


def dec_type(x: Any, where: str) -> TensorType:
    d = as_obj(x, where, ("shape", "dtype", "quant"))
    shape = tuple(as_int(s, f"{where} shape", 0, MAX_DIM) for s in as_list(d["shape"], f"{where} shape"))
    quant = None if d["quant"] is None else dec_quant(d["quant"], f"{where} quant")
    return TensorType(shape, dec_dtype(d["dtype"], f"{where} dtype"), quant)


def enc_origin(o: Origin | None) -> dict | None:
    if o is None:
        return None
    return {"node": o.node, "module": o.module, "source": o.source,
            "layout": None if o.layout is None else list(o.layout)}


def dec_origin(x: Any, where: str) -> Origin | None:
    if x is None:
        return None
    d = as_obj(x, where, ("node", "module", "source", "layout"))
    layout = None if d["layout"] is None else tuple(as_int(i, f"{where} layout")
                                                    for i in as_list(d["layout"], f"{where} layout"))
    return Origin(as_str(d["node"], f"{where} node"), as_str(d["module"], f"{where} module"),
                  as_str(d["source"], f"{where} source"), layout)


# -- attributes ----------------------------------------------------------------------------

def enc_attr(v: Any, tensors: TensorWriter, where: str) -> Any:
    """Tagged JSON: null, booleans, integers and strings as themselves, the rest as a one-key object."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        if not INT64_MIN <= v <= INT64_MAX:
            raise InvalidProgramError(f"can't save: {where} is {v}, outside the int64 range")
        return int(v)
    if isinstance(v, (float, np.floating)):
        return {"float": enc_float(v)}
    if isinstance(v, DType):
        return {"dtype": v.value}
    if isinstance(v, QuantSpec):
        return {"quant": enc_quant(v)}
    if isinstance(v, TensorType):
        return {"type": enc_type(v)}
    if isinstance(v, np.ndarray):
        return {"tensor": tensors.add(v)}
    if isinstance(v, (tuple, list)):
        return {"tuple" if isinstance(v, tuple) else "list": [enc_attr(e, tensors, where) for e in v]}
    raise InvalidProgramError(f"can't save: {where} holds a {type(v).__name__}, which the program file "
                              "can't represent (attributes are numbers, strings, tuples, arrays, DTypes, "
                              "QuantSpecs or TensorTypes)")


def dec_attr(x: Any, tensors: TensorReader, where: str, depth: int = 0) -> Any:
    if depth > MAX_ATTR_DEPTH:
        raise fail(where, f"nested deeper than {MAX_ATTR_DEPTH} levels")
    if x is None or type(x) in (bool, str):
        return x
    if type(x) is int:
        return as_int(x, where)
    d = as_obj(x, where)
    if len(d) != 1:
        raise fail(where, f"expected one tag (float, dtype, quant, type, tensor, tuple, list), got {sorted(d)[:8]}")
    ((tag, body),) = d.items()
    if tag == "float":
        return as_float(body, where)
    if tag == "dtype":
        return dec_dtype(body, where)
    if tag == "quant":
        return dec_quant(body, where)
    if tag == "type":
        return dec_type(body, where)
    if tag == "tensor":
        return tensors.get(body, where)
    if tag in ("tuple", "list"):
        items = [dec_attr(e, tensors, where, depth + 1) for e in as_list(body, where)]
        return tuple(items) if tag == "tuple" else items
    raise fail(where, f"unknown attribute tag {tag[:40]!r}")


def _ints(n: int | None = None) -> Callable[[Any], bool]:
    return lambda v: (isinstance(v, (tuple, list)) and all(type(e) is int for e in v)
                      and (n is None or len(v) == n))


_INT = ("an integer", lambda v: type(v) is int)
_NUMBER = ("a number", lambda v: type(v) in (int, float))
_STR = ("a string", lambda v: type(v) is str)
_BOOL = ("true or false", lambda v: type(v) is bool)
_INTS = ("a tuple of integers", _ints())
_INTS2 = ("2 integers", _ints(2))
_INTS4 = ("4 integers", _ints(4))
_OPT_INTS = ("null or a tuple of integers", lambda v: v is None or _ints()(v))
_QUANT = ("a QuantSpec", lambda v: isinstance(v, QuantSpec))
_OPT_QUANT = ("null or a QuantSpec", lambda v: v is None or isinstance(v, QuantSpec))
_DTYPE = ("a DType", lambda v: isinstance(v, DType))
_ARRAY = ("an array", lambda v: isinstance(v, np.ndarray))
_TYPES = ("a tuple of TensorTypes", lambda v: isinstance(v, tuple) and all(isinstance(t, TensorType) for t in v))
_STRS = ("a tuple of strings", lambda v: isinstance(v, tuple) and all(type(e) is str for e in v))
_POOL = {"kernel": _INTS2, "stride": _INTS2, "pad": _INTS4}

# What each attribute of each op kind must hold (attributes of ops not listed here are
# checked by type inference alone).
ATTR_CHECKS: dict[str, dict[str, tuple[str, Callable[[Any], bool]]]] = {
    "constant": {"data": _ARRAY, "quant": _OPT_QUANT},
    "conv2d": {"stride": _INTS2, "dilation": _INTS2, "pad": _INTS4, "groups": _INT},
    "rescale": {"out": _QUANT, "rounding": _STR},
    "clamp": {"min": _NUMBER, "max": _NUMBER},
    "add": {"wrap": _BOOL},
    "sub": {"wrap": _BOOL},
    "mul": {"shift": _INT, "wrap": _BOOL},
    "concat": {"axis": _INT},
    "reshape": {"shape": _INTS},
    "transpose": {"perm": _INTS},
    "pad": {"pads": _INTS, "value": _NUMBER},
    "slice": {"start": _INTS, "stop": _INTS, "step": _OPT_INTS},
    "gather": {"axis": _INT},
    "avg_pool2d": _POOL,
    "max_pool2d": _POOL,
    "reduce_sum": {"axis": _INT},
    "reduce_max": {"axis": _INT},
    "reduce_min": {"axis": _INT},
    "argmax": {"axis": _INT},
    "argmin": {"axis": _INT},
    "table": {"table": _ARRAY, "offset": _INT, "out": _QUANT},
    "table_interp": {"table": _ARRAY, "out": _QUANT},
    "quantize": {"out": _QUANT},
    "dynamic_quantize": {"granularity": _STR, "dtype": _DTYPE, "qmax": _INT},
    "cast": {"dtype": _DTYPE, "out": _OPT_QUANT},
    "softmax": {"axis": _INT},
    "aten": {"target": _STR, "args": _STR, "in_dtypes": _STRS, "out_types": _TYPES, "out_dtypes": _STRS},
    "delegate": {"partition": _STR, "in_types": _TYPES, "out_types": _TYPES},
}


# -- graphs --------------------------------------------------------------------------------

def _enc_value(v: Value) -> dict:
    return {"name": v.name, "type": enc_type(v.type), "origin": enc_origin(v.origin)}


def encode_graph(graph: Graph, tensors: TensorWriter) -> dict:
    """The graph as JSON-able data; arrays go to ``tensors``. The graph must be valid (verify it first)."""
    index: dict[Value, int] = {}
    for v in graph.values():
        index[v] = len(index)

    def ref(v: Value) -> int:
        if v not in index:
            raise InvalidProgramError(f"can't save graph '{graph.name}': it uses %{v.name} without defining it")
        return index[v]

    ops = []
    for i, op in enumerate(graph.ops):
        operands = [x if x is None else [ref(e) for e in x] if isinstance(x, tuple) else ref(x)
                    for x in op.operands]
        attrs = {k: enc_attr(a, tensors, f"graph '{graph.name}' op #{i} ({op.kind}) attribute '{k}'")
                 for k, a in op.attrs.items()}
        ops.append({"kind": op.kind, "operands": operands, "attrs": attrs,
                    "results": [_enc_value(r) for r in op.results]})
    return {"name": graph.name, "inputs": [_enc_value(v) for v in graph.inputs], "ops": ops,
            "outputs": [ref(v) for v in graph.outputs]}


def _dec_value(x: Any, where: str) -> Value:
    d = as_obj(x, where, ("name", "type", "origin"))
    return Value(as_str(d["name"], f"{where} name"), dec_type(d["type"], f"{where} type"),
                 dec_origin(d["origin"], f"{where} origin"))


def _ref(x: Any, values: list[Value], where: str) -> Value:
    if type(x) is not int or not 0 <= x < len(values):
        shown = x if type(x) is int and abs(x) < 10**30 else json_kind(x)
        raise fail(where, f"refers to value {shown}, which is not defined before it "
                          f"(values 0..{len(values) - 1} are)")
    return values[x]


def _dec_operand(x: Any, values: list[Value], where: str):
    if x is None:
        return None
    if type(x) is list:
        return tuple(_ref(e, values, where) for e in x)
    return _ref(x, values, where)


def _operand_type(o):
    return tuple(v.type for v in o) if isinstance(o, tuple) else (None if o is None else o.type)


def _dec_op(x: Any, values: list[Value], tensors: TensorReader, where: str) -> Op:
    d = as_obj(x, where, ("kind", "operands", "attrs", "results"))
    kind = as_str(d["kind"], f"{where} kind")
    if kind not in OPS:
        raise fail(where, f"unknown op kind {kind[:40]!r} (a file from a newer qlower, or corrupt); "
                          f"this qlower knows {sorted(OPS)}")
    where = f"{where} ({kind})"
    operands = tuple(_dec_operand(o, values, f"{where} operand {j}")
                     for j, o in enumerate(as_list(d["operands"], f"{where} operands")))
    attrs = {}
    for name, raw in as_obj(d["attrs"], f"{where} attrs").items():
        value = dec_attr(raw, tensors, f"{where} attribute '{name[:40]}'")
        check = ATTR_CHECKS.get(kind, {}).get(name)
        if check is not None and not check[1](value):
            raise fail(where, f"attribute '{name}' must be {check[0]}, got {type(value).__name__}")
        attrs[name] = value
    results = tuple(_dec_value(r, f"{where} result {j}") for j, r in enumerate(as_list(d["results"], where)))
    try:
        attrs = normalize_attrs(kind, attrs)
        inferred = infer_types(kind, [_operand_type(o) for o in operands], attrs)
    except IRError as e:
        raise fail(where, f"the op registry rejects it: {e}") from None
    except Exception as e:  # noqa: BLE001 - inference on untrusted attributes may fail in any way
        raise fail(where, f"the op registry rejects it: {type(e).__name__}: {str(e)[:200]}") from None
    if len(inferred) != len(results):
        raise fail(where, f"stores {len(results)} result(s), the op registry infers {len(inferred)}")
    for r, t in zip(results, inferred):
        if r.type != t:
            raise fail(where, f"inconsistent file: result %{r.name} is stored as {r.type}, "
                              f"but its operands and attributes give {t}")
    op = Op(kind, operands, attrs, results)
    problem = check_call(op) if kind == "aten" else None
    if problem is not None:
        raise fail(where, problem)
    return op


def decode_graph(x: Any, tensors: TensorReader, where: str,
                 check_inputs: Callable[[tuple[Value, ...]], None] | None = None) -> Graph:
    """Rebuild a graph, re-inferring every op's types and verifying it (see the module docstring);
    ``check_inputs`` sees its inputs before any op is read."""
    d = as_obj(x, where, ("name", "inputs", "ops", "outputs"))
    values: list[Value] = [_dec_value(v, f"{where} input #{i}") for i, v in enumerate(as_list(d["inputs"], where))]
    inputs = tuple(values)
    if check_inputs is not None:
        check_inputs(inputs)
    ops = []
    for i, rec in enumerate(as_list(d["ops"], f"{where} ops")):
        op = _dec_op(rec, values, tensors, f"{where} op #{i}")
        ops.append(op)
        values.extend(op.results)
    outputs = tuple(_ref(o, values, f"{where} output #{i}") for i, o in enumerate(as_list(d["outputs"], where)))
    graph = Graph(inputs, tuple(ops), outputs, as_str(d["name"], f"{where} name"))
    try:
        verify_graph(graph)
    except VerificationError as e:
        raise fail(where, f"fails verification: {e}") from None
    except Exception as e:  # noqa: BLE001 - the verifier's rules assume sane values
        raise fail(where, f"fails verification: {type(e).__name__}: {str(e)[:200]}") from None
    return graph
