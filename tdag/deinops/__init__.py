"""The primitive ops: importing this package registers every primitive."""
from tdag.deinops import elementwise, indexing, movement, reduce  # noqa: F401  (registration)
from tdag.deinops.primitive import REGISTRY, Cost, NoSpec, Primitive
from tdag.ir.op import Family

# kernels (Family.KERNEL) also live in REGISTRY once tdag.lower is imported; they are
# placeholders for fused framework calls, not primitives
PRIMITIVES = tuple(op for op in REGISTRY if op not in Family.KERNEL)

__all__ = ["PRIMITIVES", "REGISTRY", "Cost", "NoSpec", "Primitive"]
