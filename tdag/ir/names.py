"""Fresh, collision-free names: one mechanism for every place that mints names (graph
rewrites, the ONNX importer, the torch code generator, the ONNX writer)."""
from __future__ import annotations

from typing import Callable, Iterable


class FreshNames:
    """Hands out names not yet taken: ``base``, then ``base_1``, ``base_2`` ...

    ``sanitize`` first maps a hint to the target's naming rules (tdag names, Python
    identifiers); the default keeps it as it is.
    """

    def __init__(self, taken: Iterable[str] = (), sanitize: Callable[[str], str] = str):
        self.taken = set(taken)
        self.sanitize = sanitize
        self.counters: dict[str, int] = {}

    def fresh(self, hint: str) -> str:
        base = self.sanitize(hint)
        name = base
        while name in self.taken:
            self.counters[base] = self.counters.get(base, 0) + 1
            name = f"{base}_{self.counters[base]}"
        self.taken.add(name)
        return name

    __call__ = fresh


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
