"""Fresh, collision-free names: the one mechanism for every place that mints names (the
Builder of ``tdag.ops``, graph rewrites, strip/add batch, the front ends, the torch code
generator, the ONNX writer).

A ``FreshNames`` knows the names taken and hands out a new one per hint, in one of two
schemes, chosen by its ``pattern``:

- suffixed (no pattern, the default): the hint itself, then ``hint_1``, ``hint_2`` ... (a
  counter per hint): a name keeps its source's spelling wherever that is free;
- counted (a pattern such as ``"{hint}{n}"``): every name carries one counter shared by all
  hints, skipping the names taken, so names say in which order they were made (``c0``,
  ``1``, ``%7_l3``).

>>> names = FreshNames({"x"})
>>> names("x"), names("x"), names("y")
('x_1', 'x_2', 'y')
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
    identifiers); the default keeps it as it is.
    """

    def __init__(self, taken: Iterable[str] = (), sanitize: Callable[[str], str] = str,
                 pattern: str | None = None):
        self.taken = set(taken)
        self.sanitize = sanitize
        self.pattern = pattern
        self.counters: dict[str, int] = {}  # suffixed: the last suffix per base
        self.count = 0                      # counted: the next number

    def fresh(self, hint: str = "", *, avoid: Container[str] = (), take: bool = True) -> str:
        """A name for ``hint`` that is neither taken nor in ``avoid``. It is taken unless
        ``take`` is False: then the caller claims it later (``claim``), and a counted
        scheme never hands it out again anyway."""
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
        name = base
        while name in self.taken or name in avoid:
            self.counters[base] = self.counters.get(base, 0) + 1
            name = f"{base}_{self.counters[base]}"
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
