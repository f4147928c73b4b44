"""The primitive ops: importing this package registers the record of every primitive.

The records of the kernels (lowering's placeholders) live in ``tdag.lower.kernels``;
``import tdag`` registers both."""
# the order of registration is the order of PRIMITIVES
from tdag.deinops import elementwise, movement, extent, indexing, reduce, runtime, windows  # noqa: F401,I001
from tdag.deinops import bitcast  # noqa: F401,I001  (after cast: PRIMITIVES keeps its order)
from tdag.deinops import scatter  # noqa: F401,I001
from tdag.deinops import scan  # noqa: F401,I001
from tdag.deinops import sort  # noqa: F401,I001
from tdag.deinops import fft  # noqa: F401,I001
from tdag.ir.record import REGISTRY, Cost, NoSpec, OpRecord, Trait, ops_with, record

# kernels are placeholders for fused framework calls (made by tdag.lower), not primitives
PRIMITIVES = tuple(op for op, rec in REGISTRY.items() if not rec.has(Trait.KERNEL))

__all__ = ["PRIMITIVES", "REGISTRY", "Cost", "NoSpec", "OpRecord", "Trait", "ops_with", "record"]
