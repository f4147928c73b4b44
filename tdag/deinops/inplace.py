"""Elementwise results written over a dying operand in the generated torch code.

An activation or a residual add whose operand nothing reads afterwards writes its result
into that operand's storage (``torch.relu_(v)``, ``v.add_(r)``): no new tensor, so no
allocation and one fewer buffer to touch. The code writes so only while autograd is not
recording (an in-place op would overwrite values autograd saved for the backward pass):

    v_2 = (torch.relu_(v_1) if not torch.is_grad_enabled() else torch.relu(v_1))

``tdag.memory`` replays the in-place form (``liveness``'s overwrites), as it replays
inference. The operand written over is the fresh result of a product, a convolution or an
elementwise op (not an input, weight, cast, or a view of anything: an expand's elements
share memory), of the result's type, sharing no storage with the other operand;
``Code.may_overwrite`` says nothing after reads it.
"""
from __future__ import annotations

from tdag.ir.op import Op
from tdag.ir.record import Trait, has

_GRAD_OFF = "not torch.is_grad_enabled()"


def overwritten_operand(node, code) -> tuple[str, ...]:
    """(operand,) the torch code of the elementwise ``node`` writes its result over, or ()."""
    if not node.type.dtype.is_float or node.name in code.fused:
        return ()  # (an integer may be carried in a wider type: its code is no plain call)
    for name in node.inputs:
        others = [n for n in node.inputs if n != name]
        if code.ctx.type(name) == node.type and _fresh(code.ctx.producer(name)) and \
                code.root(name) == name and code.may_overwrite(node, name) and \
                all(code.root(o) != name for o in others):
            return (name,)
    return ()


# kernels whose torch code always returns a new tensor of their operand's type (F.batch_norm
# in eval mode, F.layer_norm, F.group_norm, F.rms_norm; a batch norm folded into the
# convolution it reads is that convolution's result): MobileNet-v2's ReLU6 after each norm
# then clamps in place
_FRESH_KERNELS = (Op.einsum, Op.conv, Op.batch_norm, Op.layer_norm, Op.group_norm,
                  Op.rms_norm)


def _fresh(producer) -> bool:
    """Whether the torch code of ``producer`` returns a tensor of its own: a product, a
    convolution, a norm or an elementwise op, but not a cast (``.to`` of the same dtype, or
    ``.real`` of a complex tensor, returns a view) nor a bitcast (a view)."""
    if producer is None or producer.op in (Op.cast, Op.bitcast):
        return False
    return producer.op in _FRESH_KERNELS or has(producer.op, Trait.ELEMENTWISE)


def written_operand(node, a, code) -> int | None:
    """The position of the operand ``node``'s code writes over (``overwritten_operand``),
    where its expression is the plain variable; None where it writes a new tensor."""
    target = code.written_over(node)
    if not target:
        return None
    k = node.inputs.index(target[0])
    return k if a[k].isidentifier() else None


def in_place(fresh: str, inplace: str) -> str:
    """``inplace`` while autograd does not record, else ``fresh``."""
    return f"({inplace} if {_GRAD_OFF} else {fresh})"


def unary(node, a, code, fresh: str, inplace: str) -> str:
    """A unary op's code: ``inplace`` (written with ``{x}`` for the operand) where it writes
    over its operand, else ``fresh``."""
    if written_operand(node, a, code) is None:
        return fresh
    return in_place(fresh, inplace.format(x=a[0]))


def binary(node, a, code, fresh: str, method: str) -> str:
    """A commutative binary op's code: ``target.method(other)`` where it writes over an
    operand, else ``fresh``."""
    k = written_operand(node, a, code)
    if k is None:
        return fresh
    return in_place(fresh, f"{a[k]}.{method}({a[1 - k]})")


__all__ = ["binary", "in_place", "overwritten_operand", "unary", "written_operand"]
