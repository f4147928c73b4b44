"""The primitive ops: importing this package registers every primitive."""
from tdag.deinops import elementwise, indexing, movement, reduce  # noqa: F401  (registration)
from tdag.deinops.primitive import REGISTRY, Cost, NoSpec, Primitive

PRIMITIVES = tuple(REGISTRY)

__all__ = ["PRIMITIVES", "REGISTRY", "Cost", "NoSpec", "Primitive"]
