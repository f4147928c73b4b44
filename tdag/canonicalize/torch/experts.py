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
runs the same grouped form, written over its own weights (``_dbrx_experts``). Switch
Transformers' experts are separate modules (no stacked weights to group): while capturing
they loop over every expert, each taking the rows routed to it (``torch.where``, a size
data decides), so each expert costs the tokens it runs; its router moves its classifier to
the router's dtype on every call, which while capturing is the no-op it is in eager where
the classifier has that dtype already.
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


def _switch_experts(self, hidden_states, selected_experts, routing_weights):
    """``SwitchTransformersExperts.forward`` with the loop over every expert rather than
    over those the batch hits: an expert no token reaches multiplies no rows."""
    out = torch.zeros_like(hidden_states)
    mask = selected_experts.permute(2, 1, 0)
    for e in range(self.num_experts):
        slot, rows = torch.where(mask[e])
        states = self[f"expert_{e}"](hidden_states[rows]) * routing_weights[rows, slot, None]
        out.index_add_(0, rows, states.to(hidden_states.dtype))
    return out


def _to_unless_same_dtype(self, *args, **kwargs):
    """``Module.to``, or the module itself where the call asks only for the dtype every
    parameter has (no copy to make; torch.export cannot swap a parameter for itself)."""
    dtype = args[0] if len(args) == 1 and not kwargs else kwargs.get("dtype") if \
        set(kwargs) == {"dtype"} and not args else None
    if isinstance(dtype, torch.dtype) and all(p.dtype == dtype for p in self.parameters()):
        return self
    return type(self).to(self, *args, **kwargs)


_LOOPS = {"DbrxExperts": (_dbrx_experts, "mlp"),
          "SwitchTransformersExperts": (_switch_experts, "num_experts")}


def _looping_modules(module: nn.Module) -> list:
    """(module, its traceable forward) for each experts module of ``module`` that loops
    over the experts hit (by class name: transformers need not be imported)."""
    found = []
    for m in module.modules():
        traceable, attribute = _LOOPS.get(type(m).__name__, (None, None))
        if traceable is not None and hasattr(m, attribute) and "forward" not in vars(m):
            found.append((m, traceable))
    if any(f is _dbrx_experts for _, f in found):
        try:
            from transformers.integrations.moe import _grouped_mm  # noqa: F401, PLC0415
        except ImportError:
            found = [(m, f) for m, f in found if f is not _dbrx_experts]
    return found


def _self_moving(module: nn.Module) -> list:
    """The classifiers of Switch Transformers' routers (``self.classifier.to(dtype)`` in
    forward)."""
    return [m.classifier for m in module.modules()
            if type(m).__name__ == "SwitchTransformersTop1Router" and
            isinstance(getattr(m, "classifier", None), nn.Module) and
            "to" not in vars(m.classifier)]


@contextlib.contextmanager
def experts_traceable(module: nn.Module) -> Iterator[None]:
    """While capturing, transformers' eager experts dispatch as ``grouped_mm``, and the
    experts modules that loop over the experts hit run their traceable forms."""
    configs, loops, moving = _eager_experts(module), _looping_modules(module), \
        _self_moving(module)
    for config in configs:
        config._experts_implementation = TRACEABLE
    for m, traceable in loops:
        m.forward = MethodType(traceable, m)
    for m in moving:
        m.to = MethodType(_to_unless_same_dtype, m)
    try:
        yield
    finally:
        for config in configs:
            config._experts_implementation = "eager"
        for m, _ in loops:
            del m.forward
        for m in moving:
            del m.to
