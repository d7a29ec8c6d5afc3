"""Checked access to decoded JSON: each accessor returns the value when it has the expected JSON
kind (and range) and raises an InvalidProgramError saying where it is otherwise."""

from __future__ import annotations

import math
from typing import Any

from qlower.errors import InvalidProgramError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_SPECIAL_FLOATS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def fail(where: str, msg: str) -> InvalidProgramError:
    return InvalidProgramError(f"{where}: {msg}" if where else msg)


def json_kind(x: Any) -> str:
    names = {type(None): "null", bool: "a boolean", int: "an integer", float: "a float",
             str: "a string", list: "a list", dict: "an object"}
    return names.get(type(x), type(x).__name__)


def as_obj(x: Any, where: str, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()) -> dict:
    """An object with exactly the ``required`` keys (plus any of ``optional``)."""
    if type(x) is not dict:
        raise fail(where, f"expected an object, got {json_kind(x)}")
    missing = [k for k in required if k not in x]
    if missing:
        raise fail(where, f"missing field(s) {missing}")
    extra = sorted(set(x) - set(required) - set(optional))
    if required and extra:
        raise fail(where, f"unknown field(s) {extra}")
    return x


def as_list(x: Any, where: str) -> list:
    if type(x) is not list:
        raise fail(where, f"expected a list, got {json_kind(x)}")
    return x


def as_str(x: Any, where: str) -> str:
    if type(x) is not str:
        raise fail(where, f"expected a string, got {json_kind(x)}")
    return x


def as_int(x: Any, where: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    if type(x) is not int:
        raise fail(where, f"expected an integer, got {json_kind(x)}")
    if not lo <= x <= hi:
        raise fail(where, f"integer {x if abs(x) < 10**30 else '(huge)'} is outside [{lo}, {hi}]")
    return x


def as_float(x: Any, where: str) -> float:
    if type(x) is float:
        return x
    if type(x) is str and x in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[x]
    raise fail(where, f"expected a float, got {json_kind(x)}")


def enc_float(x: float) -> float | str:
    x = float(x)
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
