"""Symbolic dimensions.

A dimension is a plain ``int`` when it is known, or a sympy expression over positive integer
symbols (``b``, ``3*b``, ``s - 1``) when it is not. Keeping static dims as ints means a model
with no symbols never touches sympy on its hot paths.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Mapping, Union

import sympy

from tdag.errors import ShapeError

Dim = Union[int, sympy.Expr]
Shape = tuple  # tuple[Dim, ...]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@lru_cache(maxsize=None)
def symbol(name: str) -> sympy.Symbol:
    """The symbol for a named dimension; dims are positive integers."""
    if not _NAME.match(name):
        raise ShapeError(f"invalid dimension name {name!r}: use letters, digits and _")
    return sympy.Symbol(name, integer=True, positive=True)


def as_dim(value) -> Dim:
    """Normalise an int, a name or a sympy expression into a Dim (ints stay ints)."""
    if isinstance(value, bool):
        raise ShapeError(f"a dimension cannot be a bool: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return symbol(value)
    if isinstance(value, sympy.Expr):
        value = sympy.expand(value)
        return int(value) if value.is_Integer else value
    if hasattr(value, "__index__"):
        return int(value)
    raise ShapeError(f"not a dimension: {value!r}")


def is_static(dim: Dim) -> bool:
    return isinstance(dim, int)


def shape_is_static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def dims_equal(a: Dim, b: Dim) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0


def shapes_equal(a, b) -> bool:
    return len(a) == len(b) and all(dims_equal(x, y) for x, y in zip(a, b))


def product(dims) -> Dim:
    result: Dim = 1
    for d in dims:
        result = as_dim(result * d)
    return result


def floordiv(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    return as_dim(sympy.floor(sympy.sympify(a) / b))


def free_symbols(dim: Dim) -> set[str]:
    return set() if isinstance(dim, int) else {s.name for s in dim.free_symbols}


def evaluate(dim: Dim, bindings: Mapping[str, int]) -> int:
    """The integer value of ``dim`` once every symbol in it is bound."""
    if isinstance(dim, int):
        return dim
    missing = free_symbols(dim) - set(bindings)
    if missing:
        raise ShapeError(f"dimension {format_dim(dim)} needs a value for {sorted(missing)}")
    value = dim.subs({symbol(k): v for k, v in bindings.items() if k in free_symbols(dim)})
    if not value.is_Integer:
        raise ShapeError(f"dimension {format_dim(dim)} is not an integer for {dict(bindings)}")
    return int(value)


def format_dim(dim: Dim) -> str:
    if isinstance(dim, int):
        return str(dim)
    return str(dim).replace(" ", "")


# -- parsing: a tiny recursive-descent parser, so that reading a file never evaluates code --

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|\*\*|[-+*/(),]))")
_FUNCTIONS = {"floor": sympy.floor, "ceiling": sympy.ceiling, "Max": sympy.Max,
              "Min": sympy.Min, "Mod": sympy.Mod}


def parse_dim(text: str) -> Dim:
    """Parse ``3*b``, ``floor(s/2) + 1`` and the like, as printed by ``format_dim``."""
    tokens = _tokenize(text)
    parser = _DimParser(tokens, text)
    value = parser.expr()
    if parser.pos != len(tokens):
        raise ShapeError(f"cannot parse dimension {text!r}")
    return as_dim(value)


def _tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ShapeError(f"cannot parse dimension {text!r}")
        tokens.append(m.group(m.lastindex))
        pos = m.end()
    return tokens


class _DimParser:
    def __init__(self, tokens: list[str], text: str):
        self.tokens, self.text, self.pos = tokens, text, 0

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected=None):
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise ShapeError(f"cannot parse dimension {self.text!r}")
        self.pos += 1
        return tok

    def expr(self):
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self):
        value = self.factor()
        while self.peek() in ("*", "/", "//"):
            op = self.take()
            rhs = self.factor()
            if op == "*":
                value = value * rhs
            else:
                value = value / rhs if op == "/" else sympy.floor(value / rhs)
        return value

    def factor(self):
        if self.peek() == "-":
            self.take()
            return -self.factor()
        base = self.atom()
        if self.peek() == "**":
            self.take()
            return base ** self.factor()
        return base

    def atom(self):
        tok = self.take()
        if tok.isdigit():
            return sympy.Integer(int(tok))
        if tok == "(":
            value = self.expr()
            self.take(")")
            return value
        if tok in _FUNCTIONS and self.peek() == "(":
            self.take("(")
            args = [self.expr()]
            while self.peek() == ",":
                self.take()
                args.append(self.expr())
            self.take(")")
            return _FUNCTIONS[tok](*args)
        if _NAME.match(tok):
            return symbol(tok)
        raise ShapeError(f"cannot parse dimension {self.text!r}")
