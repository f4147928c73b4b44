"""Symbolic dimensions.

A dimension is a plain ``int`` when it is known, or a sympy expression over positive integer
symbols (``b``, ``3*b``, ``s - 1``) when it is not. Keeping static dims as ints means a model
with no symbols never touches sympy on its hot paths.
"""
from __future__ import annotations

import math
import re
import typing
from dataclasses import dataclass
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
    if a == b:  # the same expression: sympy's expansion of a - b only for different forms
        return True
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


# -- parsing: a bounded grammar, so that reading a file never evaluates code nor runs long --
#
#   expr  := term (("+" | "-") term)*
#   term  := unary (("*" | "/" | "//") unary)*
#   unary := "-" unary | power
#   power := atom ("**" INT)?           INT <= MAX_EXPONENT, atom not itself a power
#   atom  := INT | NAME | "(" expr ")" | FUNC "(" expr ("," expr)* ")"
#
# sympy evaluates 9**9**9 and expands (a+b+c+d+e)**64 eagerly and would never return, and its
# Mod seeks common factors of sums (minutes for two sums of 60 terms), so each node carries
# bounds on its expanded terms and the bits of its numbers, checked before sympy builds it,
# and one dim may ask sympy for only so much work. A model's dims sit far inside all of them.

MAX_DIM = 2**62         # a static size is below this: the sum of two sizes still fits int64
MAX_LITERAL = 2**63     # an integer in a dim expression is below this (int64)
MAX_EXPONENT = 64
MAX_DIM_TEXT = 10_000   # characters of one dim expression, as written and as printed
MAX_DIM_DEPTH = 32      # nested parentheses, calls and unary minuses
_MAX_TERMS = 128        # terms of a node's expansion (a model's dims have a handful)
_MAX_WORK = 256         # terms multiplied out, divided or compared (Max, Mod) in one dim
_MAX_MOD_TERMS = 16     # terms of a Mod's dividend times those of its divisor
_MAX_BITS = 4096        # bits of any number while it is built

_TOKEN = re.compile(r"\s*(?:([0-9]+)|([A-Za-z_][A-Za-z0-9_]*)|(//|\*\*|[-+*/(),]))")
# name: (function, fewest arguments, most arguments)
_FUNCTIONS = {"floor": (sympy.floor, 1, 1), "ceiling": (sympy.ceiling, 1, 1),
              "Max": (sympy.Max, 1, 16), "Min": (sympy.Min, 1, 16), "Mod": (sympy.Mod, 2, 2)}


def parse_dim(text: str) -> Dim:
    """Parse ``3*b``, ``floor(s/2) + 1`` and the like, as printed by ``format_dim``.

    Raises ShapeError, naming the expression, for text outside the bounded grammar above.

    >>> parse_dim("floor(s/2) + 1")
    floor(s/2) + 1
    >>> parse_dim("9**9**9")
    Traceback (most recent call last):
    tdag.errors.ShapeError: dimension '9**9**9': a power's exponent must be an integer from 0 \
to 64, not another power
    """
    if len(text) > MAX_DIM_TEXT:
        raise ShapeError(f"dimension {text[:40]!r}...: longer than {MAX_DIM_TEXT} characters")
    parser = _DimParser(_tokenize(text), text)
    value = parser.expr().value
    if parser.pos != len(parser.tokens):
        parser.fail("unexpected " + repr(parser.peek()))
    return parser.finish(as_dim(value))


def _tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ShapeError(f"dimension {text!r}: unexpected {text[pos:pos + 10]!r}")
        tokens.append(m.group(m.lastindex))
        pos = m.end()
    return tokens


@dataclass(frozen=True, slots=True)
class _Sized:
    """A parsed node: its value and bounds on its expansion, known before sympy builds it."""
    value: sympy.Expr
    terms: int           # terms of the expanded value
    bits: int            # bits of any number in it
    power: bool = False  # written as ``a**n``: a power of it would be a tower


class _DimParser:
    def __init__(self, tokens: list[str], text: str):
        self.tokens, self.text, self.pos, self.depth, self.work = tokens, text, 0, 0, 0

    def fail(self, why: str) -> typing.NoReturn:
        raise ShapeError(f"dimension {self.text!r}: {why}")

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected=None):
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            self.fail(f"expected {expected or 'more'!r}, found {tok or 'the end'!r}")
        self.pos += 1
        return tok

    def make(self, build, terms: int, bits: int, work: int = 0, power: bool = False) -> _Sized:
        """Check the bounds, then let sympy build the node. ``work``: the terms sympy handles
        beyond a sum's (a product's or a power's expansion, a function's arguments)."""
        self.work += work
        if terms > _MAX_TERMS:
            self.fail(f"expands to more than {_MAX_TERMS} terms")
        if self.work > _MAX_WORK:
            self.fail(f"needs sympy to handle more than {_MAX_WORK} terms")
        if bits > _MAX_BITS:
            self.fail(f"holds a number of more than {_MAX_BITS} bits")
        try:
            return _Sized(build(), terms, bits, power)
        except (ArithmeticError, TypeError, ValueError) as exc:  # Mod(b, 0), Max(b, 0/0)
            self.fail(f"{type(exc).__name__}: {exc}")

    def nested(self, parse):
        self.depth += 1
        if self.depth > MAX_DIM_DEPTH:
            self.fail(f"nested deeper than {MAX_DIM_DEPTH}")
        try:
            return parse()
        finally:
            self.depth -= 1

    def finish(self, dim: Dim) -> Dim:
        """The parsed dim: a finite integer or expression whose numbers fit int64, and whose
        printed (expanded) form parses again."""
        if isinstance(dim, int):
            if not -MAX_LITERAL <= dim < MAX_LITERAL:
                self.fail(f"{dim} does not fit int64")
            return dim
        if dim.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
            self.fail("is not finite")
        if not dim.free_symbols:
            self.fail(f"is {dim}, not an integer")
        for num in dim.atoms(sympy.Rational):
            if abs(num.p) >= MAX_LITERAL or num.q >= MAX_LITERAL:
                self.fail(f"holds {num}, which does not fit int64")
        if len(format_dim(dim)) > MAX_DIM_TEXT:
            self.fail(f"expands to more than {MAX_DIM_TEXT} characters")
        return dim

    def expr(self) -> _Sized:
        left = self.term()
        while self.peek() in ("+", "-"):
            op, right = self.take(), self.term()
            a, b = left.value, right.value
            left = self.make(lambda: a + b if op == "+" else a - b,
                             left.terms + right.terms, max(left.bits, right.bits) + 1)
        return left

    def term(self) -> _Sized:
        left = self.unary()
        while self.peek() in ("*", "/", "//"):
            op, right = self.take(), self.unary()
            a, b = left.value, right.value
            bits = left.bits + right.bits + min(left.terms, right.terms).bit_length()
            if op == "*":
                terms = left.terms * right.terms
                left = self.make(lambda: a * b, terms, bits, terms)
                continue
            if b == 0:
                self.fail("divides by zero")
            work = left.terms + right.terms
            if op == "/":
                left = self.make(lambda: a / b, left.terms, bits, work)
            else:
                left = self.make(lambda: sympy.floor(a / b), 1, bits, work)
        return left

    def unary(self) -> _Sized:
        if self.peek() != "-":
            return self.power()
        self.take()
        inner = self.nested(self.unary)
        return _Sized(-inner.value, inner.terms, inner.bits)

    def power(self) -> _Sized:
        base = self.atom()
        if self.peek() != "**":
            return base
        self.take()
        tok = self.take()
        n = int(tok) if tok.isdigit() and len(tok) <= 2 else None
        if n is None or n > MAX_EXPONENT or self.peek() == "**" or base.power:
            self.fail(f"a power's exponent must be an integer from 0 to {MAX_EXPONENT}, "
                      "not another power")
        terms = math.comb(n + base.terms - 1, base.terms - 1)  # monomials of degree n
        bits = n * (base.bits + base.terms.bit_length())
        return self.make(lambda: base.value ** n, terms, bits, terms, power=True)

    def atom(self) -> _Sized:
        tok = self.take()
        if tok.isdigit():
            value = int(tok) if len(tok) <= 19 else MAX_LITERAL
            if value >= MAX_LITERAL:
                self.fail(f"the integer {tok[:25]} does not fit int64")
            return _Sized(sympy.Integer(value), 1, value.bit_length())
        if tok == "(":
            inner = self.nested(self.expr)
            self.take(")")
            return inner
        if tok in _FUNCTIONS and self.peek() == "(":
            return self.nested(lambda: self.call(tok))
        if _NAME.match(tok):
            return _Sized(symbol(tok), 1, 1)
        self.fail(f"unexpected {tok!r}")

    def call(self, name: str) -> _Sized:
        fn, fewest, most = _FUNCTIONS[name]
        self.take("(")
        args = [self.expr()]
        while self.peek() == ",":
            self.take()
            args.append(self.expr())
        self.take(")")
        if not fewest <= len(args) <= most:
            self.fail(f"{name} takes {fewest} to {most} arguments, not {len(args)}")
        values = [a.value for a in args]
        work = len(args) * sum(a.terms for a in args)  # Max and Min compare arguments pairwise
        if fn is sympy.Mod:  # sympy's Mod seeks common factors: costly past a few terms
            work = 4 * args[0].terms * args[1].terms
            if work > 4 * _MAX_MOD_TERMS:
                self.fail(f"Mod takes at most {_MAX_MOD_TERMS} terms (dividend times divisor)")
        return self.make(lambda: fn(*values), 1, max(a.bits for a in args) + 1, work)
