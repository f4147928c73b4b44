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

DBRX's experts module (``DbrxExperts``) has the loop but no such switch: while capturing it
runs the same grouped form, written over its own weights (``_dbrx_experts``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import MethodType

import torch
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


def _dbrx_experts(self, hidden_states, top_k_index, top_k_weights):
    """``DbrxExperts.forward`` as transformers' grouped form: the (token, expert) pairs
    sorted by expert, three grouped matmuls over the experts' slices of ``w1``, ``v1`` and
    ``w2`` (``x @ w1[e].T``, ``x @ v1[e].T``, ``h @ w2[e]``, as ``DbrxExpertGLU``), each
    row weighted and summed back per token."""
    from transformers.integrations.moe import _grouped_mm  # noqa: PLC0415  (its dispatch)

    mlp, experts, top_k = self.mlp, self.num_experts, top_k_index.shape[-1]
    x = hidden_states.reshape(-1, self.hidden_size)
    expert_ids, order = torch.sort(top_k_index.reshape(-1))
    rows = x[order // top_k]
    counts = torch.histc(expert_ids.float(), bins=experts, min=0, max=experts - 1)
    offsets = torch.cumsum(counts, 0, dtype=torch.int32)
    shape = (experts, self.ffn_hidden_size, self.hidden_size)
    gate = _grouped_mm(rows, mlp.w1.view(shape).transpose(-2, -1), offs=offsets)
    up = _grouped_mm(rows, mlp.v1.view(shape).transpose(-2, -1), offs=offsets)
    out = _grouped_mm(mlp.activation_fn(gate) * up, mlp.w2.view(shape), offs=offsets)
    out = out * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    summed = out[back].view(-1, top_k, self.hidden_size).sum(1)
    return summed.view(hidden_states.shape[0], -1, self.hidden_size)


def _dbrx_modules(module: nn.Module) -> list:
    """The DBRX experts modules of ``module`` (by class name: transformers need not be
    imported), where the grouped form can run (transformers has its grouped matmul)."""
    found = [m for m in module.modules() if type(m).__name__ == "DbrxExperts" and
             hasattr(m, "mlp") and "forward" not in vars(m)]
    if found:
        try:
            from transformers.integrations.moe import _grouped_mm  # noqa: F401, PLC0415
        except ImportError:
            return []
    return found


@contextlib.contextmanager
def experts_traceable(module: nn.Module) -> Iterator[None]:
    """While capturing, transformers' eager experts dispatch as ``grouped_mm``, and DBRX's
    run their grouped form."""
    configs, dbrx = _eager_experts(module), _dbrx_modules(module)
    for config in configs:
        config._experts_implementation = TRACEABLE
    for m in dbrx:
        m.forward = MethodType(_dbrx_experts, m)
    try:
        yield
    finally:
        for config in configs:
            config._experts_implementation = "eager"
        for m in dbrx:
            del m.forward
