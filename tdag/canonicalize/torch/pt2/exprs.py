"""The restricted grammar of the code-like strings in a .pt2 graph: symbolic sizes and guards.

torch's deserializer hands every ``expr_str`` to ``sympy.sympify``, which *evaluates* the
string as Python with the builtins in scope (``open(...)`` in a size runs), and
``ExportedProgram.module()`` ``exec``s the ``guards_code`` strings. tdag checks each string
before torch sees it: ``ast.parse`` builds a syntax tree and runs nothing, and the tree must
use only what torch's printers write:

- a size (``sympy.srepr``): calls of the sympy and ``torch.utils._sympy`` constructors below,
  numbers, symbol names, ``+ - * / // %``, and ``**`` only with a small literal exponent;
- a guard (torch's Python printer): the same arithmetic with comparisons, ``and``/``or``/
  ``not``, ``math.floor``-style calls and reads of the inputs' sizes, ``L['x'].size()[0]``.

Both are bounded in length and depth, so a check costs time linear in the string; the bound
on exponents and shifts keeps sympy from building a huge integer out of a short string.

>>> check_size("Mul(Integer(2), Symbol('s0', integer=True, positive=True))") is None
True
>>> check_size("open('/tmp/x', 'w')")
"calls 'open', not one of the functions torch writes"
"""
from __future__ import annotations

import ast
import builtins
import re

MAX_CHARS = 20_000   # a size with a hundred terms is ~5,000 characters
MAX_DEPTH = 40       # nesting of calls and operators; torch's sizes nest a few levels
MAX_INT_DIGITS = 20  # sizes, strides and hints fit in 64 bits
MAX_EXPONENT = 64    # ``**``, Pow, shifts: a literal exponent past this is refused

# the constructors sympy.srepr writes for the sizes torch serializes
_SYMPY_CALLS = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Max", "Min", "Mod", "Abs",
    "floor", "ceiling", "Equality", "Unequality", "StrictLessThan", "LessThan",
    "StrictGreaterThan", "GreaterThan", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not",
    "Piecewise", "ExprCondPair",
})
# torch.utils._sympy.functions: the names torch's deserializer gives sympify (serialize.py)
TORCH_SYMPY_FUNCTIONS = frozenset({
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt",
    "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv",
    "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
    "RoundToInt", "RoundDecimal", "ToFloat", "Identity",
})
# torch's opaque functions print as undefined names, which sympify makes plain Functions
_OPAQUE = re.compile(r"(OpaqueUnaryFn_[a-z0-9]+|BitwiseFn_bitwise_(and|or|xor))")
_SIZE_CONSTANTS = frozenset({"true", "false", "oo", "zoo", "nan", "int_oo"})
# arguments that become an exponent or a shift: index of the argument in the call
_EXPONENT_ARG = {"Pow": 1, "PowByNatural": 1, "FloatPow": 1, "LShift": 1, "RShift": 1}

# what guards call (the namespace torch execs them in: math, torch, two helpers, builtins)
_GUARD_CALLS = frozenset({"abs", "max", "min", "round", "float", "int",
                          "IsNonOverlappingAndDenseIndicator",
                          "cast_symbool_to_symint_guardless"})
_GUARD_MATH = frozenset({"floor", "ceil", "trunc", "sqrt", "exp", "log", "log2", "isnan",
                         "cos", "cosh", "acos", "sin", "sinh", "asin", "tan", "tanh", "atan"})
_GUARD_MATH_CONSTANTS = frozenset({"inf", "nan", "pi", "e"})
_GUARD_TORCH = frozenset({"sym_float", "sym_int", "sym_max", "sym_min", "sym_not",
                          "sym_ite", "sym_sum", "sym_sqrt", "_sym_sqrt"})
_SIZE_METHODS = frozenset({"size", "stride", "storage_offset", "numel", "dim"})

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_FLOAT_TEXT = re.compile(r"[+-]?(\d+\.?\d*([eE][+-]?\d+)?|inf|nan)")
_SIZE_CHARS = re.compile(r"[A-Za-z0-9_ ().,+\-*/%'=]*")
_GUARD_CHARS = re.compile(r"[A-Za-z0-9_ ().,+\-*/%'=\[\]<>!&|^~]*")
_RESERVED = frozenset(dir(builtins)) | _SYMPY_CALLS | TORCH_SYMPY_FUNCTIONS | _SIZE_CONSTANTS

_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_GUARD_BINARY = _ARITHMETIC + (ast.BitAnd, ast.BitOr, ast.BitXor)
_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


class _Refused(Exception):
    """Why a string is not in the grammar (caught at the two entry points)."""


def check_size(text) -> str | None:
    """None when ``text`` is a symbolic expression torch could have written, else why not."""
    return _check(text, _SIZE_CHARS, _Size())


def check_guard(text) -> str | None:
    """None when ``text`` is a shape guard torch could have written, else why not."""
    return _check(text, _GUARD_CHARS, _Guard())


def _check(text, chars: re.Pattern, grammar: _Grammar) -> str | None:
    if not isinstance(text, str):
        return f"is a {type(text).__name__}, not a string"
    if len(text) > MAX_CHARS:
        return f"is {len(text)} characters long (at most {MAX_CHARS})"
    if not chars.fullmatch(text):
        bad = next(c for c in text if not chars.fullmatch(c))
        return f"holds the character {bad!r}"
    try:
        tree = ast.parse(text.strip(), mode="eval")
        grammar.visit(tree.body, 0)
    except SyntaxError as exc:
        return f"does not parse ({exc.msg})"
    except (_Refused, RecursionError, MemoryError) as exc:
        return str(exc) or "nests too deeply"
    return None


class _Grammar:
    """Walks a syntax tree; each node type it accepts has a ``_<Type>`` method."""

    def visit(self, node: ast.AST, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise _Refused(f"nests deeper than {MAX_DEPTH} levels")
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise _Refused(f"uses {_describe(node)}, which torch does not write there")
        method(node, depth + 1)

    def _Constant(self, node: ast.Constant, depth: int) -> None:
        value = node.value
        if isinstance(value, (bool, float)):
            return
        if isinstance(value, int):
            _check_int(value)
            return
        raise _Refused(f"holds the literal {value!r}")

    def _UnaryOp(self, node: ast.UnaryOp, depth: int) -> None:
        if not isinstance(node.op, self.unary):
            raise _Refused(f"uses {_describe(node)}")
        self.visit(node.operand, depth)

    def _BinOp(self, node: ast.BinOp, depth: int) -> None:
        if not isinstance(node.op, self.binary):
            raise _Refused(f"uses {_describe(node)}")
        self.visit(node.left, depth)
        if isinstance(node.op, ast.Pow):
            _check_exponent(node.right)
        self.visit(node.right, depth)

    def _args(self, node: ast.Call, depth: int) -> None:
        for arg in node.args:
            self.visit(arg, depth)


class _Size(_Grammar):
    """sympy.srepr of torch's sizes: ``Add(Symbol('s0', integer=True), Integer(1))``."""

    unary = (ast.USub, ast.UAdd)
    binary = _ARITHMETIC

    def _Name(self, node: ast.Name, depth: int) -> None:
        # a bare name is a symbol (``s0``) or a constant; sympify would resolve a builtin
        if node.id not in _SIZE_CONSTANTS and (node.id in _RESERVED or node.id.startswith("_")):
            raise _Refused(f"names {node.id!r}, which is not a symbol")

    def _Call(self, node: ast.Call, depth: int) -> None:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name is None:
            raise _Refused(f"calls {_describe(node.func)}, not a function torch writes")
        if name not in _SYMPY_CALLS and name not in TORCH_SYMPY_FUNCTIONS \
                and not _OPAQUE.fullmatch(name):
            raise _Refused(f"calls {name!r}, not one of the functions torch writes")
        if name in ("Symbol", "Float"):
            self._literal_call(node, name)
            return
        if node.keywords:
            raise _Refused(f"passes keywords to {name}")
        if name in _EXPONENT_ARG and len(node.args) > _EXPONENT_ARG[name]:
            _check_exponent(node.args[_EXPONENT_ARG[name]])
        self._args(node, depth)

    def _literal_call(self, node: ast.Call, name: str) -> None:
        """``Symbol('s0', integer=True)`` and ``Float('1.5', precision=53)``."""
        pattern = _IDENT if name == "Symbol" else _FLOAT_TEXT
        first = node.args[0] if len(node.args) == 1 else None
        text = first.value if isinstance(first, ast.Constant) else None
        if not isinstance(text, str) or not pattern.fullmatch(text):
            raise _Refused(f"{name} takes one literal, not {ast.unparse(node)[:80]!r}")
        if name == "Symbol" and text in _RESERVED:
            raise _Refused(f"names a symbol {text!r}, which is a function's name")
        for kw in node.keywords:
            value = kw.value.value if isinstance(kw.value, ast.Constant) else None
            if kw.arg is None or not kw.arg.isidentifier() or kw.arg.startswith("_") \
                    or not isinstance(value, (bool, int)) or abs(value) > 1024:
                raise _Refused(f"passes {ast.unparse(kw)[:80]!r} to {name}")


class _Guard(_Grammar):
    """torch's Python printer over input sizes: ``(L['x'].size()[0] // 2) <= 8``."""

    unary = (ast.USub, ast.UAdd, ast.Not, ast.Invert)
    binary = _GUARD_BINARY

    def _Compare(self, node: ast.Compare, depth: int) -> None:
        if not all(isinstance(op, _COMPARISONS) for op in node.ops):
            raise _Refused("compares with 'in' or 'is'")
        for operand in (node.left, *node.comparators):
            self.visit(operand, depth)

    def _BoolOp(self, node: ast.BoolOp, depth: int) -> None:
        for value in node.values:
            self.visit(value, depth)

    def _IfExp(self, node: ast.IfExp, depth: int) -> None:
        for part in (node.test, node.body, node.orelse):
            self.visit(part, depth)

    def _Name(self, node: ast.Name, depth: int) -> None:
        if node.id != "inf":
            raise _Refused(f"names {node.id!r}")

    def _Attribute(self, node: ast.Attribute, depth: int) -> None:
        if not (_is_name(node.value, "math") and node.attr in _GUARD_MATH_CONSTANTS):
            raise _Refused(f"reads {ast.unparse(node)[:80]!r}")

    def _Subscript(self, node: ast.Subscript, depth: int) -> None:
        """``L['x']``, ``L['args'][0]``, ``L['x'].size()[1]``: the inputs and their sizes."""
        key = node.slice.value if isinstance(node.slice, ast.Constant) else None
        plain_int = isinstance(key, int) and not isinstance(key, bool) and 0 <= key < 1 << 16
        if not (plain_int or isinstance(key, str) and _IDENT.fullmatch(key)):
            raise _Refused(f"indexes with {ast.unparse(node.slice)[:80]!r}")
        value = node.value
        if _is_name(value, "L"):  # the inputs, by name
            return
        if isinstance(value, ast.Subscript) \
                or isinstance(value, ast.Call) and _size_method(value) is not None:
            self.visit(value, depth)
            return
        raise _Refused(f"indexes {ast.unparse(value)[:80]!r}")

    def _Call(self, node: ast.Call, depth: int) -> None:
        func = node.func
        if node.keywords:
            raise _Refused(f"passes keywords in {ast.unparse(node)[:80]!r}")
        method = _size_method(node)
        if method is not None:
            if node.args or not isinstance(func.value, ast.Subscript):
                raise _Refused(f"calls {method} in {ast.unparse(node)[:80]!r}")
            self.visit(func.value, depth)
            return
        if not (isinstance(func, ast.Name) and func.id in _GUARD_CALLS
                or isinstance(func, ast.Attribute) and _is_name(func.value, "math")
                and func.attr in _GUARD_MATH
                or isinstance(func, ast.Attribute) and _is_name(func.value, "torch")
                and func.attr in _GUARD_TORCH):
            raise _Refused(f"calls {ast.unparse(func)[:80]!r}, not a function guards use")
        self._args(node, depth)


def _size_method(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in _SIZE_METHODS \
            and not _is_name(func.value, "math") and not _is_name(func.value, "torch"):
        return func.attr
    return None


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _check_int(value: int) -> None:
    if abs(value) >= 10 ** MAX_INT_DIGITS:
        raise _Refused(f"holds an integer of more than {MAX_INT_DIGITS} digits")


def _check_exponent(node: ast.AST) -> None:
    """An exponent or shift is a literal of at most MAX_EXPONENT: sympy evaluates
    ``Pow(Integer(2), Integer(10**9))`` into a number of a billion bits."""
    value = _literal(node)
    if value is None or abs(value) > MAX_EXPONENT:
        raise _Refused(f"raises to {ast.unparse(node)[:80]!r} (a literal of at most "
                       f"{MAX_EXPONENT} expected)")


def _literal(node: ast.AST) -> float | None:
    """The number an exponent stands for: ``2``, ``-1``, ``Integer(2)``, ``Rational(1, 2)``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _literal(node.operand)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return float(node.value) if abs(node.value) < 1e18 else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords \
            and node.func.id in ("Integer", "Rational") and 1 <= len(node.args) <= 2:
        values = [_literal(a) for a in node.args]
        if None in values or any(abs(v) > MAX_EXPONENT for v in values):
            return None
        return values[0] / values[1] if len(values) == 2 and values[1] else values[0]
    return None


def _describe(node: ast.AST) -> str:
    return f"{type(node).__name__.lower()} {ast.unparse(node)[:60]!r}"
