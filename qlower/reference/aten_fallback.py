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
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Sequence
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


def decode_call(text: str, tensors: Sequence[torch.Tensor]) -> tuple[list, dict]:
    if not isinstance(text, str) or len(text) > MAX_ARGS_CHARS:
        raise InvalidProgramError(f"float fallback arguments must be a JSON string of at most {MAX_ARGS_CHARS} "
                                  "characters")
    try:
        d = json.loads(text, parse_constant=lambda c: c)  # 'NaN'/'Infinity' stay strings and are rejected
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
    with torch.no_grad():
        out = fn(*args, **kwargs)
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
