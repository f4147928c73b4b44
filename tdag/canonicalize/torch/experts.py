"""Capturing transformers' mixture-of-experts layers whose ``eager`` forward torch.export
cannot trace.

The ``eager`` experts forward loops in Python over the experts a batch hits (``for e in
mask.nonzero()``, ``if e == num_experts: continue``): the loop's length and the ``if`` are
data, so torch.export stops on ``Could not guard on data-dependent expression Eq(u0, 0)``,
and no trace of one example could serve another routing. transformers offers the same layer
in forms without data-dependent Python (``use_experts_implementation``: the routed rows
sorted by expert and one grouped matmul, or one batched matmul of gathered weights), all
computing the same function. While capturing, an ``eager`` experts module runs as
``grouped_mm``: routed rows sorted by expert, a grouped matmul at the cost of the experts
each token uses (top-k of n), and a sum back per token. The model itself is left as it was.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

TRACEABLE = "grouped_mm"


def _eager_experts(module: nn.Module) -> list:
    """The configs of transformers experts modules that dispatch to the eager loop: those
    the ``use_experts_implementation`` decorator wrapped (it sets ``_is_expert_parallel``)."""
    configs = []
    for m in module.modules():
        config = getattr(m, "config", None)
        if hasattr(m, "_is_expert_parallel") and not m._is_expert_parallel and \
                getattr(config, "_experts_implementation", None) == "eager" and \
                all(config is not c for c in configs):
            configs.append(config)
    return configs


@contextlib.contextmanager
def experts_traceable(module: nn.Module) -> Iterator[None]:
    """While capturing, transformers' eager experts dispatch as ``grouped_mm``."""
    configs = _eager_experts(module)
    for config in configs:
        config._experts_implementation = TRACEABLE
    try:
        yield
    finally:
        for config in configs:
            config._experts_implementation = "eager"
