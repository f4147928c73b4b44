"""The ops: importing this package registers the record of every primitive and kernel."""
from tdag.deinops import elementwise, indexing, kernels, movement, reduce  # noqa: F401
from tdag.ir.record import REGISTRY, Cost, NoSpec, OpRecord, Trait, ops_with, record

# kernels are placeholders for fused framework calls (made by tdag.lower), not primitives
PRIMITIVES = tuple(op for op, rec in REGISTRY.items() if not rec.has(Trait.KERNEL))

__all__ = ["PRIMITIVES", "REGISTRY", "Cost", "NoSpec", "OpRecord", "Trait", "ops_with", "record"]
