"""The table from JAX primitives to tdag, a family a file; importing this package fills
``table.OPS`` (jax/importer.py imports it): table.py (the registry, what an entry sees,
elementwise math), shape.py (movement), nn.py (contractions, reductions, windows) and
index.py (gather, scatter, sorting)."""
from tdag.canonicalize.jax.ops import index, nn, shape  # noqa: F401
from tdag.canonicalize.jax.ops.table import OPS

__all__ = ["OPS"]
