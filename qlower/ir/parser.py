"""Graphs from text: ``parse_graph`` reads what ``print_graph(graph, exact=True)`` writes (see
``qlower.ir.text``), so tests state a pass's input and expected output as two short texts.

Types are inferred again from the op definitions, as the graph builder does; a printed type
must equal the inferred one (a fixture that says otherwise is an IRError naming the line).
The parsed graph has no origins (the text holds none).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from qlower.errors import IRError
from qlower.ir.dtypes import DType
from qlower.ir.graph import Graph, Op, Operand, TensorType, Value
from qlower.ir.opdefs import infer_types, normalize_attrs
from qlower.ir.quant import QuantSpec

_TOKEN = re.compile(r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<dims>\d+(?:x\d+)+(?=\]))|(?P<num>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)(?![\w.]))
                    |(?P<name>%[\w.\-]+)|(?P<word>[A-Za-z_][\w.\-]*)|(?P<punct>[()\[\]{},:=]))""", re.VERBOSE)
_DTYPES = {d.value: d for d in DType}


class _Line:
    """A cursor over the tokens of one line of text."""

    def __init__(self, text: str, where: str):
        self.where, self.tokens, pos = where, [], 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise self.error(f"can't read {text[pos:pos + 20]!r}")
            self.tokens.append((m.lastgroup, m.group(m.lastgroup)))
            pos = m.end()
        self.i = 0

    def error(self, message: str) -> IRError:
        return IRError(f"{self.where}: {message}")

    def peek(self) -> str | None:
        return self.tokens[self.i][1] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None, kind: str | None = None) -> str:
        if self.i >= len(self.tokens):
            raise self.error(f"ends where {expected or kind} was expected")
        k, text = self.tokens[self.i]
        if (expected is not None and text != expected) or (kind is not None and k != kind):
            raise self.error(f"expected {expected or kind}, found {text!r}")
        self.i += 1
        return text

    def accept(self, text: str) -> bool:
        if self.peek() == text:
            self.i += 1
            return True
        return False

    def done(self) -> None:
        if self.i != len(self.tokens):
            raise self.error(f"unexpected {self.peek()!r}")

    # -- values ------------------------------------------------------------------------
    def number(self) -> int | float:
        text = self.take(kind="num")
        return float(text) if any(c in text for c in ".eEn") else int(text)

    def numbers(self) -> tuple:
        if not self.accept("["):
            return (self.number(),)
        out = [self.number()]
        while self.accept(","):
            out.append(self.number())
        self.take("]")
        return tuple(out)

    def dtype(self) -> DType:
        word = self.take(kind="word")
        if word not in _DTYPES:
            raise self.error(f"unknown dtype {word!r}")
        return _DTYPES[word]

    def shape(self) -> tuple[int, ...]:
        """``[1x4x4]`` (``[scalar]`` for rank 0): the dims arrive as one word or number."""
        self.take("[")
        parts = []
        while not self.accept("]"):
            parts.append(self.take())
        text = "".join(parts)
        if text == "scalar":
            return ()
        if not re.fullmatch(r"\d+(x\d+)*", text):
            raise self.error(f"bad shape [{text}]")
        return tuple(int(d) for d in text.split("x"))

    def quant(self, dtype: DType) -> QuantSpec:
        self.take("{")
        fields: dict[str, Any] = {}
        while not self.accept("}"):
            key = self.take(kind="word")
            self.take("=")
            if key in ("s", "zp", "q"):
                fields[key] = self.numbers()
            elif key == "axis":
                fields[key] = self.number()
            elif key in ("dynamic", "dtype"):
                fields[key] = self.take(kind="word")
            else:
                raise self.error(f"unknown quantization field {key!r}")
        qdtype = _DTYPES.get(fields.get("dtype", dtype.value))
        if qdtype is None or "s" not in fields or "zp" not in fields:
            raise self.error("a quantization needs s= and zp= (and a known dtype=)")
        qmin, qmax = fields.get("q", (qdtype.min, qdtype.max))
        return QuantSpec(qdtype, fields["s"], fields["zp"], qmin, qmax, fields.get("axis"), fields.get("dynamic"))

    def type(self) -> TensorType:
        dtype = self.dtype()
        shape = self.shape()
        return TensorType(shape, dtype, self.quant(dtype) if self.peek() == "{" else None)

    def attr(self) -> Any:
        kind, text = self.tokens[self.i] if self.i < len(self.tokens) else (None, None)
        if kind == "num":
            return self.number()
        if kind == "str":
            self.i += 1
            return json.loads(text)
        if text in ("(", "["):
            self.i += 1
            close, items, trailing = ")" if text == "(" else "]", [], False
            while not self.accept(close):
                items.append(self.attr())
                trailing = self.accept(",")
                if not trailing and self.peek() != close:
                    raise self.error(f"expected , or {close}, found {self.peek()!r}")
            if text == "[":
                return items
            return tuple(items) if len(items) != 1 or trailing else items[0]
        word = self.take(kind="word")
        if word in ("none", "true", "false"):
            return {"none": None, "true": True, "false": False}[word]
        if word in _DTYPES:
            return _DTYPES[word]
        self.take("(")
        if word == "quant":
            dtype = self.dtype()
            value: Any = self.quant(dtype)
        elif word == "type":
            value = self.type()
        elif word == "array":
            value = self._array()
        else:
            raise self.error(f"unknown attribute value {word}(...)")
        self.take(")")
        return value

    def _array(self) -> np.ndarray:
        name = self.take(kind="word")
        shape = self.shape()
        self.take(",")
        items = self.attr()
        try:
            data = np.array(items, dtype=np.dtype(name)).reshape(shape)
        except (TypeError, ValueError) as e:
            raise self.error(f"bad array: {e}") from None
        data.setflags(write=False)
        return data


def _depth(line: str) -> int:
    """How many more brackets ``line`` opens than it closes (outside strings)."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', "", line)
    return sum(bare.count(c) for c in "([{") - sum(bare.count(c) for c in ")]}")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each statement: comments and blank lines dropped, a line that
    leaves a bracket open continued by the next ones (the graph's own ``{`` excepted)."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for i, raw in enumerate(text.splitlines()):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if pending is not None:
            pending = (pending[0], f"{pending[1]} {line}")
        else:
            pending = (i + 1, line)
        if not out or _depth(pending[1]) <= 0:
            out.append(pending)
            pending = None
    if pending is not None:
        out.append(pending)
    return out


def parse_graph(text: str) -> Graph:
    """The graph ``text`` describes (``print_graph(graph, exact=True)``'s form); IRError naming the
    line otherwise. Blank lines and ``#`` comments are skipped; indentation is free."""
    lines = _logical_lines(text)
    if len(lines) < 2:
        raise IRError("a graph's text needs a 'graph NAME(...) {' line and a '}' line")
    env: dict[str, Value] = {}

    def value(name: str, at: _Line) -> Value:
        if name[1:] not in env:
            raise at.error(f"{name} is not defined before its use")
        return env[name[1:]]

    def define(v: Value, at: _Line) -> Value:
        if v.name in env:
            raise at.error(f"%{v.name} is defined twice")
        env[v.name] = v
        return v

    n, head = lines[0]
    at = _Line(head, f"line {n}")
    at.take("graph")
    name = at.take(kind="word")
    at.take("(")
    inputs = []
    while not at.accept(")"):
        v = at.take(kind="name")
        at.take(":")
        inputs.append(define(Value(v[1:], at.type()), at))
        if not at.accept(","):
            at.take(")")
            break
    at.take("{")
    at.done()
    ops: list[Op] = []
    outputs: list[Value] | None = None
    for n, line in lines[1:-1]:
        at = _Line(line, f"line {n}")
        if outputs is not None:
            raise at.error("ops after 'return'")
        if at.accept("return"):
            outputs = [value(at.take(kind="name"), at)]
            while at.accept(","):
                outputs.append(value(at.take(kind="name"), at))
            at.done()
            continue
        ops.append(_op(at, value, define))
    n, last = lines[-1]
    if last != "}" or outputs is None:
        raise IRError(f"line {n}: a graph ends with 'return ...' and '}}'")
    return Graph(tuple(inputs), tuple(ops), tuple(outputs), name)


def _op(at: _Line, value, define) -> Op:
    names = [at.take(kind="name")]
    while at.accept(","):
        names.append(at.take(kind="name"))
    at.take("=")
    kind = at.take(kind="word")
    at.take("(")
    operands: list[Operand] = []
    while not at.accept(")"):
        if at.accept("("):
            group = []
            while not at.accept(")"):
                group.append(value(at.take(kind="name"), at))
                at.accept(",")
            operands.append(tuple(group))
        elif at.accept("none"):
            operands.append(None)
        else:
            operands.append(value(at.take(kind="name"), at))
        if not at.accept(","):
            at.take(")")
            break
    attrs: dict[str, Any] = {}
    if at.accept("{"):
        while not at.accept("}"):
            key = at.take(kind="word")
            at.take("=")
            attrs[key] = at.attr()
            at.accept(",")
    printed = []
    if at.accept(":"):
        printed.append(at.type())
        while at.accept(","):
            printed.append(at.type())
    at.done()

    def type_of(o: Operand):
        return None if o is None else tuple(v.type for v in o) if isinstance(o, tuple) else o.type

    try:
        attrs = normalize_attrs(kind, attrs)
        types = infer_types(kind, [type_of(o) for o in operands], attrs)
    except (IRError, KeyError) as e:
        raise at.error(f"{kind}: {e}") from None
    if len(types) != len(names) or (printed and tuple(printed) != tuple(types)):
        raise at.error(f"{kind} gives {', '.join(map(str, types))}, the text says "
                       f"{', '.join(map(str, printed)) or f'{len(names)} result(s)'}")
    return Op(kind, tuple(operands), attrs, tuple(define(Value(nm[1:], t), at) for nm, t in zip(names, types)))
