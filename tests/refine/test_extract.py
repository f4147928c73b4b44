"""extract / replace / compose: a block taken out runs alone and reproduces its values in the
full model; splicing it back (or something of the same type) keeps the program sound."""
from __future__ import annotations

import onnxruntime as ort
import pytest
import torch

import tdag
from tdag import ops
from tdag.refine import compose, extract, replace

from support.refine_programs import close, from_torch, model, outputs, scoped_mlp


def captured(prog, names, *args) -> tuple:
    """The values of ``names`` inside ``prog`` when it runs on ``args``."""
    probe = extract(prog, inputs=[v.name for v in prog.inputs], outputs=names)
    return outputs(probe, *args)


def check_block(prog, sub, *args):
    """``sub`` run on its captured inputs gives its captured outputs."""
    tdag.verify(sub)
    g = sub.graph
    values = captured(prog, [v.name for v in g.inputs] + list(g.outputs), *args)
    k = len(g.inputs)
    assert close(outputs(sub, *values[:k]), values[k:])


# -- by boundary names --------------------------------------------------------------------

def test_extract_by_inputs_and_outputs_keeps_only_what_it_needs():
    prog = scoped_mlp(depth=3)
    g = prog.graph
    # the residual adds end each layer
    ends = [[n.name for n in g.nodes if n.origin.scope == f"encoder.layer.{i}"][-1]
            for i in range(3)]
    sub = extract(prog, inputs=[ends[0]], outputs=[ends[1]])
    tdag.verify(sub)
    assert set(sub.graph.weights) - {k for k in sub.graph.weights if k.startswith("c")} == \
        {"encoder.layer.1.weight", "encoder.layer.1.bias"}
    x = torch.randn(4, 16)
    check_block(prog, sub, x)


def test_extract_needs_every_input_it_depends_on():
    prog = tdag.trace(lambda x, y: ops.exp(x) + y, tdag.TensorSpec((3,)), tdag.TensorSpec((3,)))
    out = prog.graph.outputs[0]
    with pytest.raises(tdag.TdagError, match="not among the inputs"):
        extract(prog, inputs=["x"], outputs=[out])
    with pytest.raises(tdag.TdagError, match="no tensor"):
        extract(prog, inputs=["x", "y"], outputs=["nope"])


# -- by scope -----------------------------------------------------------------------------

def test_extract_by_scope_runs_standalone():
    prog = scoped_mlp(depth=3)
    sub = extract(prog, scope="encoder.layer.1")
    assert {n.origin.scope for n in sub.graph.nodes} == {"encoder.layer.1"}
    assert len(sub.graph.inputs) == 1 and len(sub.graph.outputs) == 1
    check_block(prog, sub, torch.randn(5, 16))
    whole = extract(prog, scope="encoder")
    assert len(whole.graph.nodes) > 2 * len(sub.graph.nodes)
    check_block(prog, whole, torch.randn(5, 16))


BLOCKS = [("encoder", "encoder.layers.1"), ("decoder", "layers.1"), ("decoder", "layers.0.mlp"),
          ("cnn", "block"), ("unet", "down")]


@pytest.mark.parametrize("name,scope", BLOCKS, ids=[f"{n}:{s}" for n, s in BLOCKS])
def test_a_model_block_reproduces_its_values_and_splices_back(name, scope):
    module, args = model(name)
    prog = from_torch(name)
    example = args(3)
    sub = extract(prog, scope=scope)
    check_block(prog, sub, *example)
    # only the block's own weights come along
    params = {k for k, w in sub.graph.weights.items() if w.kind is tdag.TensorKind.parameter}
    assert params and all(k.startswith(scope + ".") for k in params)
    spliced = replace(prog, scope, sub)
    tdag.verify(spliced)
    assert close(outputs(spliced, *example), outputs(prog, *example), atol=0)
    assert spliced.num_nodes == prog.num_nodes
    again = replace(prog, sub, sub)
    assert close(outputs(again, *example), outputs(prog, *example), atol=0)


def test_an_extracted_block_exports_to_onnx():
    prog = from_torch("decoder")
    sub = extract(prog, scope="layers.1")
    values = captured(prog, [v.name for v in sub.graph.inputs] + list(sub.graph.outputs),
                      *model("decoder")[1](2))
    proto = tdag.to_onnx(sub)
    session = ort.InferenceSession(proto.SerializeToString())
    feeds = {i.name: v.numpy() for i, v in zip(session.get_inputs(), values)}
    got = session.run(None, feeds)
    assert torch.allclose(torch.from_numpy(got[0]), values[-1], atol=1e-4)


def test_an_unknown_scope_lists_the_known_ones():
    with pytest.raises(tdag.TdagError, match="top-level scopes: \\['encoder', 'head'\\]"):
        extract(scoped_mlp(), scope="decoder")


def test_a_scope_that_leaves_and_comes_back_is_refused():
    from tdag.ops.builder import active_builder

    def fn(x):
        b = active_builder()
        with b.scope(tdag.Origin("op", "block")):
            y = ops.exp(x)
        z = ops.neg(y)  # outside the block, between its two halves
        with b.scope(tdag.Origin("op", "block")):
            return ops.tanh(z) + y

    prog = tdag.trace(fn, tdag.TensorSpec((3,)))
    with pytest.raises(tdag.InvalidModelError, match="not convex"):
        extract(prog, scope="block")


# -- replace ------------------------------------------------------------------------------

def test_replace_with_another_implementation():
    prog = scoped_mlp(depth=2)
    sub = extract(prog, scope="encoder.layer.1")
    (x,) = sub.graph.inputs
    identity = tdag.trace(lambda h: h * 1.0, tdag.TensorSpec(x.type.shape))
    spliced = replace(prog, "encoder.layer.1", identity)
    tdag.verify(spliced)
    assert "encoder.layer.1.weight" not in spliced.graph.weights
    # layer 1 now passes its input through: the output is the head on layer 0's output
    inputs = torch.randn(3, 16)
    (middle,) = captured(prog, [x.name], inputs)
    assert close(outputs(spliced, inputs), (torch.softmax(middle, -1),))


def test_replace_checks_types():
    prog = scoped_mlp(depth=2)
    wrong = tdag.trace(lambda h: ops.sum(h, -1), tdag.TensorSpec(("b", 16)))
    with pytest.raises(tdag.ShapeError, match="outputs are"):
        replace(prog, "encoder.layer.0", wrong)
    wrong = tdag.trace(lambda h: h, tdag.TensorSpec(("b", 8)))
    with pytest.raises(tdag.ShapeError, match="inputs are"):
        replace(prog, "encoder.layer.0", wrong)


def test_replace_renames_clashing_weights():
    prog = scoped_mlp(depth=2, seed=0)
    other = extract(scoped_mlp(depth=2, seed=1), scope="encoder.layer.1")
    spliced = replace(prog, "encoder.layer.1", other)
    tdag.verify(spliced)
    names = set(spliced.graph.weights)
    assert "encoder.layer.1.weight" not in names
    assert {"encoder.layer.1.weight_1", "encoder.layer.1.bias_1"} <= names
    x = torch.randn(2, 16)
    assert not close(outputs(spliced, x), outputs(prog, x))


# -- compose ------------------------------------------------------------------------------

def test_compose_chains_two_programs():
    a = scoped_mlp(depth=1, seed=0)
    b = tdag.trace(lambda p: ops.log(p) * 2.0, tdag.TensorSpec(("b", 16)))
    ab = compose(a, b)
    tdag.verify(ab)
    x = torch.randn(3, 16)
    assert close(outputs(ab, x), outputs(b, *outputs(a, x)))
    twice = compose(a, a)
    tdag.verify(twice)
    assert close(outputs(twice, x), outputs(a, *outputs(a, x)))
    assert len(twice.graph.weights) == len(a.graph.weights)  # the same weights, shared


def test_compose_of_multi_step_programs_keeps_their_controllers():
    from tdag.ir.graph import Value
    from tdag.ir.program import Block, Call, Program
    a = scoped_mlp(depth=1)
    g = a.graph
    x = Value("x", g.inputs[0].type)
    two_calls = Program({"f": g}, Block((x,), (Call("f", ("x",), ("y",)),
                                               Call("f", ("y",), ("z",))),
                                        ("z",)))
    chained = compose(two_calls, two_calls)
    tdag.verify(chained)
    assert len(chained.main.steps) == 4
    inp = torch.randn(2, 16)
    assert close(outputs(chained, inp), outputs(two_calls, *outputs(two_calls, inp)))


def test_compose_checks_types():
    a = tdag.trace(lambda x: ops.sum(x, -1), tdag.TensorSpec((3, 4)))
    with pytest.raises(tdag.ShapeError, match="compose"):
        compose(a, a)
