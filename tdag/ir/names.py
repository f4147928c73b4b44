"""Fresh, collision-free names: the one mechanism for every place that mints names (the
Builder of ``tdag.ops``, graph rewrites, strip/add batch, the front ends, the torch code
generator, the ONNX writer).

A ``FreshNames`` knows the names taken and hands out a new one per hint, in one of two
schemes, chosen by its ``pattern``:

- suffixed (no pattern, the default): the hint itself, then ``hint_1``, ``hint_2`` ... (a
  counter per hint): a name keeps its source's spelling wherever that is free. ``variant``
  spells the names tried after the hint where a call site has always spelled them otherwise
  (``x2``, ``x_b_b``, ``_x``);
- counted (a pattern such as ``"{hint}{n}"``): every name carries one counter shared by all
  hints, skipping the names taken, so names say in which order they were made (``c0``,
  ``1``, ``%7_l3``).

>>> names = FreshNames({"x"})
>>> names("x"), names("x"), names("y")
('x_1', 'x_2', 'y')
>>> FreshNames({"x"}, variant=lambda base, k: "_" * k + base)("x")
'_x'
>>> counted = FreshNames({"c1"}, pattern="{hint}{n}")
>>> counted("c"), counted("c"), counted("v")
('c0', 'c2', 'v3')
"""
from __future__ import annotations

from typing import Callable, Container, Iterable


class FreshNames:
    """Hands out names not yet taken, suffixed (``base``, ``base_1`` ...) or counted by
    ``pattern`` (a format string of ``{hint}`` and ``{n}``).

    ``sanitize`` first maps a hint to the target's naming rules (tdag names, Python
    identifiers); the default keeps it as it is. ``variant(base, k)`` is the k-th name the
    suffixed scheme tries after ``base`` itself (k = 1, 2 ...; ``base_k`` by default).
    """

    def __init__(self, taken: Iterable[str] = (), sanitize: Callable[[str], str] = str,
                 pattern: str | None = None,
                 variant: Callable[[str, int], str] = lambda base, k: f"{base}_{k}"):
        self.taken = set(taken)
        self.sanitize = sanitize
        self.pattern = pattern
        self.variant = variant
        self.counters: dict[str, int] = {}  # suffixed: the last k handed out per base
        self.count = 0                      # counted: the next number

    def fresh(self, hint: str = "", *, avoid: Container[str] = (), take: bool = True) -> str:
        """A name for ``hint`` that is neither taken nor in ``avoid``. It is taken unless
        ``take`` is False: then the caller claims it later (``claim``); a counted scheme
        never hands it out again anyway, a suffixed one does until it is taken or avoided
        (``avoid`` a live container, such as the dict the names go into)."""
        base = self.sanitize(hint)
        name = self._suffixed(base, avoid) if self.pattern is None else \
            self._counted(base, avoid)
        if take:
            self.taken.add(name)
        return name

    __call__ = fresh

    def claim(self, name: str) -> bool:
        """Take ``name`` as it is; False where it was taken already."""
        if name in self.taken:
            return False
        self.taken.add(name)
        return True

    def _suffixed(self, base: str, avoid: Container[str]) -> str:
        if base not in self.taken and base not in avoid:
            return base
        # the first free variant: those before the last one handed out were taken or
        # avoided then (names are only added), that one itself may be free (``take=False``)
        k = self.counters.get(base, 1)
        while (name := self.variant(base, k)) in self.taken or name in avoid:
            k += 1
        self.counters[base] = k
        return name

    def _counted(self, base: str, avoid: Container[str]) -> str:
        while True:
            name = self.pattern.format(hint=base, n=self.count)
            self.count += 1
            if name not in self.taken and name not in avoid:
                return name


def literal(text: str) -> str:
    """``text`` as a part of a pattern, its braces escaped (a Builder's name prefix)."""
    return text.replace("{", "{{").replace("}", "}}")


class NameMap:
    """A stable map from source names to fresh ones: the same source name always gets the
    same result, and two source names never share one."""

    def __init__(self, taken: Iterable[str] = (), sanitize: Callable[[str], str] = str):
        self.minted = FreshNames(taken, sanitize)
        self.names: dict[str, str] = {}

    @property
    def taken(self) -> set[str]:
        return self.minted.taken

    def __call__(self, source: str) -> str:
        if source not in self.names:
            self.names[source] = self.minted.fresh(source)
        return self.names[source]

    def fresh(self, hint: str) -> str:
        """A new name that stands for no source name: ``hint`` numbered by how many names
        the map holds (``#`` is in no source name, so the key is new; the sanitizer of a
        target such as Python identifiers turns it into ``_``)."""
        return self(f"{hint}#{len(self.names)}")
