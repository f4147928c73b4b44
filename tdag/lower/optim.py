"""An optimizer's update -> its kernel: the stack of ``ops.adamw_update``'s three results,
as simplify leaves it (a sum of pads of the unsqueezed parameter and moments), ->
adamw_update(param, grad, exp_avg, exp_avg_sq, step).

The hyperparameters are constants inside the composition, so the rule first binds the
composition of a probe spec to the graph, its operands and constants free, reads the
spec back from what the probe's constants met (each probe constant is a distinct value,
so it names the field it came from), then checks the whole composition of that spec node
for node with ``matches_kernel``.
"""
from __future__ import annotations

import torch

from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.ir.types import DType, TensorType
from tdag.lower.kernels.optim import AdamWUpdate
from tdag.lower.match import bind_template, kernel_template, matches_kernel, scalar

# every derived constant of these specs is a distinct value: (1 - lr*wd) 0.9375, (1 - beta1)
# 0.25, beta2 0.875, (1 - beta2) 0.125, beta1 0.75, -lr -0.125, eps 2**-10; with no weight
# decay the parameter's multiply by 1 is simplified away, so that form has its own probe
PROBES = (AdamWUpdate(0.125, 0.75, 0.875, 2.0 ** -10, 0.5),
          AdamWUpdate(0.125, 0.75, 0.875, 2.0 ** -10, 0.0))


def adamw_rule(node: Node, ctx: Context):
    """sum of pad(unsqueeze(r_i)) stacking adamw's three results -> adamw_update(...)"""
    if not _stacks_three(ctx, node):
        return NoMatch("not a stack of three results")
    param = node.type.with_shape(node.type.shape[1:])
    types = (param,) * 4 + (TensorType((), DType.f32),)
    for probe in PROBES:
        found = _discover(ctx, kernel_template(Op.adamw_update, probe, types), node)
        if found is None:
            continue
        operands, consts = found
        spec = _spec(probe, consts)
        if spec is not None and matches_kernel(ctx, node, Op.adamw_update, spec, operands):
            emit = ctx.emitter(node)
            return emit.finish(emit(Op.adamw_update, spec, *operands))
    return NoMatch("not AdamW's update")


def _stacks_three(ctx: Context, node: Node) -> bool:
    """A cheap look before unifying: f32[3, ...] = add(_, pad(unsqueeze(_), (2, 0)))."""
    if node.type.rank < 1 or node.type.shape[0] != 3 or not node.type.dtype.is_float:
        return False
    pad = ctx.made(node.inputs[1], Op.pad) or ctx.made(node.inputs[0], Op.pad)
    return pad is not None and pad.spec.widths[0] == (2, 0) and \
        ctx.made(pad.inputs[0], Op.unsqueeze) is not None


def _spec(probe: AdamWUpdate, consts: dict) -> AdamWUpdate | None:
    """The spec whose constants are those the probe's met (by the probe's values)."""
    keep = 1.0 - probe.lr * probe.weight_decay  # the parameter's factor, where it decays
    want = (-probe.lr, probe.beta1, probe.beta2, probe.eps) + ((keep,) if keep != 1.0 else ())
    got = [consts.get(v) for v in want]
    if None in got or got[0] == 0.0:
        return None
    lr, beta1, beta2, eps = -got[0], got[1], got[2], got[3]
    # read back from 1 - lr * decay as its float32 shortest decimal: 0.01, not 0.0100000000001
    decay = float(str(torch.tensor((1.0 - got[4]) / lr).numpy())) if len(got) > 4 else 0.0
    return AdamWUpdate(lr, beta1, beta2, eps, decay)


def _discover(ctx: Context, template, root: Node):
    """(operands, {probe constant value: graph constant value}) binding the template's
    inputs and scalar constants freely; None where the structure differs."""
    bound = bind_template(ctx, root, template, free_consts=True)
    if bound is None:
        return None
    # each as its shortest decimal (0.9, not 0.899999976): derived constants such as 1 - 0.9
    # round to float32 as the source's did
    consts = {float(template.weights[t].value): scalar(ctx, g)
              for t, g in bound.items() if t in template.weights}
    return tuple(bound[v.name] for v in template.inputs), consts


RULES = (
    Rule(Op.add, adamw_rule),  # sum of pad(unsqueeze(r_i)) of adamw's results -> adamw_update
)
