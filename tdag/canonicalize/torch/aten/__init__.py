"""The ATen op table, split by family; importing this package registers every entry."""
from tdag.canonicalize.torch.aten import (  # noqa: F401
                                    complex,
                                    contraction,
                                    creation,
                                    elementwise,
                                    experts,
                                    indexing,
                                    linalg,
                                    losses,
                                    masking,
                                    movement,
                                    nn,
                                    pool_indices,
                                    recurrent,
                                    reduce,
                                    resample,
                                    scatter,
                                    search,
                                    sorting,
                                    special,
)
from tdag.canonicalize.torch.aten.registry import TABLE, entry_for, key, supports

__all__ = ["TABLE", "entry_for", "key", "supports"]
