"""The float fallback op (``aten``): its meaning is the PyTorch core ATen op it names.

DESIGN.md rule 8: an op without an integer rule is not refused; it runs in float
on the host, and the reference defines it by calling that ATen op. The op's
arguments are stored as JSON (never pickle) and decoded here, for the reference
interpreter and for the CPU backend alike, so both call the very same function
with the very same arguments: the CPU backend is bit-exact with the reference by
construction, and the reference is checked against eager PyTorch in the tests.

A stored call is hostile until validated: the target must be an op of PyTorch's
core ATen op set (``torch.Tag.core``) that is deterministic, and the arguments
may hold only JSON scalars, lists, operand references and a few tagged torch
enums (dtype, device, layout, memory format).

Only ops a model's forward pass produces are accepted (``FORWARD_OPS``, an allow-list:
no ``*_backward``, no ``empty*`` returning uninitialised memory, no ``as_strided``
reading where it likes, nothing of data-dependent shape), and each op whose kernel
trusts its arguments has a guard run on the real tensors before every call (``GUARDS``:
index arguments within their dimension, integer division by zero or of the smallest
integer by -1), so that no stored call can crash the process (ATen's kernels read
out of bounds or trap on what they don't check).
"""


from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from qlower.errors import InvalidProgramError
from qlower.ir import Op
from qlower.reference.registry import kernel

if TYPE_CHECKING:
    import torch

MAX_ARGS_CHARS = 1 << 16
MAX_DEPTH = 6
_NAME = re.compile(r"^aten\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)$")
_SPECIAL = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


# torch is imported on first use, not with the reference interpreter: a graph without float
# fallback ops runs with NumPy alone (and `import qlower.reference` stays light)
@functools.cache
def _torch():
    import torch

    return torch


@functools.cache
def _tables() -> tuple[dict, dict, dict, dict]:
    """(dtype by name, name by dtype, layouts, memory formats) that stored calls may name."""
    torch = _torch()
    dtypes = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
              "bfloat16": torch.bfloat16, "bool": torch.bool, "int64": torch.int64, "int32": torch.int32,
              "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8}
    return (dtypes, {v: k for k, v in dtypes.items()}, {"strided": torch.strided},
            {"contiguous_format": torch.contiguous_format, "preserve_format": torch.preserve_format,
             "channels_last": torch.channels_last})


class Operand:
    """Marks where the i-th tensor operand goes in an encoded call."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _tables()[1][dtype]
    except KeyError:
        raise TypeError(f"tensors of dtype {dtype} can't cross into the float fallback") from None


# -- which ops, and what is checked before each call ----------------------------------------

# The core ATen ops (torch.Tag.core) a model's forward pass produces; every other op is refused
# (their ``*_backward`` twins, ``empty``/``empty_strided``, ``as_strided``, ``nonzero``, FFTs, sym_*).
FORWARD_OPS = frozenset("""
    _adaptive_avg_pool2d _adaptive_avg_pool3d _cdist_forward _embedding_bag _log_softmax
    _native_batch_norm_legit _native_batch_norm_legit_no_training _pdist_forward _softmax _to_copy
    abs acos acosh add addmm alias amax amin any arange argmax argmin asin asinh atan atan2 atanh
    avg_pool2d avg_pool3d bitwise_and bitwise_not bitwise_or bitwise_xor bmm cat ceil clamp clone col2im
    constant_pad_nd convolution copy cos cosh cumsum diagonal div elu embedding eq erf exp expand expm1
    fill flip floor fmod full full_like gather ge gelu grid_sampler_2d gt hardtanh index index_put
    index_select isinf isnan le leaky_relu log log10 log1p log2 logical_and logical_not logical_or
    logical_xor lt masked_scatter max max_pool2d_with_indices max_pool3d_with_indices maximum mean min
    minimum mm mul native_group_norm native_layer_norm ne neg permute pow prod reciprocal
    reflection_pad1d reflection_pad2d reflection_pad3d relu remainder repeat replication_pad2d
    replication_pad3d round rsqrt scalar_tensor scatter scatter_add scatter_reduce select select_scatter
    sigmoid sign sin sinh slice slice_scatter sort split_with_sizes sqrt squeeze sub sum tan tanh topk
    trunc unsqueeze upsample_bilinear2d upsample_nearest2d var view where
""".split())

def _dim_size(t: Any, dim: Any) -> int | None:
    """The size of ``t`` along ``dim`` (None when either is not what ATen would accept)."""
    torch = _torch()
    if not isinstance(t, torch.Tensor) or type(dim) is not int:
        return None
    rank = max(t.dim(), 1)
    if not -rank <= dim < rank:
        return None
    return t.shape[dim % rank] if t.dim() else 1


def _outside(index: Any, lo: int, hi: int, what: str) -> str | None:
    """Why the integer tensor ``index`` has an element outside [lo, hi), or None."""
    torch = _torch()
    if not isinstance(index, torch.Tensor) or index.dtype.is_floating_point or index.dtype == torch.bool \
            or not index.numel():
        return None
    small, big = int(index.min()), int(index.max())
    if small < lo or big >= hi:
        bad = small if small < lo else big
        return f"{what} {bad} is outside [{lo}, {hi})"
    return None


def _index_along(tensor: str, dim: str | None, index: str, negative: bool = False) -> Callable:
    """Guard: ``index`` within the size of ``tensor`` along ``dim`` (dim 0 when None)."""
    def guard(a: dict[str, Any]) -> str | None:
        size = _dim_size(a.get(tensor), a.get(dim) if dim else 0)
        if size is None:
            return None   # ATen refuses the dimension itself
        return _outside(a.get(index), -size if negative else 0, size, f"index into dimension of size {size}:")
    return guard


def _index_lists(a: dict[str, Any]) -> str | None:
    """``aten.index`` / ``index_put``: each index tensor within its dimension (negative counts from the end)."""
    torch = _torch()
    x, indices = a.get("self"), a.get("indices")
    if not isinstance(x, torch.Tensor) or not isinstance(indices, (list, tuple)):
        return None
    for d, index in enumerate(indices[:x.dim()]):
        if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
            if tuple(index.shape) != tuple(x.shape[d:d + index.dim()]):
                return f"a boolean mask of shape {tuple(index.shape)} doesn't match the indexed dimensions"
            continue
        problem = _outside(index, -x.shape[d], x.shape[d], f"index into dimension {d} of size {x.shape[d]}:")
        if problem:
            return problem
    return None


def _embedding_bag(a: dict[str, Any]) -> str | None:
    torch = _torch()
    weight, indices, offsets = a.get("weight"), a.get("indices"), a.get("offsets")
    if not all(isinstance(t, torch.Tensor) for t in (weight, indices, offsets)) or weight.dim() < 1:
        return None
    problem = _outside(indices, 0, weight.shape[0], f"index into {weight.shape[0]} embeddings:")
    if problem or not offsets.numel():
        return problem
    problem = _outside(offsets, 0, indices.numel() + 1, f"offset into {indices.numel()} indices:")
    if problem is None and offsets.dim() == 1 and offsets.numel() > 1 and bool((offsets[1:] < offsets[:-1]).any()):
        problem = "offsets decrease"
    return problem


def _masked_scatter(a: dict[str, Any]) -> str | None:
    torch = _torch()
    mask, source = a.get("mask"), a.get("source")
    if isinstance(mask, torch.Tensor) and isinstance(source, torch.Tensor) and \
            int(mask.to(torch.bool).sum()) > source.numel():
        return f"the mask selects more elements than the source's {source.numel()}"
    return None


def _integer_division(a: dict[str, Any]) -> str | None:
    """Integer div (with a rounding mode), remainder, fmod: no division by zero, and not the
    dtype's smallest value by -1 (its quotient doesn't exist: the CPU traps)."""
    torch = _torch()
    x, y = a.get("self"), a.get("other")
    if x is None or y is None:
        return None
    try:
        dtype = torch.result_type(x, y)
    except (TypeError, RuntimeError):
        return None
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return None
    ys = y if isinstance(y, torch.Tensor) else torch.tensor(y)
    if bool((ys == 0).any()):
        return "integer division by zero"
    if not bool((ys == -1).any()):
        return None
    xs = x if isinstance(x, torch.Tensor) else torch.tensor(x)
    smallest = torch.iinfo(dtype).min
    if isinstance(y, torch.Tensor) and isinstance(x, torch.Tensor):
        hit = bool(((xs == smallest) & (ys == -1)).any())
    else:
        hit = bool((xs == smallest).any())
    return f"integer division of {smallest} by -1 (the quotient overflows {dtype})" if hit else None


def _integer_div(a: dict[str, Any]) -> str | None:
    """``div`` with a rounding mode; without one it is true division (a float result, inf for 0)."""
    return _integer_division(a) if a.get("rounding_mode") in ("trunc", "floor") else None


# op name -> what is checked on the real tensors before every call (names are the schema's)
GUARDS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "gather": _index_along("self", "dim", "index"),
    "index_select": _index_along("self", "dim", "index"),
    "scatter": _index_along("self", "dim", "index"),
    "scatter_add": _index_along("self", "dim", "index"),
    "scatter_reduce": _index_along("self", "dim", "index"),
    "embedding": _index_along("weight", None, "indices"),
    "index": _index_lists,
    "index_put": _index_lists,
    "_embedding_bag": _embedding_bag,
    "masked_scatter": _masked_scatter,
    "div": _integer_div,
    "remainder": _integer_division,
    "fmod": _integer_division,
}


def _bind(fn: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments by the names of the op's schema."""
    bound = dict(zip((a.name for a in fn._schema.arguments), args))
    bound.update(kwargs)
    return bound


def guard_problem(target: str, fn: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """Why this call (real tensors) must not reach ATen, or None."""
    guard = GUARDS.get(target.split(".")[1])
    return guard(_bind(fn, args, kwargs)) if guard is not None else None


@functools.lru_cache(maxsize=512)
def resolve(target: str) -> torch._ops.OpOverload:
    """The OpOverload named ``aten.NAME.OVERLOAD``; only deterministic core ATen ops are accepted."""
    torch = _torch()
    m = _NAME.match(target) if isinstance(target, str) else None
    if m is None:
        raise InvalidProgramError(f"float fallback target {str(target)[:60]!r} is not an aten op name "
                                  "('aten.NAME.OVERLOAD')")
    packet = getattr(torch.ops.aten, m.group(1), None)
    overload = getattr(packet, m.group(2), None) if isinstance(packet, torch._ops.OpOverloadPacket) else None
    if not isinstance(overload, torch._ops.OpOverload):
        raise InvalidProgramError(f"float fallback target {target!r}: PyTorch has no such op")
    if torch.Tag.core not in overload.tags:
        raise InvalidProgramError(f"float fallback target {target!r} is not in PyTorch's core ATen op set")
    if overload._schema.is_mutable:
        raise InvalidProgramError(f"float fallback target {target!r} writes into its arguments")
    if torch.Tag.nondeterministic_seeded in overload.tags:
        raise InvalidProgramError(f"float fallback target {target!r} is random; it can't define a result")
    if m.group(1) not in FORWARD_OPS:
        raise InvalidProgramError(f"float fallback target {target!r} is not an op of a model's forward pass "
                                  "(backward ops, uninitialised memory, raw strides and data-dependent shapes "
                                  "are refused)")
    return overload


def fallback_reason(target: str) -> str:
    """What users read in ``explain()`` and the report about a float fallback op."""
    return f"no quantized rule for {target}; runs in float on the host"


def is_core_aten(target: Any) -> bool:
    try:
        resolve(target)
        return True
    except InvalidProgramError:
        return False


# -- arguments as JSON ----------------------------------------------------------------------

def _enc(x: Any) -> Any:
    torch = _torch()
    _, _, layouts, memory_formats = _tables()
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, Operand):
        return {"input": x.index}
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else {"float": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
    if isinstance(x, (list, tuple)):
        return [_enc(e) for e in x]
    if isinstance(x, torch.dtype):
        return {"dtype": dtype_name(x)}
    if isinstance(x, torch.device):
        return {"device": "cpu"}
    if isinstance(x, torch.layout) and x in layouts.values():
        return {"layout": "strided"}
    if isinstance(x, torch.memory_format):
        for k, v in memory_formats.items():
            if v == x:
                return {"memory_format": k}
    raise TypeError(f"an argument of type {type(x).__name__} ({str(x)[:40]}) can't be stored")


def encode_call(args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """JSON of a call's arguments; ``Operand`` marks each tensor operand. TypeError when not storable."""
    return json.dumps({"args": [_enc(a) for a in args], "kwargs": {k: _enc(v) for k, v in kwargs.items()}},
                      allow_nan=False, separators=(",", ":"))


def _dec(x: Any, tensors: Sequence[torch.Tensor], depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise InvalidProgramError(f"float fallback arguments nest deeper than {MAX_DEPTH} levels")
    if x is None or type(x) in (bool, str, int, float):
        return x
    if type(x) is list:
        return [_dec(e, tensors, depth + 1) for e in x]
    if type(x) is not dict or len(x) != 1:
        raise InvalidProgramError(f"float fallback argument {str(x)[:60]} is not a value, a list or a tag")
    ((tag, body),) = x.items()
    dtypes, _, layouts, memory_formats = _tables()
    if tag == "input" and type(body) is int and 0 <= body < len(tensors):
        return tensors[body]
    if tag == "float" and body in _SPECIAL:
        return _SPECIAL[body]
    if tag == "dtype" and body in dtypes:
        return dtypes[body]
    if tag == "device" and body == "cpu":
        return _torch().device("cpu")
    if tag == "layout" and body in layouts:
        return layouts[body]
    if tag == "memory_format" and body in memory_formats:
        return memory_formats[body]
    raise InvalidProgramError(f"float fallback argument {str(x)[:60]} has an unknown tag or a bad value")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise ValueError(f"duplicate key in a JSON object ({len(pairs) - len(d)} repeated)")
    return d


def decode_call(text: str, tensors: Sequence[torch.Tensor]) -> tuple[list, dict]:
    if not isinstance(text, str) or len(text) > MAX_ARGS_CHARS:
        raise InvalidProgramError(f"float fallback arguments must be a JSON string of at most {MAX_ARGS_CHARS} "
                                  "characters")
    try:
        d = json.loads(text, parse_constant=lambda c: c,  # 'NaN'/'Infinity' stay strings and are rejected
                       object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as e:
        raise InvalidProgramError(f"float fallback arguments are not valid JSON: {str(e)[:80]}") from None
    if type(d) is not dict or set(d) != {"args", "kwargs"} or type(d["args"]) is not list \
            or type(d["kwargs"]) is not dict:
        raise InvalidProgramError("float fallback arguments must be an object with 'args' and 'kwargs'")
    return ([_dec(a, tensors, 1) for a in d["args"]],
            {str(k): _dec(v, tensors, 1) for k, v in d["kwargs"].items()})


def check_call(op: Op) -> str | None:
    """Why ``op``'s stored call can't be run, or None: the target, the arguments, and the result
    types the op really produces (computed on meta tensors: no data is touched)."""
    torch = _torch()
    dtypes, names, _, _ = _tables()
    try:
        fn = resolve(op.attrs["target"])
        metas = [torch.empty(v.shape, dtype=dtypes[d], device="meta")
                 for v, d in zip(op.operands[0], op.attrs["in_dtypes"])]
        args, kwargs = decode_call(op.attrs["args"], metas)
    except InvalidProgramError as e:
        return str(e)
    params = [a.name for a in fn._schema.arguments]
    if "device" in params:   # a factory op (full, arange, ...): made on the meta device too, never allocated
        at = params.index("device")
        if at < len(args):
            args[at] = torch.device("meta")
        else:
            kwargs["device"] = torch.device("meta")
    try:
        with torch.no_grad():
            out = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - any failure of the op on these arguments makes the call invalid
        return f"{op.attrs['target']} rejects its stored arguments: {type(e).__name__}: {str(e)[:160]}"
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    got = [(tuple(o.shape), names.get(o.dtype)) if isinstance(o, torch.Tensor) else None for o in outs]
    want = [(t.shape, d) for t, d in zip(op.attrs["out_types"], op.attrs["out_dtypes"])]
    if got != want:
        return f"{op.attrs['target']} produces {got}, but its results are typed {want}"
    return None


# -- execution -----------------------------------------------------------------------------

def call(op: Op, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Run the ATen op on torch tensors (converted to ``in_dtypes``); results as the IR holds them
    (float32, bool, or int32 with a range check)."""
    torch = _torch()
    fn = resolve(op.attrs["target"])
    tensors = [x.to(_tables()[0][d]) for x, d in zip(inputs, op.attrs["in_dtypes"])]
    args, kwargs = decode_call(op.attrs["args"], tensors)
    problem = guard_problem(op.attrs["target"], fn, args, kwargs)
    if problem is not None:
        raise ValueError(f"{op.attrs['target']} refused before the call: {problem}")
    try:
        with torch.no_grad():
            out = fn(*args, **kwargs)
    except (RuntimeError, IndexError, TypeError) as e:   # what ATen raises on arguments it checks
        raise ValueError(f"{op.attrs['target']}: {type(e).__name__}: {str(e)[:200]}") from None
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    types = op.attrs["out_types"]
    if len(outs) != len(types) or not all(isinstance(o, torch.Tensor) for o in outs):
        raise ValueError(f"{op.attrs['target']} returned {len(outs)} result(s), expected {len(types)} tensors")
    results = []
    for o, t in zip(outs, types):
        if tuple(o.shape) != t.shape:
            raise ValueError(f"{op.attrs['target']} returned shape {tuple(o.shape)}, typed {t.shape}")
        if t.dtype.is_integer and o.numel() and (int(o.min()) < t.dtype.min or int(o.max()) > t.dtype.max):
            raise ArithmeticError(f"{op.attrs['target']} returned integers outside {t.dtype.value}")
        results.append(o.to(torch.float32 if t.dtype.is_float else torch.bool if not t.dtype.is_integer
                            else torch.int32).contiguous())
    return tuple(results)


@kernel("aten")
def _aten(op: Op, inputs):
    outs = call(op, [_torch().from_numpy(np.array(x, copy=True, order="C")) for x in inputs])
    return tuple(o.numpy() for o in outs)
