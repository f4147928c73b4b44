"""The chains ``tdag.grad`` writes for the input gradient of softmax and of GELU ->
softmax_backward and gelu_backward (tdag/lower/kernels/backward.py).

Each chain ends in the sum of an operand's cotangent contributions (an add); the rule tries
the kernel's template at that add for each axis (softmax) or mode (GELU), and the match
itself finds the cotangent and the forward input deep inside it.
"""
from __future__ import annotations

from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.lower.kernels.activations import Gelu, Softmax
from tdag.lower.match import kernel_operands


def _lower(node: Node, ctx: Context, op: Op, specs):
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    for spec in specs:
        found = kernel_operands(ctx, node, op, spec, (node.type, node.type))
        if found is not None:
            emit = ctx.emitter(node)
            return emit.finish(emit(op, spec, *found))
    return NoMatch(f"not {op.value}'s chain")


def softmax_backward_rule(node: Node, ctx: Context):
    """the derivative chain of softmax(x, a) at dy -> softmax_backward(dy, x, a)"""
    axes = range(node.type.rank)
    return _lower(node, ctx, Op.softmax_backward, [Softmax(a) for a in reversed(axes)])


def gelu_backward_rule(node: Node, ctx: Context):
    """the derivative chain of gelu(x) at dy -> gelu_backward(dy, x)"""
    return _lower(node, ctx, Op.gelu_backward, [Gelu("none"), Gelu("tanh")])


RULES = (
    Rule(Op.add, softmax_backward_rule),
    Rule(Op.add, gelu_backward_rule),
)
