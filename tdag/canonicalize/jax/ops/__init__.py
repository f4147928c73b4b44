"""The table from JAX primitives to tdag, a family a file; importing this package fills
``table.OPS`` (jax/importer.py imports it): table.py (the registry, what an entry sees,
elementwise math), shape.py (movement), nn.py (contractions, reductions, windows),
index.py (gather, scatter, sorting) and fft.py (complex values and the FFT)."""
from tdag.canonicalize.jax.ops import fft, index, nn, shape  # noqa: F401
from tdag.canonicalize.jax.ops.table import OPS

__all__ = ["OPS"]
