"""The lexer of the text form: one line's tokens, a cursor over them, and its values.

Values are read without evaluating anything: numbers, quoted strings, ``%names``, tuples and
lists, and bare words or dim expressions kept as text (``Ident``, ``Expr``) until the parser
knows, from a spec field's annotation, whether a word is an enum member, a dim or a float.
"""
from __future__ import annotations

import contextlib
import json
import re
import typing
from dataclasses import dataclass

from tdag.errors import FileFormatError, TdagError
from tdag.ir.graph import Value
from tdag.ir.symbols import MAX_DIM, MAX_LITERAL, Dim, parse_dim
from tdag.ir.types import DType, TensorType

_STRING = r'"(?:[^"\\\n]|\\.)*"'
_TOKEN = re.compile(rf"""
    (?P<ws>\s+)
  | (?P<comment>\#.*)
  | (?P<string>{_STRING})
  | (?P<name>%(?:[A-Za-z0-9_](?:[A-Za-z0-9_.:]*[A-Za-z0-9_])?|{_STRING}))
  | (?P<number>[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+|[0-9]+)
  | (?P<ident>[A-Za-z_](?:[A-Za-z0-9_.:]*[A-Za-z0-9_])?)
  | (?P<punct>//|\*\*|[-+*/()\[\]{{}},=:@])
""", re.X)
_ARITH = frozenset({"+", "-", "*", "/", "//", "**"})
_WORDS = {"True": True, "False": False, "None": None}
MAX_NESTING = 64  # of tuples and lists in a value: a const's rank, a spec's nested tuples


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # string | name | number | ident | punct
    text: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Ident:
    """A bare word in a value: an enum member, a dim symbol, inf or nan (the field decides)."""
    text: str


@dataclass(frozen=True, slots=True)
class Expr:
    """A dimension expression (``2*b``, ``floor(s/2)+1``), kept as text for parse_dim."""
    text: str


@dataclass(frozen=True, slots=True)
class Ref:
    """A ``%name`` used as a value (a controller's condition)."""
    name: str


def _decode_name(tok: _Tok) -> str:
    """``%x`` -> ``x``; ``%"odd name"`` -> ``odd name``."""
    return json.loads(tok.text[1:]) if tok.text[1] == '"' else tok.text[1:]


# -- one line ---------------------------------------------------------------------------------

class Line:
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
        # from None: the message says it all; a chained parser traceback would only distract
        raise FileFormatError(f"line {self.lineno}: {message}: {self.text.strip()!r}") from None

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
        return _decode_name(tok)

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
            dims.append(self._size())
            if not self.at("]"):
                self.expect(",")
        self.expect("]")
        return TensorType(tuple(dims), dtype)

    def _size(self) -> Dim:
        """One dim of a type: a static one is a size from 0 to MAX_DIM - 1. Never a tuple, so
        a leading ``(`` opens an expression: ``(b+1)**2``."""
        raw = self._atom()
        dim = to_dim(raw)
        if isinstance(dim, int) and not 0 <= dim < MAX_DIM:
            text = raw.text if isinstance(raw, (Ident, Expr)) else str(raw)
            self.error(f"dimension {text!r} is {dim}, not a size from 0 to 2**62 - 1")
        return dim

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

    def value(self, depth: int = 0):
        """A tuple ``(a, b)``, a list ``[a, b]`` or an atom (number, word, dim expression)."""
        if self.at("(") or self.at("["):
            if depth == MAX_NESTING:
                self.error(f"values nested deeper than {MAX_NESTING}")
            close = ")" if self.take().text == "(" else "]"
            items, trailing = [], False
            while not self.at(close):
                items.append(self.value(depth + 1))
                trailing = self.at(",")
                if not self.at(close):
                    self.expect(",")
            self.expect(close)
            if close == ")" and len(items) == 1 and not trailing:
                self.error("a one-element tuple needs a trailing comma: (x,)")
            return tuple(items) if close == ")" else items
        return self._atom()

    def _atom(self):
        """Tokens up to a ``,`` ``)`` or ``]`` outside parentheses (``Max(b,2)`` is one atom)."""
        start, depth = self.pos, 0
        while (tok := self.peek()) is not None:
            if tok.kind == "punct":
                if tok.text == "(":
                    depth += 1
                elif tok.text == ")":
                    if depth == 0:
                        break
                    depth -= 1
                elif tok.text not in _ARITH and not (tok.text == "," and depth):
                    if depth:
                        self.error(f"unexpected {tok.text!r} inside parentheses")
                    break
            self.pos += 1
        toks = self.tokens[start:self.pos]
        if not toks:
            self.error("expected a value")
        return self._classify(toks)

    def _classify(self, toks: list[_Tok]):
        first = toks[0]
        if len(toks) == 1:
            if first.kind == "number":
                return self._number(first.text, negative=False)
            if first.kind == "string":
                return json.loads(first.text)
            if first.kind == "name":
                return Ref(_decode_name(first))
            if first.kind == "ident":
                return _WORDS.get(first.text, Ident(first.text))
        if len(toks) == 2 and first.text == "-" and toks[1].kind == "number":
            return self._number(toks[1].text, negative=True)
        if any(t.kind in ("string", "name") for t in toks):
            self.error("expected a value")
        return Expr(self.text[first.start:toks[-1].end])

    def _number(self, text: str, negative: bool):
        """A float, or an int in int64's or uint64's range (a const of int64 min prints as
        -2**63, one of uint64 max as 2**64 - 1)."""
        if any(c in text for c in ".eE"):
            return -float(text) if negative else float(text)
        value = int(text) if len(text) <= 20 else 2 * MAX_LITERAL
        value = -value if negative else value
        if not -MAX_LITERAL <= value < 2 * MAX_LITERAL:
            self.error(f"the integer {'-' * negative}{text[:25]} fits neither int64 nor "
                       "uint64")
        return value


# -- converting parsed values to typed ones ---------------------------------------------------

def to_dim(v) -> Dim:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, (Ident, Expr)):
        return parse_dim(v.text)
    raise ValueError(f"not a dimension: {v!r}")


def to_float(v) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v  # an int stays an int: the field held exactly what was printed
    if isinstance(v, (Ident, Expr)) and v.text.lstrip("-") in ("inf", "nan"):
        return float(v.text)
    raise ValueError(f"not a number: {v!r}")
