"""The one rewrite engine (tdag/ir/rewrite.py) under simplify and lower: its return
convention, rules indexed by root op, reasons kept in explain mode, ``tdag.lower.explain``
and ``tdag explain`` on the command line."""
from __future__ import annotations

import inspect

import pytest
import torch

import tdag
import tdag.lower
from tdag import ops
from tdag.cli import main
from tdag.ir.op import Op
from tdag.ir.record import Trait, ops_with
from tdag.ir.rewrite import (Alias, NoMatch, Replace, Rule, RuleError, RuleSet, Trace,
                             explaining, node_kind, rewrite)
from tdag.lower import activations, attention, contraction, conv, match, movement, norms, \
    pool, recurrent, resize, softmax
from tdag.refine import rules as simplify_rules

S = tdag.TensorSpec


def _graph(fn, *shapes):
    return tdag.trace(fn, *(S(s) for s in shapes)).graph


# -- the return convention ---------------------------------------------------------------------

@pytest.mark.parametrize("wrong", [None, "x", 0])
def test_a_wrong_return_type_is_an_error_not_a_no_op(wrong):
    graph = _graph(lambda x: ops.exp(x), (2, 3))
    rules = RuleSet([Rule(Op.exp, lambda node, ctx: wrong)])
    with pytest.raises(RuleError, match="returns Replace, Alias or NoMatch"):
        rewrite(graph, rules)
    with pytest.raises(TypeError):  # a RuleError is a TypeError too
        rewrite(graph, rules)


def test_a_node_returned_bare_is_an_error():
    """The old peephole convention (a bare replacement Node) fails loudly."""
    graph = _graph(lambda x: ops.exp(x), (2, 3))
    rules = RuleSet([Rule(Op.exp, lambda node, ctx: node.replace(op=Op.neg))])
    with pytest.raises(RuleError):
        rewrite(graph, rules)


def test_a_replacement_must_keep_the_name():
    graph = _graph(lambda x: ops.exp(x), (2, 3))
    rules = RuleSet([Rule(Op.exp, lambda node, ctx: Replace((node.replace(name="other"),)))])
    with pytest.raises(RuleError, match="replaced"):
        rewrite(graph, rules)


def test_replace_alias_and_no_match():
    graph = _graph(lambda x: ops.neg(ops.exp(ops.exp(x))), (2, 3))
    rules = RuleSet([
        Rule(Op.exp, lambda node, ctx: Replace((node.replace(op=Op.tanh),))),
        Rule(Op.neg, lambda node, ctx: Alias(node.inputs[0])),
    ])
    out, changed = rewrite(graph, rules)
    assert changed and [n.op for n in out.nodes] == [Op.tanh, Op.tanh]
    assert out.outputs == (out.nodes[-1].name,)  # the neg's readers read its input now
    nothing = RuleSet([Rule(Op.exp, lambda node, ctx: NoMatch("never"))])
    assert rewrite(graph, nothing) == (graph, False)


def test_an_alias_of_another_type_is_not_taken():
    """x * 1 with x broadcast is not x: the engine refuses the alias, as a non-match."""
    graph = _graph(lambda x: ops.exp(ops.sum(x, 1)), (2, 3))
    rules = RuleSet([Rule(Op.exp, lambda node, ctx: Alias(graph.inputs[0].name))])
    trace = Trace()
    with explaining(trace):
        assert rewrite(graph, rules) == (graph, False)
    (look,) = trace.looks
    assert not look.fired and "another type" in look.outcome


def test_the_kinds_a_rule_checks_include_nodes_rewritten_earlier_in_the_sweep():
    """``Context.has_kinds``, a rule's cheap check that a template's nodes exist before it
    searches (tdag/lower/backward.py), sees the graph as rewritten so far."""
    graph = _graph(lambda x: ops.exp(ops.exp(x)), (2, 3))
    exp = frozenset({node_kind(graph.nodes[0])})
    tanh = frozenset({node_kind(graph.nodes[0].replace(op=Op.tanh))})
    seen = []

    def to_tanh(node, ctx):
        seen.append((ctx.has_kinds(exp), ctx.has_kinds(tanh), ctx.has_kinds(exp | tanh)))
        return Replace((node.replace(op=Op.tanh),))
    rewrite(graph, RuleSet([Rule(Op.exp, to_tanh)]))
    assert seen == [(True, False, False), (True, True, True)]


def test_rules_are_called_only_on_their_op():
    graph = _graph(lambda x, y: ops.exp(x * y) + x * 2.0, (2, 3), (2, 3))
    seen = []

    def on_add(node, ctx):
        seen.append(node.op)
        return NoMatch("looking only")
    rewrite(graph, RuleSet([Rule(Op.add, on_add)]))
    assert seen == [Op.add]  # never the multiplies or the exp


def test_simplify_reapplies_rules_to_a_replacement():
    """A budget above 1 rewrites a replaced node again in the same sweep."""
    graph = _graph(lambda x: ops.exp(x), (2,))
    chain = {Op.exp: Op.neg, Op.neg: Op.tanh}
    rules = [Rule(op, lambda node, ctx: Replace((node.replace(op=chain[node.op]),)))
             for op in chain]
    assert rewrite(graph, RuleSet(rules, budget=4))[0].nodes[0].op is Op.tanh
    assert rewrite(graph, RuleSet(rules, budget=1))[0].nodes[0].op is Op.neg


def test_a_normal_run_records_nothing_and_a_trace_records_reasons():
    graph = _graph(lambda x: ops.permute(ops.exp(x), 1, 0) * 3.0, (2, 3))
    assert simplify_rules.rewrite(graph) == (graph, False)
    trace = Trace()
    with explaining(trace):
        simplify_rules.rewrite(graph)
    reasons = {look.rule: look.outcome for looks in trace.by_node().values()
               for look in looks}
    assert reasons["_identity_permute"] == "not the identity permutation"
    assert reasons["_mul_one"] == "no operand is a constant 1"


# -- rules as data -----------------------------------------------------------------------------

LOWER_RULES = {module.__name__: module.RULES for module in (
    activations, attention, contraction, conv, movement, norms, pool, recurrent, resize,
    softmax)}
LOWER_RULES.update({"tdag.lower.fuse": contraction.FUSE_RULES + conv.FUSE_RULES +
                    norms.AFFINE_RULES})


@pytest.mark.parametrize("module", sorted(LOWER_RULES))
def test_lowering_rules_are_data_with_their_pattern(module):
    for rule in LOWER_RULES[module]:
        assert isinstance(rule, Rule) and isinstance(rule.op, Op)
        source = inspect.getsource(inspect.getmodule(rule.fn))
        line = next(l for l in source.splitlines()
                    if f"Rule(Op.{rule.op.name}, {rule.fn.__name__})," in l)
        assert "->" in line.split("#", 1)[1], line


def test_the_matchers_sets_are_within_their_traits():
    assert match.BROADCAST <= ops_with(Trait.KEEPS_VALUES)
    assert match.POINTWISE_UNARY <= ops_with(Trait.UNARY)


# -- explain -----------------------------------------------------------------------------------

def _matmul():
    return tdag.trace(lambda a, b: ops.matmul(a, b), S(("b", 4, 8)), S((8, 3)))


def _conv_with_two_weight_outputs(x):
    """x[N, H, W, C] windows times w[C, kh, kw, Co, E]: two weight axes kept in the output,
    which no convolution has (an einsum, not a conv)."""
    w = ops.param("w", torch.randn(4, 3, 3, 5, 2))
    win = ops.unfold(ops.unfold(x, 1, 3), 2, 3)                   # [N, Ho, Wo, C, kh, kw]
    win = ops.unsqueeze(ops.unsqueeze(win, 6), 7)                # [..., 1, 1]
    return ops.sum(win * w, (3, 4, 5))                           # [N, Ho, Wo, Co, E]


def test_explain_a_matmul_that_lowered():
    prog = _matmul()
    out = prog.graph.outputs[0]
    why = tdag.lower.explain(prog, f"%{out}")
    assert why.op is Op.reduce and why.final is Op.einsum and why.lowered
    fired = [look for look in why.looks if look.fired]
    assert [(look.rule, look.where[-1][0], look.outcome) for look in fired] == \
        [("contraction_rule", "contraction", "einsum")]
    text = str(why)
    assert f"%{out} in main: reduce -> einsum (a kernel)" in text
    assert "contraction_rule" in text and "became einsum" in text
    assert tdag.lower.explain(prog, out) == why  # with or without the %


def test_explain_a_conv_that_did_not_lower():
    prog = tdag.trace(_conv_with_two_weight_outputs, S(("b", 7, 7, 4)))
    assert Op.conv not in {n.op for n in tdag.lower.lower(prog).graph.nodes}
    why = tdag.lower.explain(prog, prog.graph.outputs[0])
    refused = [look for look in why.looks if look.rule == "conv_rule"]
    assert refused and not any(look.fired for look in refused)
    assert all(look.op is Op.einsum for look in refused)
    assert "the axes are not a convolution's" in refused[0].outcome
    assert "conv_rule" in str(why) and "no match: the axes are not a convolution's" in str(why)
    assert why.final is Op.einsum


def test_explain_a_node_that_left_the_program():
    prog = _matmul()
    product = next(n.name for n in prog.graph.nodes if n.op is Op.multiply)
    why = tdag.lower.explain(prog, product)
    assert why.final is None and not why.lowered
    assert "left the program" in why.looks[-1].outcome
    assert "gone from the lowered program" in str(why)


def test_explain_unknown_names_are_errors_with_close_names():
    prog = _matmul()
    out = prog.graph.outputs[0]
    with pytest.raises(tdag.TdagError, match=f"no node %{out}x .*close names: %{out}"):
        tdag.lower.explain(prog, f"%{out}x")
    with pytest.raises(tdag.TdagError, match="not a node"):
        tdag.lower.explain(prog, "%a")
    with pytest.raises(tdag.TdagError, match="no TDAG 'nope'"):
        tdag.lower.explain(prog, out, graph="nope")


def test_cli_explain(tmp_path, capsys):
    prog = _matmul()
    path = tmp_path / "matmul.tdag"
    tdag.save(prog, str(path))
    out = prog.graph.outputs[0]
    assert main(["explain", str(path), f"%{out}"]) == 0
    text = capsys.readouterr().out
    assert text.strip() == str(tdag.lower.explain(prog, out))
    assert "contraction_rule" in text
    assert main(["explain", str(path), "%zzz"]) == 1
    err = capsys.readouterr().err
    assert "no node %zzz" in err and "Traceback" not in err
