"""``tdag.memory``: the peak memory of a program as ``tdag.to_torch``'s module runs it.

The replay lives in ``tdag.refine.memory``; this module gives it what only the torch target
knows: the lowering ``to_torch`` applies and the code generator's liveness (which nodes it
writes and where it deletes each value).
"""
from __future__ import annotations

from tdag.ir.graph import TDAG
from tdag.ir.program import Program
from tdag.refine.memory import MemoryReport, memory_of
from tdag.reify.torch.codegen import liveness
from tdag.reify.torch.module import lowered


def memory(prog: Program | TDAG, **sizes: int) -> MemoryReport:
    """Peak bytes of ``prog`` run by ``tdag.to_torch(prog)``, split by kind, the tensors live
    at the peak and the curve (``report.timeline()``); symbolic where ``sizes`` leave a
    size free.

    >>> import tdag
    >>> from tdag import ops
    >>> prog = tdag.trace(lambda x, w: ops.relu(x @ w), tdag.TensorSpec(("b", 256)),
    ...                   tdag.TensorSpec((256, 256)))
    >>> report = tdag.memory(prog, b=64)
    >>> report.peak, report.by_kind["inputs"], report.by_kind["activations"]
    (393216, 327680, 65536)
    >>> str(tdag.memory(prog).peak)
    '2048*b + 262144'
    """
    if isinstance(prog, TDAG):
        prog = Program.from_tdag(prog)
    return memory_of(lowered(prog), liveness, **sizes)


__all__ = ["memory"]
