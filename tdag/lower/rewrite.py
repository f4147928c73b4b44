"""Moved: the rewrite engine of refine and lower is ``tdag.ir.rewrite``.

Only ``Context`` is left here, for ``tdag/reify/to_onnx.py`` and ``tdag/reify/torch_codegen.py``
(which read scalars with ``tdag.lower.match.scalar``); delete this module once they import
``tdag.ir.rewrite.Context``. Rules must not import it: it has no engine.
"""
from tdag.ir.rewrite import Context

__all__ = ["Context"]
