"""The ATen op table, split by family; importing this package registers every entry."""
from tdag.canonicalize.aten import (contraction, creation, elementwise, indexing,  # noqa: F401
                                    losses, movement, nn, pool_indices, recurrent, reduce,
                                    resample, scatter, search, sorting)
from tdag.canonicalize.aten.registry import TABLE, Entry, key, lookup, supports

__all__ = ["TABLE", "Entry", "key", "lookup", "supports"]
