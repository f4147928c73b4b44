"""Symbolic dimensions from torch.export: torch's ``s0``/``s77`` become readable tdag symbols.

torch.export records a dynamic size as a sympy expression over its own symbols, with its own
functions (``FloorDiv``, ``ModularIndexing``, ...). tdag dims are plain sympy over named
positive-integer symbols with ``floor``/``ceiling``/``Mod``/``Max``/``Min`` only, so that the
printer and parser stay small; this module translates one into the other.
"""
from __future__ import annotations

import re

import sympy
import torch
import torch.utils._sympy.functions as tsf

from tdag.errors import UnsupportedOpError
from tdag.ir.names import FreshNames
from tdag.ir.symbols import Dim, as_dim, symbol

BATCH = "batch"  # the name of the symbol dynamic_batch=True introduces

# torch's integer functions -> plain sympy; each lambda takes the already-translated args
_FUNCTIONS = {
    tsf.FloorDiv: lambda a, b: sympy.floor(a / b),
    tsf.CleanDiv: lambda a, b: a / b,  # exact division: torch proved b divides a
    tsf.CeilDiv: lambda a, b: sympy.ceiling(a / b),
    tsf.IntTrueDiv: lambda a, b: a / b,
    tsf.ModularIndexing: lambda x, div, mod: sympy.Mod(sympy.floor(x / div), mod),
    tsf.Mod: sympy.Mod,
    tsf.PythonMod: sympy.Mod,
    tsf.FloorToInt: sympy.floor,
    tsf.CeilToInt: sympy.ceiling,
    tsf.TruncToInt: sympy.floor,  # sizes are non-negative, so trunc is floor
    tsf.Identity: lambda x: x,
    tsf.ToFloat: lambda x: x,
    tsf.PowByNatural: lambda a, b: a ** b,
    tsf.Max: sympy.Max,
    tsf.Min: sympy.Min,
    sympy.Max: sympy.Max,
    sympy.Min: sympy.Min,
    sympy.floor: sympy.floor,
    sympy.ceiling: sympy.ceiling,
    sympy.Mod: sympy.Mod,
}


def readable(name: str) -> str:
    """A valid dimension name from an arbitrary string (``x.0`` -> ``x_0``)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return name if re.match(r"[A-Za-z_]", name) else f"d_{name}"


class SymbolMap:
    """torch symbol name -> tdag symbol name; unnamed symbols are named after the input
    and axis where they first appear (``tokens_1``)."""

    def __init__(self):
        self.names: dict[str, str] = {}
        # tdag names: the readable one, then ``tokens2``, ``tokens3`` ...
        self.minted = FreshNames(sanitize=readable, variant=lambda base, k: f"{base}{k + 1}")

    def name(self, torch_symbol: sympy.Symbol, preferred: str) -> None:
        """Give ``torch_symbol`` the name ``preferred`` unless it already has one."""
        key = torch_symbol.name
        if key not in self.names:
            self.names[key] = self.minted.fresh(preferred)

    def adopt(self, torch_symbol: sympy.Symbol, name: str) -> None:
        """Map ``torch_symbol`` (an unbacked one: a size data decides) to the fresh tdag
        symbol ``name`` that the node computing it defined."""
        self.minted.claim(name)
        self.names[torch_symbol.name] = name

    def dim(self, value) -> Dim:
        """An int, SymInt or torch sympy expression as a tdag Dim."""
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            value = value.node.expr
        if isinstance(value, sympy.Basic):
            return as_dim(self._translate(value))
        return as_dim(value)

    def _translate(self, expr: sympy.Basic) -> sympy.Expr:
        if expr.is_Symbol:
            if expr.name not in self.names:
                self.name(expr, expr.name)
            return symbol(self.names[expr.name])
        if expr.is_Number:
            return sympy.Integer(int(expr)) if expr.is_integer else expr
        args = [self._translate(a) for a in expr.args]
        if isinstance(expr, (sympy.Add, sympy.Mul, sympy.Pow)):
            return expr.func(*args)
        for cls, fn in _FUNCTIONS.items():
            if type(expr) is cls or expr.func is cls:
                return fn(*args)
        raise UnsupportedOpError(f"symbolic size {expr} uses {type(expr).__name__}, which "
                                 "tdag dims cannot express")


def is_symbolic(value) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))
