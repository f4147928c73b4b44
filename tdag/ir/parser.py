"""Parse the text form (see ``tdag.ir.printer``) back into a Program.

A file may come from anywhere, so nothing here evaluates code: a regex tokenizer per line and a
recursive-descent parser over lines. Dims go through ``symbols.parse_dim`` (itself a small
parser); specs are rebuilt as their exact dataclass types from the field annotations.

>>> import tdag
>>> from tdag import ops
>>> prog = tdag.trace(lambda x: ops.sum(x * x, axis=1), tdag.TensorSpec(("b", 8)))
>>> parse(str(prog)) == prog
True
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import re
import types
import typing
from dataclasses import dataclass
from functools import lru_cache

import sympy
import torch

from tdag.deinops import REGISTRY
from tdag.errors import FileFormatError, TdagError
from tdag.ir.graph import TDAG, Node, Value, Weight
from tdag.ir.op import Op
from tdag.ir.printer import parse_plain_origin
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.symbols import Dim, parse_dim, product, shape_is_static
from tdag.ir.types import DType, Origin, TensorKind, TensorType

_STRING = r'"(?:[^"\\\n]|\\.)*"'
_TOKEN = re.compile(rf"""
    (?P<ws>\s+)
  | (?P<comment>\#.*)
  | (?P<string>{_STRING})
  | (?P<name>%(?:[A-Za-z0-9_](?:[A-Za-z0-9_.:]*[A-Za-z0-9_])?|{_STRING}))
  | (?P<number>\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+)
  | (?P<ident>[A-Za-z_](?:[A-Za-z0-9_.:]*[A-Za-z0-9_])?)
  | (?P<punct>//|\*\*|[-+*/()\[\]{{}},=:@])
""", re.X)
_ARITH = frozenset({"+", "-", "*", "/", "//", "**"})
_KINDS = {k.value: k for k in TensorKind}


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # string | name | number | ident | punct
    text: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class _Ident:
    """A bare word in a value: an enum member, a dim symbol, inf or nan (the field decides)."""
    text: str


@dataclass(frozen=True, slots=True)
class _Expr:
    """A dimension expression (``2*b``, ``floor(s/2)+1``), kept as text for parse_dim."""
    text: str


@dataclass(frozen=True, slots=True)
class _Ref:
    """A ``%name`` used as a value (a controller's condition)."""
    name: str


# -- one line ---------------------------------------------------------------------------------

class _Line:
    """The tokens of one line and a cursor over them; every error names the line."""

    def __init__(self, lineno: int, text: str):
        self.lineno, self.text, self.pos = lineno, text, 0
        self.tokens: list[_Tok] = []
        self.comment: str | None = None
        self._tokenize()

    def _tokenize(self) -> None:
        pos = 0
        while pos < len(self.text):
            m = _TOKEN.match(self.text, pos)
            if m is None:
                self.error(f"unexpected character {self.text[pos]!r}")
            kind = m.lastgroup
            if kind == "comment":
                self.comment = m.group()[1:]
                break
            if kind != "ws":
                self.tokens.append(_Tok(kind, m.group(), m.start(), m.end()))
            pos = m.end()

    def error(self, message: str) -> typing.NoReturn:
        raise FileFormatError(f"line {self.lineno}: {message}: {self.text.strip()!r}")

    @contextlib.contextmanager
    def guard(self):
        """Turn a failure deep in a conversion (a bad dim, enum, spec) into a line error."""
        try:
            yield
        except FileFormatError:
            raise
        except (TdagError, ValueError, TypeError, KeyError, RuntimeError, IndexError) as exc:
            self.error(str(exc) or type(exc).__name__)

    def peek(self, offset: int = 0) -> _Tok | None:
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else None

    def at(self, text: str, offset: int = 0) -> bool:
        tok = self.peek(offset)
        return tok is not None and tok.kind in ("punct", "ident") and tok.text == text

    def take(self, what: str = "more text") -> _Tok:
        tok = self.peek()
        if tok is None:
            self.error(f"line ends where {what} was expected")
        self.pos += 1
        return tok

    def expect(self, text: str) -> _Tok:
        tok = self.take(repr(text))
        if tok.kind not in ("punct", "ident") or tok.text != text:
            self.error(f"expected {text!r}, found {tok.text!r}")
        return tok

    def done(self) -> None:
        tok = self.peek()
        if tok is not None:
            self.error(f"unexpected {tok.text!r}")

    # -- atoms ----------------------------------------------------------------------------

    def name(self) -> str:
        tok = self.take("a %name")
        if tok.kind != "name":
            self.error(f"expected a %name, found {tok.text!r}")
        return json.loads(tok.text[1:]) if tok.text[1] == '"' else tok.text[1:]

    def ident(self) -> str:
        """A graph name: a bare word or a quoted string."""
        tok = self.take("a name")
        if tok.kind == "ident":
            return tok.text
        if tok.kind == "string":
            return json.loads(tok.text)
        self.error(f"expected a name, found {tok.text!r}")

    def type(self) -> TensorType:
        tok = self.take("a type")
        try:
            dtype = DType(tok.text)
        except ValueError:
            self.error(f"unknown dtype {tok.text!r}")
        self.expect("[")
        dims = []
        while not self.at("]"):
            dims.append(_to_dim(self.value()))
            if not self.at("]"):
                self.expect(",")
        self.expect("]")
        return TensorType(tuple(dims), dtype)

    def params(self) -> tuple:
        """``(%a: f32[4], %b: i64[])``."""
        self.expect("(")
        values = []
        while not self.at(")"):
            name = self.name()
            self.expect(":")
            values.append(Value(name, self.type()))
            if not self.at(")"):
                self.expect(",")
        self.expect(")")
        return tuple(values)

    def names(self) -> tuple:
        """``%a, %b, %c`` up to the end of the line."""
        result = []
        while self.peek() is not None:
            result.append(self.name())
            if self.peek() is not None:
                self.expect(",")
        return tuple(result)

    def arguments(self) -> tuple[tuple, dict]:
        """``(%a, %b, key=value, ...)``: names first, then keywords."""
        self.expect("(")
        inputs, keywords = [], {}
        while not self.at(")"):
            tok = self.peek()
            if tok is not None and tok.kind == "name":
                if keywords:
                    self.error(f"input {tok.text} after a keyword argument")
                inputs.append(self.name())
            elif tok is not None and tok.kind == "ident" and self.at("=", 1):
                self.pos += 2
                if tok.text in keywords:
                    self.error(f"argument {tok.text!r} given twice")
                keywords[tok.text] = self.value()
            else:
                self.error(f"expected %name or key=value, found {tok.text if tok else 'end'!r}")
            if not self.at(")"):
                self.expect(",")
        self.expect(")")
        return tuple(inputs), keywords

    # -- values ---------------------------------------------------------------------------

    def value(self):
        """A tuple ``(a, b)``, a list ``[a, b]`` or an atom (number, word, dim expression)."""
        if self.at("(") or self.at("["):
            close = ")" if self.take().text == "(" else "]"
            items, trailing = [], False
            while not self.at(close):
                items.append(self.value())
                trailing = self.at(",")
                if not self.at(close):
                    self.expect(",")
            self.expect(close)
            if close == ")" and len(items) == 1 and not trailing:
                self.error("a one-element tuple needs a trailing comma: (x,)")
            return tuple(items) if close == ")" else items
        return self._atom()

    def _atom(self):
        start, depth = self.pos, 0
        while (tok := self.peek()) is not None:
            if tok.kind == "punct" and tok.text not in _ARITH | {"(", ")"}:
                if depth:
                    self.error(f"unexpected {tok.text!r} inside parentheses")
                break
            if tok.text == ")" and tok.kind == "punct":
                if depth == 0:
                    break
                depth -= 1
            elif tok.text == "(" and tok.kind == "punct":
                depth += 1
            self.pos += 1
        toks = self.tokens[start:self.pos]
        if not toks:
            self.error("expected a value")
        return self._classify(toks)

    def _classify(self, toks: list[_Tok]):
        first = toks[0]
        if len(toks) == 1:
            if first.kind == "number":
                return float(first.text) if any(c in first.text for c in ".eE") else int(first.text)
            if first.kind == "string":
                return json.loads(first.text)
            if first.kind == "name":
                self.pos -= 1
                return _Ref(self.name())
            if first.kind == "ident":
                return {"True": True, "False": False, "None": None}.get(first.text,
                                                                       _Ident(first.text))
        if len(toks) == 2 and first.text == "-" and toks[1].kind == "number":
            return -self._classify(toks[1:])
        if any(t.kind in ("string", "name") for t in toks):
            self.error("expected a value")
        return _Expr(self.text[first.start:toks[-1].end])


# -- converting parsed values to typed ones ---------------------------------------------------

def _to_dim(v) -> Dim:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, (_Ident, _Expr)):
        return parse_dim(v.text)
    raise ValueError(f"not a dimension: {v!r}")


def _to_float(v) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v  # an int stays an int: the field held exactly what was printed
    if isinstance(v, (_Ident, _Expr)) and v.text.lstrip("-") in ("inf", "nan"):
        return float(v.text)
    raise ValueError(f"not a number: {v!r}")


def _literal(v):
    """A const's values: (nested lists of) numbers and bools."""
    if isinstance(v, list):
        return [_literal(x) for x in v]
    if isinstance(v, bool) or v is None:
        if v is None:
            raise ValueError("None is not a tensor value")
        return v
    return _to_float(v)


def _generic(v):
    """A value with no usable annotation: words are dim symbols, except inf and nan."""
    if isinstance(v, tuple):
        return tuple(_generic(x) for x in v)
    if isinstance(v, list):
        return [_generic(x) for x in v]
    if isinstance(v, (_Ident, _Expr)):
        return float(v.text) if v.text.lstrip("-") in ("inf", "nan") else parse_dim(v.text)
    if isinstance(v, _Ref):
        raise ValueError(f"a %name is not a spec value: %{v.name}")
    return v


def _convert(v, hint):
    """Convert a parsed value to the Python type the spec field is annotated with."""
    if hint is None or hint is typing.Any:
        return _generic(v)
    if hint == Dim:
        return _to_dim(v)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _convert_union(v, args)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(v.text if isinstance(v, _Ident) else v)
    if hint is bool or hint is str:
        if not isinstance(v, hint):
            raise ValueError(f"expected a {hint.__name__}, got {v!r}")
        return v
    if hint is int:
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"expected an int, got {v!r}")
        return v
    if hint is float:
        return _to_float(v)
    if hint is tuple or origin is tuple:
        return _convert_tuple(v, args)
    return _generic(v)


def _convert_union(v, args):
    if v is None and type(None) in args:
        return None
    rest = [a for a in args if a is not type(None)]
    if sympy.Expr in rest:
        return _to_dim(v)
    for arg in rest:
        try:
            return _convert(v, arg)
        except (ValueError, TypeError):
            continue
    raise ValueError(f"{v!r} fits none of {rest}")


def _convert_tuple(v, args):
    if not isinstance(v, tuple):
        raise ValueError(f"expected a tuple, got {v!r}")
    if not args:
        return _generic(v)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_convert(x, args[0]) for x in v)
    if len(args) != len(v):
        raise ValueError(f"expected {len(args)} items, got {len(v)}")
    return tuple(_convert(x, a) for x, a in zip(v, args))


@lru_cache(maxsize=None)
def _field_hints(spec_type: type) -> dict:
    try:
        return typing.get_type_hints(spec_type)
    except Exception:  # an annotation that does not resolve: fall back to the defaults' types
        return {f.name: type(f.default) for f in dataclasses.fields(spec_type)
                if isinstance(f.default, enum.Enum)}


def _build_spec(op: Op, bracket, keywords: dict, line: _Line):
    prim = REGISTRY.get(op)
    if prim is None:
        line.error(f"op {op.value!r} has no registered primitive")
    fields = dataclasses.fields(prim.spec_type)
    if bracket is not None:
        if not fields or fields[0].name in keywords:
            line.error(f"{op.value} takes no [{fields[0].name if fields else 'kind'}] here")
        keywords = {fields[0].name: bracket, **keywords}
    names = {f.name for f in fields}
    for key in keywords:
        if key not in names:
            line.error(f"{op.value} has no argument {key!r}")
    hints = _field_hints(prim.spec_type)
    return prim.spec_type(**{k: _convert(v, hints.get(k)) for k, v in keywords.items()})


def _origin(line: _Line) -> Origin:
    text = (line.comment or "").strip()
    if not text.startswith('"'):
        return parse_plain_origin(text)
    quoted = _Line(line.lineno, text)
    parts = []
    for i, sep in enumerate(("@", "(", ")")):
        tok = quoted.take("a quoted string")
        if tok.kind != "string":
            quoted.error("expected a quoted provenance string")
        parts.append(json.loads(tok.text))
        quoted.expect(sep)
    quoted.done()
    return Origin(*parts)


# -- statements -------------------------------------------------------------------------------

def _weight(line: _Line, kind: TensorKind) -> tuple[str, Weight]:
    """``%name: type [= values]`` after the kind word."""
    name = line.name()
    line.expect(":")
    ttype = line.type()
    value = None
    if line.at("="):
        line.take()
        literal = _literal(line.value())
        if not shape_is_static(ttype.shape):
            line.error("inline values need a static shape")
        value = torch.tensor(literal, dtype=ttype.dtype.torch)
        if value.numel() != product(ttype.shape):
            line.error(f"{value.numel()} values for type {ttype}")
        value = value.reshape(ttype.shape)
    line.done()
    return name, Weight(kind, ttype, value)


def _kind(line: _Line, default: TensorKind | None) -> TensorKind:
    """An optional kind word (``param``, ``buffer``, ``const``) before a weight's name."""
    tok = line.peek()
    if tok is not None and tok.kind == "ident":
        if tok.text not in _KINDS:
            line.error(f"unknown tensor kind {tok.text!r}")
        line.take()
        return _KINDS[tok.text]
    if default is None:
        line.error("expected a tensor kind")
    return default


def _node(line: _Line) -> Node:
    name = line.name()
    line.expect(":")
    ttype = line.type()
    line.expect("=")
    op_tok = line.take("an op")
    try:
        op = Op(op_tok.text)
    except ValueError:
        line.error(f"unknown op {op_tok.text!r}")
    bracket = None
    if line.at("["):
        line.take()
        bracket = line.value()
        line.expect("]")
    inputs, keywords = line.arguments()
    line.done()
    return Node(name, op, inputs, _build_spec(op, bracket, keywords, line), ttype, _origin(line))


class _Parser:
    """Recursive descent over lines: a TDAG or a block spans lines up to its ``}``."""

    def __init__(self, text: str):
        self.lines = []
        for i, raw in enumerate(text.split("\n")):
            line = _Line(i + 1, raw.rstrip("\r"))
            if line.tokens:
                self.lines.append(line)
        self.pos = 0

    def next(self, what: str) -> _Line:
        if self.pos == len(self.lines):
            last = self.lines[-1].lineno if self.lines else 0
            raise FileFormatError(f"line {last}: text ends where {what} was expected")
        self.pos += 1
        return self.lines[self.pos - 1]

    def program(self) -> Program:
        graphs, state, main = {}, {}, None
        while self.pos < len(self.lines):
            line = self.next("a section")
            with line.guard():
                if line.at("tdag"):
                    name, graph = self.tdag(line)
                    if name in graphs:
                        line.error(f"tdag {name!r} is defined twice")
                    graphs[name] = graph
                elif line.at("state"):
                    line.take()
                    name, weight = _weight(line, _kind(line, TensorKind.buffer))
                    if name in state:
                        line.error(f"state %{name} is defined twice")
                    state[name] = weight
                elif line.at("program"):
                    if main is not None:
                        line.error("a second program block")
                    line.take()
                    main = self.block(line.params(), line, "program")
                    self.close("}")
                else:
                    line.error("expected 'tdag', 'state' or 'program'")
        return _assemble(graphs, state, main)

    def close(self, text: str) -> None:
        line = self.next(repr(text))
        line.expect(text)
        line.done()

    def tdag(self, header: _Line) -> tuple[str, TDAG]:
        header.expect("tdag")
        name = header.ident()
        inputs = header.params()
        header.expect("{")
        header.done()
        weights, nodes = {}, []
        while True:
            line = self.next(f"the end of tdag {name}")
            with line.guard():
                tok = line.peek()
                if tok.kind == "ident" and tok.text in _KINDS:
                    wname, weight = _weight(line, _kind(line, None))
                    if wname in weights:
                        line.error(f"weight %{wname} is defined twice")
                    weights[wname] = weight
                elif tok.kind == "name":
                    nodes.append(_node(line))
                elif line.at("return"):
                    line.take()
                    outputs = line.names()
                    self.close("}")
                    return name, TDAG(inputs, weights, nodes, outputs)
                else:
                    line.error("expected a weight, a node or 'return'")

    def block(self, inputs: tuple, header: _Line, what: str) -> Block:
        """Steps up to ``return``; the caller reads the closing line."""
        header.expect("{")
        header.done()
        steps = []
        while True:
            line = self.next(f"'return' of the {what} block")
            with line.guard():
                if line.at("return"):
                    line.take()
                    return Block(inputs, tuple(steps), line.names())
                steps.append(self.step(line))

    def step(self, line: _Line):
        outputs = []
        while (tok := line.peek()) is not None and tok.kind == "name":
            outputs.append(line.name())
            if not line.at("="):
                line.expect(",")
        if outputs:
            line.expect("=")
        if line.at("call"):
            line.take()
            graph = line.ident()
            inputs, keywords = line.arguments()
            if keywords:
                line.error("call takes no keyword arguments")
            line.done()
            return Call(graph, inputs, tuple(outputs))
        if line.at("if"):
            return self.if_(line, tuple(outputs))
        if line.at("loop"):
            return self.loop(line, tuple(outputs))
        line.error("expected 'call', 'if', 'loop' or 'return'")

    def if_(self, line: _Line, outputs: tuple) -> If:
        line.take()
        inputs, keywords = line.arguments()
        cond = _keywords(line, keywords, {"cond"}).get("cond")
        if not isinstance(cond, _Ref):
            line.error("if needs cond=%name")
        line.expect("then")
        then_branch = self.block(line.params(), line, "then")
        middle = self.next("'} else(...) {'")
        with middle.guard():
            middle.expect("}")
            middle.expect("else")
            else_branch = self.block(middle.params(), middle, "else")
        self.close("}")
        return If(cond.name, inputs, then_branch, else_branch, outputs)

    def loop(self, line: _Line, outputs: tuple) -> Loop:
        line.take()
        inputs, keywords = line.arguments()
        keywords = _keywords(line, keywords, {"count", "cond", "scanned"})
        cond = keywords.get("cond")
        if cond is not None and not isinstance(cond, _Ref):
            line.error("loop cond must be a %name")
        scanned = keywords.get("scanned", 0)
        if not isinstance(scanned, int) or isinstance(scanned, bool):
            line.error("loop scanned must be an int")
        count = keywords.get("count")
        count = None if count is None else _to_dim(count)
        line.expect("body")
        body = self.block(line.params(), line, "loop body")
        self.close("}")
        return Loop(inputs, body, outputs, count, cond.name if cond else None, scanned)


def _keywords(line: _Line, keywords: dict, allowed: set) -> dict:
    for key in keywords:
        if key not in allowed:
            line.error(f"unknown argument {key!r}")
    return keywords


def _assemble(graphs: dict, state: dict, main: Block | None) -> Program:
    if main is not None:
        return Program(graphs, main, state)
    if len(graphs) != 1:
        raise FileFormatError("the text holds no 'program' block and "
                              f"{len(graphs)} tdags; a lone tdag needs no program block")
    name, graph = next(iter(graphs.items()))
    return Program.from_tdag(graph, name).replace(state=state)


def parse(text: str) -> Program:
    """Parse a Program (or a single ``tdag`` section) from its text form."""
    if not isinstance(text, str):
        raise FileFormatError(f"parse() takes text (str), got {type(text).__name__}")
    return _Parser(text).program()
