"""Reification: to_torch and to_onnx against ``tdag.run``.

- every kernel (the lowering tables) through both back ends (every primitive: in
  test_records);
- traced models at several sizes of a symbolic batch: eager, ``torch.export`` of the
  reified module and ``torch.compile``; ONNX on onnxruntime with dynamic axes;
- controllers (If, counted and while loops with scans, state);
- parameter names: ``state_dict()`` keys are the Program's, ``load_state_dict`` works.
"""
from __future__ import annotations

import copy

import onnx
import pytest
import torch
import torch.nn.functional as F

import tdag
import tdag.lower
from tdag import ops
from tdag.ir.record import Trait, ops_with
from tdag.canonicalize import from_torch
from tdag.reify import to_onnx, to_torch

from support.guards import assert_close, run_onnx
from support.lowering_tables import KERNEL_PROGRAMS, random_args
from support.control_programs import (accumulator_program, affine_loop, doubling_loop, if_program,
                                      row_sum_loop)
from support.torch_models import MODELS, Fn, make_model

S = tdag.TensorSpec


def both(prog, args, lower=True, what=""):
    """tdag.run vs the torch module vs onnxruntime, on one set of inputs."""
    ref = tdag.run(prog, *args)
    assert_close(to_torch(prog, lower=lower)(*args), ref, f"torch {what}")
    assert_close(run_onnx(to_onnx(prog, lower=lower), *args), ref, f"onnx {what}")


# -- every primitive: see test_records.test_primitive_evaluator_torch_and_onnx_agree, which
# runs every differential case of every primitive through both back ends

# -- every kernel ------------------------------------------------------------------------------


def test_the_kernel_programs_cover_every_kernel():
    seen = set()
    for fn, specs in KERNEL_PROGRAMS.values():
        seen |= {n.op for n in tdag.lower.lower(tdag.trace(fn, *specs)).graph.nodes}
    assert ops_with(Trait.KERNEL) <= seen, ops_with(Trait.KERNEL) - seen


@pytest.mark.parametrize("name", list(KERNEL_PROGRAMS))
def test_every_kernel_reifies(name):
    fn, specs = KERNEL_PROGRAMS[name]
    prog = tdag.trace(fn, *specs)
    low = tdag.lower.lower(prog)
    for batch in (1, 3):
        args = random_args(prog, batch)
        ref = tdag.run(prog, *args)
        assert_close(to_torch(low, lower=False)(*args), ref, f"torch {name}")
        assert_close(run_onnx(to_onnx(low, lower=False), *args), ref, f"onnx {name}")


@pytest.mark.parametrize("width", [4, 16])  # values narrower and wider than the 8 keys
def test_attention_rows_with_every_key_masked_give_zeros(width):
    mask = torch.rand(5, 8) > 0.3
    mask[1] = False
    fn = lambda q, k, v: ops.scaled_dot_product_attention(  # noqa: E731
        q, k, v, attn_mask=ops.const(mask))
    prog = tdag.trace(fn, S(("b", 2, 5, 4)), S(("b", 2, 8, 4)), S(("b", 2, 8, width)))
    args = random_args(prog, 3)
    ref = tdag.run(prog, *args)
    assert ref[:, :, 1].abs().max() == 0
    both(prog, args, what=f"fully masked row, width {width}")


# -- traced models -----------------------------------------------------------------------------

def _block(x):
    """A pre-norm transformer block followed by a conv head, written with tdag.ops."""
    torch.manual_seed(1)
    p = lambda name, *shape: ops.param(name, torch.randn(*shape) * 0.2)  # noqa: E731
    h = ops.layer_norm(x, 16, p("ln.weight", 16), p("ln.bias", 16))
    q, k, v = (ops.linear(h, p(f"attn.{n}.weight", 16, 16), p(f"attn.{n}.bias", 16))
               for n in "qkv")
    split = lambda t: ops.transpose(ops.reshape(t, (t.shape[0], 6, 2, 8)), 1, 2)  # noqa: E731
    a = ops.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
    x = x + ops.linear(ops.reshape(ops.transpose(a, 1, 2), (x.shape[0], 6, 16)),
                       p("attn.out.weight", 16, 16))
    x = x + ops.linear(ops.gelu(ops.linear(x, p("mlp.up.weight", 32, 16))),
                       p("mlp.down.weight", 16, 32))
    img = ops.reshape(x, (x.shape[0], 16, 2, 3))
    img = ops.relu(ops.conv(img, p("head.weight", 4, 16, 3, 3), p("head.bias", 4), padding=1))
    return ops.softmax(ops.flatten(img, 1), -1), ops.max_pool(img, 2, padding=1)


@pytest.fixture(scope="module")
def block_program():
    return tdag.trace(_block, S(("batch", 6, 16)))


def test_traced_model_round_trips_at_several_batch_sizes(block_program):
    module = to_torch(block_program)
    model = to_onnx(block_program)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    # attn.q's weight is stored transposed, as the product reads it: a const of that name
    assert {i.name for i in model.graph.initializer} >= {"ln.weight", "const_attn.q.weight"}
    for batch in (1, 2, 5):
        x = torch.randn(batch, 6, 16)
        ref = tdag.run(block_program, x)
        assert_close(module(x), ref, f"torch at batch {batch}")
        assert_close(run_onnx(model, x), ref, f"onnx at batch {batch}")


def test_reified_module_exports_with_a_dynamic_batch(block_program):
    module = to_torch(block_program)
    batch = torch.export.Dim("batch", min=1, max=64)
    exported = torch.export.export(module, (torch.randn(2, 6, 16),),
                                   dynamic_shapes=({0: batch},))
    for n in (1, 3):
        x = torch.randn(n, 6, 16)
        assert_close(exported.module()(x), tdag.run(block_program, x), f"export at {n}")


def test_reified_module_runs_under_torch_compile(block_program):
    module = to_torch(block_program)
    compiled = torch.compile(module, backend="aot_eager", dynamic=True)
    for n in (2, 3):
        x = torch.randn(n, 6, 16)
        assert_close(compiled(x), tdag.run(block_program, x), f"compiled at {n}")


@pytest.mark.slow
def test_reified_module_runs_under_inductor(block_program):
    compiled = torch.compile(to_torch(block_program))
    x = torch.randn(2, 6, 16)
    assert_close(compiled(x), tdag.run(block_program, x), "inductor")


def test_one_output_is_a_tensor_several_a_tuple():
    single = to_torch(tdag.trace(lambda x: x * 2.0, S((3,))))
    assert isinstance(single(torch.ones(3)), torch.Tensor)
    pair = to_torch(tdag.trace(lambda x: (x, x * 2.0), S((3,))))
    assert isinstance(pair(torch.ones(3)), tuple)


def test_parameters_nest_by_their_dotted_names(block_program):
    module = to_torch(block_program)
    names = set(module.state_dict())
    assert "attn.q.weight" in names and "head.bias" in names
    assert isinstance(module.attn.q.weight, torch.nn.Parameter)
    assert not any(n.startswith("_tdag") for n in names)  # consts are not state
    module.load_state_dict({k: torch.zeros_like(v) for k, v in module.state_dict().items()})
    assert module.attn.q.weight.abs().sum() == 0


def test_source_state_dict_loads_strict_with_unread_buffers():
    """An eval-mode batch norm never reads num_batches_tracked: the module holds no tensor for
    it, yet loads the source model's state dict strict (inside a parent module too, under
    its prefix); a key the program does not name is still refused."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU()).eval()
    x = torch.randn(2, 3, 16, 16)
    module = to_torch(from_torch(model, (x,)))
    assert "1.num_batches_tracked" not in module.state_dict()
    trained = copy.deepcopy(model)
    with torch.no_grad():
        trained[1].running_mean.add_(1.0)
        trained[0].weight.mul_(2.0)
    module.load_state_dict(trained.state_dict())
    with torch.no_grad():
        assert_close(module(x), trained(x), "loaded")
    parent = torch.nn.Sequential(module)
    parent.load_state_dict({f"0.{k}": v for k, v in model.state_dict().items()})
    with torch.no_grad():
        assert_close(parent(x), model(x), "loaded under a prefix")
    with pytest.raises(RuntimeError, match="Unexpected key.*2.weight"):
        module.load_state_dict({**model.state_dict(), "2.weight": torch.zeros(1)})


def test_generated_code_frees_intermediates_and_reads_weights_directly(block_program):
    code = to_torch(block_program).code
    assert "\n    del " in code  # eager frees each value after its last use; so must we
    assert "self._modules['attn']._modules['q'].weight" in code  # no nn.Module.__getattr__ chain


def test_parametrized_weights_still_apply(block_program):
    """Weights are read as attributes, so torch's parametrizations (properties) work."""
    from torch.nn.utils import parametrize

    class Zero(torch.nn.Module):
        def forward(self, w):
            return torch.zeros_like(w)

    module, x = to_torch(block_program), torch.randn(2, 6, 16)
    before = module(x)
    parametrize.register_parametrization(module.head, "weight", Zero())
    after = module(x)
    pooled = torch.relu(module.head.bias).reshape(1, 4, 1, 1).expand_as(after[1])
    assert not torch.equal(before[1], pooled) and torch.equal(after[1], pooled)


def _dead(model: onnx.ModelProto) -> tuple[list, list]:
    """Nodes whose outputs nothing reads and initializers no node reads (subgraphs too)."""
    from tdag.reify.onnx.graph import all_graphs
    graphs = all_graphs(model.graph)
    read = {o.name for g in graphs for o in g.output} | \
        {i for g in graphs for n in g.node for i in n.input}
    nodes = [n.name for g in graphs for n in g.node if not any(o in read for o in n.output)]
    return nodes, [t.name for t in model.graph.initializer if t.name not in read]


def test_onnx_has_no_dead_nodes_or_unread_initializers(block_program):
    from tdag.models import tiny_vit
    model, (images,) = tiny_vit()
    for prog in (block_program, tdag.from_torch(model, (images,), dynamic_batch=True),
                 row_sum_loop(), if_program()):
        assert _dead(to_onnx(prog)) == ([], [])


def test_onnx_outputs_are_written_by_their_producers():
    """No Identity copies for outputs, except a value returned twice or an input returned."""
    prog = tdag.trace(lambda x: (ops.exp(x), x, ops.exp(x) * 2.0), S(("b", 3)))
    model = to_onnx(prog, lower=False)
    assert [n.op_type for n in model.graph.node].count("Identity") == 1  # x itself
    x = torch.randn(2, 3)
    assert_close(run_onnx(model, x), tdag.run(prog, x))
    twice = to_onnx(tdag.trace(lambda x: (ops.exp(x), ops.exp(x)), S((3,))))
    assert_close(run_onnx(twice, x[0]), (x[0].exp(), x[0].exp()))


def test_prune_drops_dead_chains_in_subgraphs_and_their_initializers():
    from onnx import helper
    from tdag.reify.onnx.graph import GraphBuilder, prune
    g = GraphBuilder(20)
    x = "x"
    unused = g.node("Add", [g.node("Mul", [x, g.const(3.0, tdag.DType.f32)]), x])  # dead chain
    sub = g.child()
    sub.node("Neg", [sub.const(7.0, tdag.DType.f32)])  # dead inside the branch
    out = sub.node("Identity", [x])
    info = lambda n: helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2])  # noqa: E731
    branch = sub.graph("then", [], [info(out)])
    y = g.node("If", [g.const(True, tdag.DType.bool)], then_branch=branch, else_branch=branch)
    graph = g.graph("t", [info(x)], [info(y)])
    assert unused and len(graph.initializer) == 3
    prune(graph)
    assert [n.op_type for n in graph.node] == ["If"]
    assert [n.op_type for n in graph.node[0].attribute[0].g.node] == ["Identity"]
    assert len(graph.initializer) == 1  # the condition


def test_unlowered_programs_reify_too(block_program):
    x = torch.randn(2, 6, 16)
    both(block_program, [x], lower=False, what="unlowered")


# -- controllers -------------------------------------------------------------------------------

@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_if_reifies(sign):
    prog = if_program()
    both(prog, [sign * (torch.rand(3, 3) + 0.1)], what="if")
    assert "if bool(" in to_torch(prog).code


def test_counted_loop_reifies():
    both(affine_loop(5), [torch.randn(3, 4)], what="loop")


@pytest.mark.parametrize("n", [1, 4])
def test_symbolic_loop_with_scans_reifies(n):
    x = torch.randint(-5, 6, (n, 3)).float()
    both(row_sum_loop(), [x], what="scan loop")


@pytest.mark.parametrize("count", [None, 3])
def test_while_loop_reifies(count):
    prog = doubling_loop(count)
    both(prog, [torch.tensor([1.0, 2.0])], what="while loop")
    assert "while " in to_torch(prog).code


def test_state_is_a_buffer_the_module_updates():
    prog = accumulator_program(steps=5)
    module = to_torch(prog)
    x = torch.tensor([[1.0, 2.0]])
    assert_close(module(x), tdag.run(prog, x))
    assert module.total.item() == 15.0
    # ONNX holds no state: it is an input (its initializer the default) carried through the
    # loop and returned after the outputs as total.next
    model = to_onnx(prog)
    assert [o.name for o in model.graph.output][-1] == "total.next"
    y, total = run_onnx(model, x)
    assert_close(y, tdag.run(prog, x))
    assert total.item() == 15.0
    assert run_onnx(model, x, total)[1].item() == 30.0  # fed back, carried on


def test_state_written_by_a_call_is_an_onnx_output():
    prog = accumulator_program()
    x = torch.tensor([[1.0, 2.0]])
    y, total = run_onnx(to_onnx(prog), x)
    assert_close(y, x)
    assert total.item() == 3.0


# -- from_torch round trips ---------------------------------------------------------------------

@pytest.mark.parametrize("name", list(MODELS))
def test_torch_to_tdag_to_torch_and_onnx(name):
    model, inputs = make_model(name)
    prog = from_torch(model, inputs(2), dynamic_batch=True)
    module, onnx_model = to_torch(prog), to_onnx(prog)
    # the module's state dict is the source's: it holds no tensor for a buffer the forward
    # never reads (BatchNorm's num_batches_tracked) and takes its key all the same; a
    # non-persistent buffer (a rotary inv_freq) is a const, in neither state dict
    assert set(module.state_dict()) <= set(model.state_dict())
    module.load_state_dict(model.state_dict())
    for batch in (2, 3, 1):
        args = inputs(batch)
        with torch.no_grad():
            ref = tuple(torch.utils._pytree.tree_leaves(model(*args)))
            got = module(*args)
        assert_close(got, ref, f"{name} torch at batch {batch}")
        assert_close(run_onnx(onnx_model, *args), ref, f"{name} onnx at batch {batch}")


def test_a_program_with_no_tensor_out():
    """torch.broadcast_shapes() computes sizes only: the torch module returns () as eager
    does, and ONNX, whose graphs need an output, refuses by name."""
    prog = from_torch(Fn(lambda x: torch.broadcast_shapes()), (torch.ones(2),))
    assert to_torch(prog)(torch.ones(2)) == ()
    with pytest.raises(tdag.UnsupportedOpError, match="computes no tensor"):
        to_onnx(prog)


def test_avg_pool_with_a_divisor_override():
    """OpInfo's first avg_pool2d sample: ceil mode, padding not counted, divisor 2 (one
    constant, not a table of counts)."""
    def pool(x):
        return torch.nn.functional.avg_pool2d(x, 3, 1, 1, True, False, 2)
    x = torch.randn(1, 3, 9, 9)
    prog = from_torch(Fn(pool), (x,))
    assert_close(to_torch(prog)(x), pool(x))
    assert_close(run_onnx(to_onnx(prog), x), pool(x))


def test_grouped_query_attention_reads_keys_and_values_unrepeated():
    """transformers' repeat_kv (reshape, expand, reshape of each k and v over the query
    heads' groups) before attention: the torch code passes SDPA the unrepeated k and v with
    ``enable_gqa=True`` and never writes the repeat; the rotary embedding of q and k is one
    ``_rt.rotary`` call each; eager's values with and without autograd, and
    ``tdag.memory`` equal to MemTracker's peak (no repeated copy in either)."""
    transformers = pytest.importorskip("transformers")
    from support.mem_tracker import measured_peak
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=128, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2,
                                      intermediate_size=256, vocab_size=100, use_cache=False)
    model = transformers.LlamaModel(config).eval()
    tokens = torch.randint(0, 100, (2, 64))
    prog = from_torch(model, (tokens,))
    module = to_torch(prog)
    assert module.code.count("enable_gqa=True") == 2
    assert ".expand(-1, -1, 4, -1, -1)" not in module.code
    assert module.code.count("_rt.rotary(") == 4 and "torch.neg(" not in module.code
    with torch.no_grad():
        want = model(tokens).last_hidden_state
    with torch.inference_mode():
        assert_close(module(tokens), want, "grouped attention")
    assert_close(module(tokens), want, "autograd")
    assert tdag.memory(prog).peak == measured_peak(module, (tokens,))
    repeated = to_torch(tdag.from_torch(transformers.LlamaModel(
        transformers.LlamaConfig(**{**config.to_dict(), "num_key_value_heads": 8})).eval(),
        (tokens,)))
    assert "enable_gqa" not in repeated.code  # one k/v head per query head: nothing repeated


@pytest.mark.parametrize("cos_shape", [(1, 1, 6, 8), (2, 1, 6, 8), (6, 8)])
def test_rotary_equals_apply_rotary_pos_emb(cos_shape):
    """``_rt.rotary`` = x * cos + cat(-x2, x1) * sin on a permuted (non-contiguous) x and
    cos/sin broadcast to it, NaN and infinities kept; under autograd the composition, whose
    gradients are eager's."""
    from tdag.reify.torch import runtime
    torch.manual_seed(0)
    x = torch.randn(2, 6, 3, 8).permute(0, 2, 1, 3)
    x[0, 1, 2, 3], x[1, 0, 0, 6] = float("nan"), float("inf")
    cos, sin = torch.randn(cos_shape), torch.randn(cos_shape)

    def composed(x, cos, sin):
        return x * cos + torch.cat((-x[..., 4:], x[..., :4]), -1) * sin
    with torch.no_grad():
        torch.testing.assert_close(runtime.rotary(x, cos, sin), composed(x, cos, sin),
                                   equal_nan=True)
    leaf = x.detach().requires_grad_()
    runtime.rotary(leaf, cos, sin).nan_to_num().sum().backward()
    other = x.detach().requires_grad_()
    composed(other, cos, sin).nan_to_num().sum().backward()
    torch.testing.assert_close(leaf.grad, other.grad, equal_nan=True)


@pytest.mark.parametrize("count, weighted, eps", [(1, True, 1e-6), (2, True, 1e-5),
                                                  (1, False, None)])
def test_rms_norm_equals_torchs(count, weighted, eps):
    """``_rt.rms_norm`` (a vector norm, then x * rstd and the weight in place) is
    F.rms_norm to float32 rounding on a permuted x, over one or two trailing axes, eps None
    as float32's machine epsilon; NaN and infinities as F.rms_norm gives them; half
    precision and autograd take F.rms_norm itself."""
    from tdag.reify.torch import runtime
    torch.manual_seed(0)
    x = torch.randn(3, 6, 5, 8).permute(0, 2, 1, 3)
    x[0, 1, 2, 3], x[1, 0, 0, 6] = float("nan"), float("inf")
    shape = x.shape[x.dim() - count:]
    weight = torch.randn(shape) if weighted else None
    want = F.rms_norm(x.double(), shape, None if weight is None else weight.double(), eps)
    got = runtime.rms_norm(x, count, weight, eps)
    assert got.dtype == torch.float32 and got.shape == x.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6, equal_nan=True)
    half = x.half()
    torch.testing.assert_close(runtime.rms_norm(half, count, None, eps),
                               F.rms_norm(half, shape, None, eps), equal_nan=True)
    leaf = x.nan_to_num(0.0, 0.0, 0.0).requires_grad_()
    runtime.rms_norm(leaf, count, weight, eps).sum().backward()
    other = leaf.detach().requires_grad_()
    F.rms_norm(other, shape, weight, eps).sum().backward()
    torch.testing.assert_close(leaf.grad, other.grad)
