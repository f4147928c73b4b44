"""JAX control flow as tdag controllers: ``cond`` -> If, ``while`` -> Loop with a condition,
``scan`` -> Loop with a fixed trip count and stacked outputs.

The walker closes its segment first, so every tensor operand is a value of the block (a
Boundary). A body's jaxpr is flattened (jax/trace.py's flatten_closed) on placeholder Refs and
walked by a nested walker; tensor operands enter it as the body Block's inputs, weights
and literals directly (each body TDAG holds the weights it reads). A Loop carries
unchanged the tensors its body reads but does not update.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.jax.trace import Ref, dim_of, flatten_closed, type_of
from tdag.canonicalize.jax.walker import CONTROL, Walker
from tdag.canonicalize.common.segments import Boundary
from tdag.ir.graph import Value
from tdag.ir.program import Block, If, Loop
from tdag.ir.symbols import as_dim, is_static
from tdag.ir.types import DType, TensorType


def _passed(w: Walker, operands: list) -> list:
    """The operands that are tensors of the block (the others enter bodies directly)."""
    return [x for x in operands if isinstance(w.env.get(x) if isinstance(x, Ref) else None,
                                              Boundary)]


def _enter(w: Walker, operands: list, passed: list) -> tuple[list, dict, list]:
    """Placeholder Refs for a body's operands, its env and its Block's inputs: a passed
    operand becomes a fresh block input, any other keeps its value (a weight, a literal)."""
    refs, env, inputs = [], {}, []
    for x in operands:
        ref = Ref(getattr(x, "aval", None))
        refs.append(ref)
        if x in passed:
            env[ref] = Boundary(w.shared.fresh(), w.env[x].type)
            inputs.append(env[ref])
        else:
            env[ref] = w.env[x] if isinstance(x, Ref) else x
    return refs, env, inputs


def _bind(w: Walker, eqn, names: list, types: list) -> None:
    for ref, name, t in zip(eqn.outs, names, types):
        w.env[ref] = Boundary(name, t)


# -- cond ----------------------------------------------------------------------------------------

@CONTROL.register("cond")
def convert_cond(w: Walker, eqn, index: int) -> None:
    """``branches[which](*operands)``: If which == 0 then branch 0 else (if which == 1 ...),
    nested in the else branches (``which`` is clamped, as lax does)."""
    branches = eqn.params["branches"]
    which, operands = eqn.ins[0], eqn.ins[1:]
    with w.builder.active():
        k = ops.clamp(w.read(which), 0, len(branches) - 1)
        preds = []
        for b in range(len(branches) - 1):
            ref = Ref(None)
            w.env[ref] = ops.reshape(ops.eq(k, b), ())
            preds.append(ref)
    w.close(index, keep=[*preds, *[x for x in operands if isinstance(x, Ref)]])
    passed = _passed(w, operands)
    outs = [w.shared.fresh() for _ in eqn.outs]
    names = {x: w.env[x].name for x in passed + preds}
    w.steps.append(_chain(w, branches, operands, passed, preds, names, outs, eqn))
    _bind(w, eqn, outs, [type_of(r.aval) for r in eqn.outs])


def _branch(w: Walker, closed, operands: list, passed: list, extra: list, caller) -> Block:
    """A branch's Block: inputs the passed operands and then ``extra`` (values the branch
    ignores, taken so that both branches of an If share a signature)."""
    refs, env, inputs = _enter(w, operands, passed)
    extra_in = [Boundary(w.shared.fresh(), t.type) for t in extra]
    eqns, outs = flatten_closed(closed, refs, w.shared.traced, caller)
    return w.nested("branch", env).block(inputs + extra_in, eqns, outs)


def _chain(w, branches, operands, passed, preds, names: dict, outs, caller) -> If:
    """The If choosing ``branches[0]`` on ``preds[0]``, else the rest; ``names`` are the
    names of the passed operands and the conditions in the block the If stands in."""
    rest = preds[1:]
    extra = [w.env[p] for p in rest]
    then = _branch(w, branches[0], operands, passed, extra, caller)
    if len(branches) == 2:
        other = _branch(w, branches[1], operands, passed, extra, caller)
    else:  # one level down, the same values under the names of the else block's inputs
        inner = {x: w.shared.fresh() for x in passed + rest}
        inner_outs = [w.shared.fresh() for _ in outs]
        step = _chain(w, branches[1:], operands, passed, rest, inner, inner_outs, caller)
        other = Block(tuple(Value(inner[x], w.env[x].type) for x in passed + rest), (step,),
                      tuple(inner_outs))
    return If(names[preds[0]], tuple(names[x] for x in passed + rest), then, other,
              tuple(outs))


# -- while ---------------------------------------------------------------------------------------

@CONTROL.register("while")
def convert_while(w: Walker, eqn, index: int) -> None:
    """``while cond(carry): carry = body(carry)`` as a Loop: the initial condition is
    computed before it, and the body computes the next condition after the new carry."""
    p = eqn.params
    n_cond, n_body = p["cond_nconsts"], p["body_nconsts"]
    cond_consts = eqn.ins[:n_cond]
    body_consts = eqn.ins[n_cond:n_cond + n_body]
    carry = [w.pin(x) for x in eqn.ins[n_cond + n_body:]]
    consts = cond_consts + body_consts
    w.close(index, keep=[*carry, *[x for x in consts if isinstance(x, Ref)]])
    first = _inline(w, p["cond_jaxpr"], consts[:n_cond] + carry, eqn)[0]
    passed = _passed(w, consts)
    refs, env, inputs = _enter(w, [*carry, *consts], [*carry, *passed])
    counter = Boundary(w.shared.fresh("i"), TensorType((), DType.i64))
    body_eqns, new_carry = flatten_closed(p["body_jaxpr"], refs[len(carry) + n_cond:] +
                                          refs[:len(carry)], w.shared.traced, eqn)
    cond_eqns, keep = flatten_closed(p["cond_jaxpr"], refs[len(carry):len(carry) + n_cond] +
                                     new_carry, w.shared.traced, eqn)
    through = [env[r] for r, x in zip(refs[len(carry):], consts) if x in passed]
    sub = w.nested("while", env)
    body = sub.block([counter, *inputs], body_eqns + cond_eqns,
                     [keep[0], *new_carry, *_refs_of(sub, through)])
    outs = [w.shared.fresh() for _ in eqn.outs] + [w.shared.fresh() for _ in through]
    w.steps.append(Loop(tuple(w.env[x].name for x in carry) +
                        tuple(w.env[x].name for x in passed), body, tuple(outs),
                        cond=first))
    _bind(w, eqn, outs, [type_of(r.aval) for r in eqn.outs])


def _refs_of(sub: Walker, outers: list) -> list:
    """Refs in ``sub`` standing for block inputs (a body returns them unchanged)."""
    refs = []
    for outer in outers:
        ref = Ref(None)
        sub.env[ref] = outer
        refs.append(ref)
    return refs


def _inline(w: Walker, closed, operands: list, caller) -> list:
    """Run a jaxpr here, in this block: a nested walker's steps read this block's values
    by name and are appended to it. Returns the block names of its outputs."""
    refs, env, _ = _enter(w, operands, [])
    eqns, outs = flatten_closed(closed, refs, w.shared.traced, caller)
    sub = w.nested("inline", env)
    block = sub.block([], eqns, outs)
    w.steps.extend(block.steps)
    return list(block.outputs)


# -- scan ----------------------------------------------------------------------------------------

@CONTROL.register("scan")
def convert_scan(w: Walker, eqn, index: int) -> None:
    """``carry, ys = scan(body, carry, xs)`` as a Loop over ``length`` steps: the body reads
    step i of each xs by a gather (``length-1-i`` reversed), ys are stacked by the Loop (and
    put back in order after it where reversed)."""
    p = eqn.params
    n_consts, n_carry, length = p["num_consts"], p["num_carry"], dim_of(p["length"])
    reverse = bool(p.get("reverse", False))
    consts = eqn.ins[:n_consts]
    carry = [w.pin(x) for x in eqn.ins[n_consts:n_consts + n_carry]]
    xs = [w.pin(x) for x in eqn.ins[n_consts + n_carry:]]
    w.close(index, keep=[*carry, *xs, *[x for x in consts if isinstance(x, Ref)]])
    passed = _passed(w, consts)
    refs, env, inputs = _enter(w, [*carry, *consts, *xs], [*carry, *passed, *xs])
    counter = Boundary(w.shared.fresh("i"), TensorType((), DType.i64))
    sub = w.nested("scan", env)
    slices = []
    with sub.builder.active():
        i = sub.read(_refs_of(sub, [counter])[0])
        step = ops.sub(_last(length), i) if reverse else i
        for r in refs[len(carry) + len(consts):]:
            x_t = Ref(None)
            sub.env[x_t] = ops.squeeze(ops.gather(sub.read(r), ops.reshape(step, 1), 0,
                                                  wrap=False), 0)
            slices.append(x_t)
    body_in = refs[len(carry):len(carry) + len(consts)] + refs[:len(carry)] + slices
    eqns, outs = flatten_closed(p["jaxpr"], body_in, w.shared.traced, eqn)
    through = [env[r] for r, x in zip(refs[len(carry):], consts + xs)
               if x in passed or x in xs]
    body = sub.block([counter, *inputs], eqns,
                     [*outs[:n_carry], *_refs_of(sub, through), *outs[n_carry:]])
    carry_out = [w.shared.fresh() for _ in range(n_carry)]
    pass_out = [w.shared.fresh() for _ in through]
    stacked = [w.shared.fresh() for _ in outs[n_carry:]]
    w.steps.append(Loop(tuple(w.env[x].name for x in carry) +
                        tuple(w.env[x].name for x in passed + xs), body,
                        tuple(carry_out + pass_out + stacked), count=length,
                        scanned=len(stacked)))
    types = [type_of(r.aval) for r in eqn.outs]
    _bind(w, eqn, carry_out, types[:n_carry])
    for ref, name, t in zip(eqn.outs[n_carry:], stacked, types[n_carry:]):
        w.env[ref] = Boundary(name, t)
        if reverse:  # the stack holds step length-1 first: put it in order
            with w.builder.active():
                w.env[ref] = ops.gather(w.read(ref), ops.sub(_last(length), ops.iota(length)),
                                        0, wrap=False)


def _last(length):
    """``length - 1`` as a number or, for a symbolic length, a scalar tensor."""
    last = as_dim(length - 1)
    return last if is_static(last) else ops.dim_tensor(last)

