"""tdag's exception types: one per class of failure.

Every error raised at a boundary names what failed (the op, the node, the pattern, the file)
and, where the node came from a framework, its provenance (``aten.conv2d @ encoder.conv``).
"""
from __future__ import annotations


class TdagError(Exception):
    """Base class of every error tdag raises on purpose."""

    def __init__(self, message: str, *, node: str | None = None, origin: object = None):
        self.message = message  # without the location, for reports that add their own
        self.node = node
        self.origin = origin
        where = []
        if node is not None:
            where.append(f"node %{node}")
        if origin is not None and str(origin):
            where.append(f"from {origin}")
        self.where = ", ".join(where)  # the location alone: "node %7, from aten.add @ fc"
        super().__init__(f"{message} [{self.where}]" if where else message)


class ShapeError(TdagError):
    """Operand shapes or dtypes that an op does not accept."""


class PatternError(TdagError):
    """An einops pattern that cannot be parsed or does not fit its operands."""


class UnsupportedOpError(TdagError):
    """A framework op with no mapping to tdag primitives."""


class InvalidModelError(TdagError):
    """A Program (or source model) that is malformed: dangling names, cycles, bad types."""


class FileFormatError(TdagError):
    """A file (.tdag, .pt2, .onnx, or the text form) that is damaged, truncated or not of its
    kind."""


class CaptureError(TdagError):
    """torch.export failed on the model (data-dependent control flow, untraceable Python,
    example inputs that forward does not accept); the original exception is the cause."""


class ConversionError(TdagError):
    """The converter failed on a captured graph in a way it did not foresee: a gap in tdag
    rather than in the model. The original exception is the cause."""


class MemoryBudgetError(TdagError):
    """No program within a memory budget (``tdag.remat``); ``smallest`` is the smallest peak
    in bytes that recomputing activations reaches."""

    def __init__(self, message: str, *, smallest: int):
        self.smallest = smallest
        super().__init__(message)
