"""The one op-table class every front end uses: a key (an ONNX op type, an ATen op, a JAX
primitive) to the function that converts it.

A key is registered once: a second registration is refused with both files named, as
torch.library refuses a second kernel for the same key. Each entry remembers the file that
registered it, so a reader (or a test) can ask where an op's mapping lives, and the table
answers which ops it maps, sorted, for docs and sweeps.

>>> table = Registry("example")
>>> @table.register("Sub", "Minus")
... def sub(ctx, a, b):
...     return a - b
>>> table.add("Add", lambda ctx, a, b: a + b)
>>> table.keys(), "Sub" in table, len(table)
(['Sub', 'Minus', 'Add'], True, 3)
>>> table.sorted()
['Add', 'Minus', 'Sub']
>>> table.add("Sub", sub)
Traceback (most recent call last):
...
tdag.canonicalize.common.registry.DuplicateEntryError: example: 'Sub' is registered twice: ...
>>> from tdag.canonicalize.onnx.ops.table import OPS
>>> OPS.where("Add")
'tdag/canonicalize/onnx/ops/elementwise.py'
"""
from __future__ import annotations

import contextlib
import pathlib
import sys
from typing import Callable, Iterator

_ROOT = pathlib.Path(__file__).resolve().parents[3]  # the folder that holds tdag/


class DuplicateEntryError(ValueError):
    """A key registered twice in one table (a programming error, found at import time)."""


class Registry:
    """A table from op keys to entries (functions), each with the file that registered it."""

    def __init__(self, name: str):
        self.name = name
        self._entries: dict[str, Callable] = {}
        self._files: dict[str, str] = {}

    # -- registration ------------------------------------------------------------------------

    def register(self, *keys: str) -> Callable[[Callable], Callable]:
        """Decorator: the function is the entry of every key in ``keys``."""
        file = _caller_file()

        def deco(fn: Callable) -> Callable:
            for key in keys:
                self._put(key, fn, file)
            return fn
        return deco

    def add(self, key: str, fn: Callable) -> None:
        """Register ``fn`` (an entry a factory built) under ``key``."""
        self._put(key, fn, _caller_file())

    def _put(self, key: str, fn: Callable, file: str) -> None:
        if key in self._entries:
            raise DuplicateEntryError(f"{self.name}: {key!r} is registered twice: by "
                                      f"{self._files[key]} and by {file}")
        self._entries[key] = fn
        self._files[key] = file

    def __setitem__(self, key, value):
        raise TypeError(f"{self.name}: register entries with .register(...) or .add(key, fn), "
                        "which refuse a duplicate and remember the file")

    @contextlib.contextmanager
    def replaced(self, key: str, fn: Callable):
        """For tests: ``fn`` stands in for ``key``'s entry inside the ``with`` block."""
        old = self._entries[key]
        self._entries[key] = fn
        try:
            yield fn
        finally:
            self._entries[key] = old

    # -- queries -----------------------------------------------------------------------------

    def where(self, key: str) -> str:
        """The file that registered ``key``, relative to the repository root."""
        return self._files[key]

    def keys(self) -> list[str]:
        """The keys in registration order."""
        return list(self._entries)

    def sorted(self) -> list[str]:
        """The keys sorted: the table's listing for docs and sweeps."""
        return sorted(self._entries)

    def items(self) -> list[tuple[str, Callable]]:
        return list(self._entries.items())

    def get(self, key: str, default=None):
        return self._entries.get(key, default)

    def __getitem__(self, key: str) -> Callable:
        return self._entries[key]

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.name!r}, {len(self)} entries)"


def _caller_file() -> str:
    """The file of the code that called the Registry method calling this one, relative to the
    repository root where it lies inside it (``tdag/canonicalize/onnx/ops/elementwise.py``)."""
    path = pathlib.Path(sys._getframe(2).f_code.co_filename).resolve()
    try:
        return path.relative_to(_ROOT).as_posix()
    except ValueError:
        return path.as_posix()
