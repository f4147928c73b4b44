"""The attention pattern -> one scaled-dot-product attention kernel, in any axis order.

    s = einsum(q, k) * scale                 (q and k share the contracted feature axis e)
    s = where(mask, s, -inf) | s + mask      (optional; an iota mask j <= i is causal)
    p = softmax(s, over the key axis)        (a "safe" where(max == -inf, 0, p) is allowed)
    o = einsum(p, v)                         (contracting the key axis)

Axes are classified by which operands hold them: batch (q, k, v, out), l (q, out), s (k, v),
e (q, k), ev (v, out). The kernel gets q[..., l, e], k[..., s, e], v[..., s, ev] by permutes.
A constant mask that hides no key (all true, or zeros added) is left out of the kernel.
"""
from __future__ import annotations

import torch

from tdag.deinops.elementwise import CompareKind
from tdag.lower.kernels.contraction import parse_equation
from tdag.lower.kernels.sequence import Attention
from tdag.deinops.movement import Permute
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.ir.types import DType
from tdag.lower.match import constant_value, is_scalar, scalar, trace_axes

_INF = float("inf")


def _unsafe(ctx: Context, name: str) -> str:
    """where(cond, 0, p) with cond from a max == -inf test (torch's safe softmax) -> p."""
    node = ctx.made(name, Op.where)
    if node is None or not is_scalar(ctx, node.inputs[1], 0.0):
        return name
    test = ctx.made(trace_axes(ctx, node.inputs[0], units=True)[0], Op.compare)
    if test is None or test.spec.kind is not CompareKind.eq or \
            not any(is_scalar(ctx, t, -_INF) for t in test.inputs):
        return name
    return node.inputs[2]


def _peel_masks(ctx: Context, s: str, depth: int = 0):
    """Strip masks off the scores: ``(scores, [(kind, tensor)])`` with kind "keep" (a
    where with -inf) or "add"; None when no scaled einsum lies beneath."""
    if _scaled_scores(ctx, s) is not None:
        return s, []
    node = ctx.producer(s)
    if node is None or depth >= 2:
        return None
    if node.op is Op.where and is_scalar(ctx, node.inputs[2], -_INF):
        inner = _peel_masks(ctx, node.inputs[1], depth + 1)
        return None if inner is None else (inner[0], inner[1] + [("keep", node.inputs[0])])
    if node.op is Op.add:
        for a, b in (node.inputs, reversed(node.inputs)):
            added = scalar(ctx, b)
            if added == 0.0 and ctx.type(a).same_as(node.type):
                # s + 0 is s (a mask of zeros, too big for simplify's x + 0 to see)
                return _peel_masks(ctx, a, depth + 1)
            inner = _peel_masks(ctx, a, depth + 1) if added is None else None
            if inner is not None:
                return inner[0], inner[1] + [("add", b)]
    return None


def _scaled_scores(ctx: Context, s: str):
    """``einsum(q, k) * c`` (or ``/ c``, or c folded into q) -> (einsum node, c)."""
    coef = 1.0
    node = ctx.producer(s)
    while node is not None and node.op in (Op.multiply, Op.divide):
        a, b = node.inputs
        vb, va = scalar(ctx, b), scalar(ctx, a)
        if node.op is Op.divide and vb is not None and node.spec.mode.value == "true":
            coef, s = coef / vb, a
        elif node.op is Op.multiply and (vb is not None or va is not None):
            coef, s = coef * (vb if vb is not None else va), (a if vb is not None else b)
        else:
            break
        node = ctx.producer(s)
    if node is None or node.op is not Op.einsum or len(node.inputs) != 2:
        return None
    return node, coef


def attention_rule(node: Node, ctx: Context):
    """einsum(softmax(mask(einsum(q, k) * c)), v) -> attention(q, k, v, mask, scale=c)"""
    if len(node.inputs) != 2 or not node.type.dtype.is_float:
        return NoMatch("not a float contraction of two operands")
    reason = "no operand is a softmax"
    for p_name, v in (node.inputs, reversed(node.inputs)):
        sm = ctx.made(_unsafe(ctx, p_name), Op.softmax)
        if sm is None:
            continue
        peeled = _peel_masks(ctx, sm.inputs[0])
        if peeled is None:
            reason = "the softmax is not over (masked) scaled scores einsum(q, k) * c"
            continue
        scores, masks = peeled
        qk, coef = _scaled_scores(ctx, scores)
        q, k, coef = _unscale_q(ctx, qk, coef)
        plan = _plan(ctx, qk, sm, node, p_name == node.inputs[0])
        if plan is None:
            reason = "the axes of q, k, v and the output are not attention's"
            continue
        if _read_outside(ctx, qk.name, node):
            return NoMatch("the scores or probabilities are read outside the pattern (a "
                           "backward pass, an output): the kernel would compute them twice")
        return _emit(node, ctx, plan, q, k, v, coef, masks)
    return NoMatch(reason)


def _read_outside(ctx: Context, scores: str, root: Node, limit: int = 32) -> bool:
    """Whether a value computed from ``scores`` is read by a node that does not lead to
    ``root``, or is an output: walking the readers forward from the scores must end at the
    root within ``limit`` nodes (the scale, masks, softmax and its safe test)."""
    outputs = set(ctx.graph.outputs)
    seen, todo = {scores}, [scores]
    while todo:
        name = todo.pop()
        if name in outputs or len(seen) > limit:
            return True
        for reader in ctx.readers(name):  # a dead end is fine: nothing computes it twice
            if reader.name != root.name and reader.name not in seen:
                seen.add(reader.name)
                todo.append(reader.name)
    return False


def _unscale_q(ctx: Context, qk: Node, coef: float):
    """Fold a scalar factor on q or k into the scale."""
    q, k = qk.inputs
    for _ in range(2):
        node = ctx.producer(q)
        if node is not None and node.op is Op.multiply:
            a, b = node.inputs
            vb, va = scalar(ctx, b), scalar(ctx, a)
            if vb is not None or va is not None:
                coef *= vb if vb is not None else va
                q = a if vb is not None else b
                continue
        break
    return q, k, coef


def _plan(ctx: Context, qk: Node, sm: Node, pv: Node, p_first: bool):
    """Letters of q, k, v, out classified; None when the shapes are not attention. The
    scores' letters name the axes; v's own axis and the output's are marked "#"."""
    (lq, lk), ls = parse_equation(qk.spec.equation)
    (la, lb), lo = parse_equation(pv.spec.equation)
    lp, lv = (la, lb) if p_first else (lb, la)
    rename = dict(zip(lp, ls))  # p's axes are the scores' axes
    if len([c for c in lv if c not in rename]) != 1:
        return None
    vv = [rename.get(c, "#") for c in lv]
    oo = [rename.get(c, "#") for c in lo]
    s = ls[sm.spec.axis]
    batch = [c for c in ls if c in lq and c in lk]
    l_ = [c for c in ls if c in lq and c not in lk]
    e = [c for c in lq if c in lk and c not in ls]
    if s not in lk or s in lq or len(l_) != 1 or len(e) != 1 or len(ls) != len(batch) + 2:
        return None
    if set(lq) != set(batch + l_ + e) or set(lk) != set(batch + [s] + e):
        return None
    if sorted(vv) != sorted(batch + [s, "#"]) or sorted(oo) != sorted(batch + l_ + ["#"]):
        return None
    return {"lq": lq, "lk": lk, "ls": ls, "lv": vv, "lo": oo, "batch": batch, "l": l_[0],
            "s": s, "e": e[0]}


def _perm(have, want) -> tuple:
    return tuple(list(have).index(c) for c in want)


def _emit(node: Node, ctx: Context, plan, q, k, v, coef, masks):
    batch, l, s, e = plan["batch"], plan["l"], plan["s"], plan["e"]
    emit = ctx.emitter(node)

    def arrange(name, have, want):
        perm = _perm(have, want)
        return name if perm == tuple(range(len(perm))) else emit(Op.permute, Permute(perm), name)

    q2 = arrange(q, plan["lq"], batch + [l, e])
    k2 = arrange(k, plan["lk"], batch + [s, e])
    v2 = arrange(v, plan["lv"], batch + [s, "#"])
    causal, mask = False, None
    for kind, m in masks:
        if kind == "keep" and not causal and _is_causal(ctx, m, plan):
            causal = True
        elif mask is None:
            mask = (kind, _unbroadcast(ctx, m) if list(plan["ls"]) == batch + [l, s] else
                    arrange(m, plan["ls"], batch + [l, s]))
        else:
            return NoMatch("two general masks")
    args = [q2, k2, v2]
    if mask is not None:
        args.append(mask[1])
        if mask[0] == "keep" and ctx.type(mask[1]).dtype is not DType.bool:
            return NoMatch("a keep-mask that is not bool")
    out = emit(Op.attention, Attention(float(coef), causal), *args)
    out = arrange(out, batch + [l, "#"], plan["lo"])
    return emit.finish(out)


def _unbroadcast(ctx: Context, mask: str) -> str:
    """The smaller mask that ``mask`` broadcasts numpy-style (the kernel broadcasts it)."""
    src, mapping = trace_axes(ctx, mask, units=True)
    rank, n = len(mapping), ctx.type(src).rank
    if tuple(mapping) == (None,) * (rank - n) + tuple(range(n)):
        return src
    return mask


def _is_causal(ctx: Context, mask: str, plan) -> bool:
    """j <= i between an iota along the key axis (j) and one along the query axis (i)."""
    src, outer = trace_axes(ctx, mask, units=True)
    test = ctx.made(src, Op.compare)
    if test is None:
        return False
    inner = [_iota_axis(ctx, t) for t in test.inputs]
    if None in inner:
        return False
    ls = plan["ls"]
    letters = [ls[outer.index(a)] if a in outer else None for a in inner]
    kind = test.spec.kind
    return (kind is CompareKind.le and letters == [plan["s"], plan["l"]]) or \
        (kind is CompareKind.ge and letters == [plan["l"], plan["s"]])


def _iota_axis(ctx: Context, name: str) -> int | None:
    """The one axis along which ``name`` shows 0, 1, 2, ... (a broadcast iota)."""
    src, mapping = trace_axes(ctx, name)
    node = ctx.made(src, Op.iota)
    shown = [i for i, m in enumerate(mapping) if m is not None]
    if node is None or len(shown) != 1:
        return None
    return shown[0]


def hides_nothing(ctx: Context, mask: str) -> bool:
    """Whether ``mask`` is a constant that keeps every key: all true, or all zero added (the
    mask transformers' ViT and BERT build when no padding is given)."""
    value = constant_value(ctx, mask)
    if value is None:
        return False
    return bool(value.all()) if value.dtype == torch.bool else not bool(value.any())


def neutral_mask_rule(node: Node, ctx: Context):
    """attention(q, k, v, m) -> attention(q, k, v) where m hides nothing: the mask is built,
    broadcast and read on every call (and the ONNX file tests for dead rows) for no effect"""
    if len(node.inputs) != 4 or not hides_nothing(ctx, node.inputs[3]):
        return NoMatch("no mask, or one that may hide a key (an input's, or a constant's)")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.attention, node.spec, *node.inputs[:3]))


RULES = (
    Rule(Op.einsum, attention_rule),  # einsum(softmax(mask(einsum(q, k) * c)), v) -> attention
    Rule(Op.attention, neutral_mask_rule),  # attention(q, k, v, m keeping all) -> no m
)
