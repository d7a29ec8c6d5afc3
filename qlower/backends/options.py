"""A backend's options are its constructor's parameters, typed by their annotations.

The command line gives every option as text (``--option threads=2``); the annotation says
what the text means: ``int``, ``float``, ``bool`` (true/false, yes/no, 1/0), ``str``, a
``Literal`` of choices, any of them ``| None`` (written ``none``). Values given from Python
are checked against the same annotations, so both ways fail alike: a ``ConfigError`` naming
the option, the value and what it expects.
"""

from __future__ import annotations

import inspect
import types
import typing
import unicodedata
from collections.abc import Mapping
from typing import Any

from qlower.errors import ConfigError

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def option_types(backend_cls: type) -> dict[str, Any]:
    """Option name -> annotation (``Any`` where there is none), in the constructor's order."""
    hints = typing.get_type_hints(backend_cls.__init__)
    return {n: hints.get(n, Any) for n, p in inspect.signature(backend_cls).parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _alternatives(annotation: Any) -> tuple[Any, ...]:
    """The members of a union (``int | None``), else the annotation alone."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def expected(annotation: Any) -> str:
    """What a value of ``annotation`` is, in words."""
    words = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "none"}
    parts = []
    for a in _alternatives(annotation):
        if typing.get_origin(a) is typing.Literal:
            parts.append("one of " + ", ".join(str(c) for c in typing.get_args(a)))
        else:
            parts.append(words.get(a, "any value"))
    return " or ".join(parts)


def _matches(value: Any, a: Any) -> bool:
    if a is Any:
        return True
    if a is type(None):
        return value is None
    if typing.get_origin(a) is typing.Literal:
        return any(value == c and type(value) is type(c) for c in typing.get_args(a))
    if a is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if a is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(a, type) and isinstance(value, a)


def _control_characters(value: Any) -> bool:
    return isinstance(value, str) and any(unicodedata.category(c) in ("Cc", "Cf", "Cs") for c in value)


def check_value(target: str, name: str, value: Any, annotation: Any) -> Any:
    """``value`` if it is of ``annotation``; a ConfigError otherwise. No option's text holds a
    control character (a backend may write it into a compiler's configuration text, where a
    newline would start a line of the user's choosing)."""
    if _control_characters(value):
        raise ConfigError(f"target {target!r} option {name}={value!r}: an option's text may not hold control "
                          "characters")
    if any(_matches(value, a) for a in _alternatives(annotation)):
        return value
    raise ConfigError(f"target {target!r} option {name}={value!r} ({type(value).__name__}): "
                      f"expected {expected(annotation)}")


def _parsed(text: str, a: Any) -> tuple[bool, Any]:
    """(True, value) when ``text`` reads as a value of ``a``."""
    low = text.strip().lower()
    if a is type(None):
        return low == "none", None
    if a is bool:
        return low in _TRUE + _FALSE, low in _TRUE
    if typing.get_origin(a) is typing.Literal:
        found = [c for c in typing.get_args(a) if str(c).lower() == low]
        return bool(found), found[0] if found else None
    if a in (int, float):
        try:
            return True, a(text.strip())
        except ValueError:
            return False, None
    return a in (str, Any), text


def parse_value(target: str, name: str, text: str, annotation: Any) -> Any:
    """The option's text (from the command line) as a value of ``annotation``."""
    if _control_characters(text):
        raise ConfigError(f"target {target!r} option {name}={text!r}: an option's text may not hold control "
                          "characters")
    for a in _alternatives(annotation):
        ok, value = _parsed(text, a)
        if ok:
            return value
    raise ConfigError(f"target {target!r} option {name}={text!r}: expected {expected(annotation)}")


def check_options(target: str, backend_cls: type, options: Mapping[str, Any], from_text: bool = False
                  ) -> dict[str, Any]:
    """``options`` checked against the constructor (text parsed first when ``from_text``): an
    unknown option, or a value of the wrong type, is a ConfigError."""
    known = option_types(backend_cls)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"target {target!r} has no backend option {', '.join(map(repr, unknown))}; "
                          f"its options: {', '.join(known) or 'none'}")
    if from_text:
        return {k: parse_value(target, k, str(v), known[k]) for k, v in options.items()}
    return {k: check_value(target, k, v, known[k]) for k, v in options.items()}


def check_arguments(target: str, backend_cls: type, **values: Any) -> None:
    """A backend constructor's own check of its arguments (it may be built directly, not only
    through ``compile``'s ``backend_options``): each against its annotation, as ``check_options``."""
    check_options(target, backend_cls, values)
