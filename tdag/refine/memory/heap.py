"""The storages a run holds, counted by reference as CPython frees them.

A storage is freed when its last reference goes: a local of the generated code, a list entry,
a module buffer, a caller's argument or a view that shares it. ``Tally`` keeps the running
total as a sum of distinct byte expressions, so a program with symbolic sizes costs one
dictionary update per allocation, not a growing sympy sum.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import sympy

from tdag.ir.symbols import Dim, evaluate


@dataclass(frozen=True, slots=True)
class Storage:
    """One allocation: its bytes, its kind and what made it."""

    bytes: Dim
    kind: str
    name: str
    node: str = ""
    scope: str = ""
    graph: str = ""


class Tally:
    """A sum of byte expressions: ints add up directly, symbolic terms by count."""

    __slots__ = ("const", "terms")

    def __init__(self, const: int = 0, terms: dict | None = None):
        self.const, self.terms = const, Counter(terms or {})

    def add(self, value: Dim, sign: int = 1) -> None:
        if isinstance(value, int):
            self.const += sign * value
        else:
            self.terms[value] += sign
            if not self.terms[value]:
                del self.terms[value]

    def copy(self) -> "Tally":
        return Tally(self.const, self.terms)

    def expr(self) -> Dim:
        if not self.terms:
            return self.const
        return sympy.expand(self.const + sum(k * v for v, k in self.terms.items()))

    def at(self, sizes: dict) -> int:
        """The total at concrete sizes (every symbol bound)."""
        return self.const + sum(count * evaluate(value, sizes)
                                for value, count in self.terms.items())


class Heap:
    """Storages by id with their reference counts; the running total of the live ones."""

    def __init__(self):
        self.storages: list[Storage] = []
        self.refs: Counter = Counter()
        self.total = Tally()

    def new(self, storage: Storage) -> int:
        self.storages.append(storage)
        sid = len(self.storages) - 1
        self.total.add(storage.bytes)
        return sid

    def hold(self, sid: int) -> int:
        self.refs[sid] += 1
        return sid

    def drop(self, sid: int) -> None:
        self.refs[sid] -= 1
        if self.refs[sid] == 0:
            del self.refs[sid]
            self.total.add(self.storages[sid].bytes, -1)

    def live(self) -> list[int]:
        return sorted(self.refs)

    def copy(self) -> "Heap":
        other = Heap()
        other.storages, other.refs = list(self.storages), Counter(self.refs)
        other.total = self.total.copy()
        return other


__all__ = ["Heap", "Storage", "Tally"]
