"""strip_batch / add_batch: the per-sample program, stacked over samples, is the batched one;
ops that mix samples are refused by name."""
from __future__ import annotations

import importlib
import inspect
import re

import pytest
import torch

import tdag
import tdag.lower
from tdag import ops
from tdag.ir.batching import Aligned, AxisRule, OperandRule, Refuse
from tdag.ir.graph import Value
from tdag.ir.op import Op
from tdag.ir.program import Block, Call, Loop, Program
from tdag.ir.record import REGISTRY, record
from tdag.refine import BatchError, add_batch, simplify, strip_batch

from support.refine_programs import MODELS, close, from_torch, model, outputs, scoped_mlp


def per_sample(prog, args, axis=0, out_axis=0) -> tuple:
    """Run ``prog`` on each sample of ``args`` (along ``axis``) and stack the results (along
    ``out_axis``)."""
    runs = [outputs(prog, *[a.select(axis, i) for a in args]) for i in range(args[0].shape[axis])]
    return tuple(torch.stack([r[j] for r in runs], out_axis) for j in range(len(runs[0])))


def check_strip(prog, args, axis=0, out_axis=0, atol=1e-5):
    tdag.verify(prog)
    stripped = strip_batch(prog, axis)
    tdag.verify(stripped)
    assert close(per_sample(stripped, args, axis, out_axis), outputs(prog, *args), atol)
    return stripped


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("dynamic", [True, False], ids=["symbolic", "static"])
def test_stripped_model_run_per_sample_and_stacked_equals_the_batch(name, dynamic):
    module, args = model(name)
    stripped = check_strip(from_torch(name, dynamic), args(2))
    assert all(t.rank == a.dim() - 1 for t, a in zip(stripped.input_types, args(2)))


# the tagger's LSTM is a Loop whose carried state starts unbatched (zeros) and becomes batched
# in the body: add_batch widens it before the loop
@pytest.mark.parametrize("name", MODELS)
def test_add_batch_of_strip_batch_runs_like_the_model_at_any_batch(name):
    module, args = model(name)
    prog = from_torch(name)
    rebatched = add_batch(strip_batch(prog), "n")
    tdag.verify(rebatched)
    for b in (1, 3, 5):
        example = args(b)
        assert close(outputs(rebatched, *example), outputs(prog, *example))
        with torch.no_grad():
            expected = module(*example)
        if not isinstance(expected, (tuple, torch.Tensor)):
            expected = tuple(vars(expected).values())
        assert close(outputs(rebatched, *example),
                     expected if isinstance(expected, tuple) else (expected,), atol=1e-4)


def test_symbolic_batch_is_gone_after_stripping():
    stripped = strip_batch(scoped_mlp(batch="b"))
    for node in stripped.graph.nodes:
        assert "b" not in str(node.type), node


# -- reshapes that fold the batch into another axis ----------------------------------------

W = torch.randn(6, 8)


def torch_style_linear(x):
    """[b, s, d] -> [b*s, d] @ w -> [b, s, n], as torch's linear decomposes."""
    b, s, d = x.shape
    flat = ops.reshape(x, (b * s, d))
    out = ops.matmul(flat, ops.param("w", W.T)) + ops.param("bias", torch.randn(6))
    return ops.reshape(out, (b, s, 6))


def heads_in_batch(x):
    """[b, s, h*d] -> [b*h, s, d] (batch outermost of b*h), attention, back."""
    b, s, hd = x.shape
    q = ops.reshape(ops.permute(ops.reshape(x, (b, s, 2, hd // 2)), 0, 2, 1, 3),
                    (b * 2, s, hd // 2))
    scores = ops.softmax(ops.matmul(q, ops.transpose(q, 1, 2)), -1)
    out = ops.reshape(ops.matmul(scores, q), (b, 2, s, hd // 2))
    return ops.reshape(ops.permute(out, 0, 2, 1, 3), (b, s, hd))


def seq_first(x):
    """[s, b, d] -> [s*b, d]: the batch as an inner factor of a merged axis."""
    s, b, d = x.shape
    flat = ops.tanh(ops.reshape(x, (s * b, d)))
    return ops.sum(ops.reshape(flat, (s, b, d)), 0)


FOLDS = [("torch_linear", torch_style_linear, (3, 5, 8), 0),
         ("heads_in_batch", heads_in_batch, (3, 5, 8), 0),
         ("seq_first", seq_first, (4, 3, 8), 1)]


@pytest.mark.parametrize("name,fn,shape,axis", FOLDS, ids=[f[0] for f in FOLDS])
@pytest.mark.parametrize("batch", ["b", None], ids=["symbolic", "static"])
def test_reshapes_folding_the_batch_are_split_back(name, fn, shape, axis, batch):
    spec = list(shape)
    if batch:
        spec[axis] = batch
    prog = tdag.trace(fn, tdag.TensorSpec(tuple(spec)))
    x = torch.randn(shape)
    stripped = check_strip(prog, (x,), axis, out_axis=0)
    rebatched = add_batch(stripped, "n")
    tdag.verify(rebatched)
    if axis == 0:
        assert close(outputs(rebatched, x), outputs(prog, x))


def test_broadcasts_over_the_batch_lose_their_batch_axis():
    # a zero initial state and a bias, both repeated to the batch size
    prog = tdag.trace(lambda x: ops.tanh(x + ops.zeros((x.shape[0], 4)) + 1.0) * 2.0,
                      tdag.TensorSpec(("b", 4)))
    stripped = check_strip(prog, (torch.randn(3, 4),))
    simple = simplify(stripped)
    assert all(n.type.rank <= 1 for n in simple.graph.nodes)  # nothing batch-sized is left


# -- ops that mix samples ----------------------------------------------------------------

def scoped(path, fn):
    from tdag.ops.builder import active_builder

    def wrapped(*args):
        with active_builder().scope(tdag.Origin("aten.op", path)):
            return fn(*args)
    return wrapped


MIXING = [
    ("batch_mean", lambda x: x - ops.mean(x, 0, keepdim=True), "reduce", "reduces over the batch"),
    ("batch_norm_train", lambda x: ops.batch_norm(x, None, None, training=True), "reduce",
     "reduces over the batch"),
    ("first_sample", lambda x: ops.select(x, 0, 0), "select", "selects one sample"),
    ("gather_batch", lambda x: ops.gather(x, torch.tensor([1, 0]), 0), "gather",
     "gathers along the batch"),
    ("shift", lambda x: ops.slice(x, 0, 1), "slice", "slices the batch"),
    ("transpose_mix", lambda x: x + ops.transpose(x, 0, 1), "add", "different axes"),
    ("weight_per_sample", lambda x: x * ops.param("w", torch.randn(4, 4)), "multiply",
     "not a broadcast"),
]


@pytest.mark.parametrize("name,fn,op,reason", MIXING, ids=[m[0] for m in MIXING])
def test_ops_that_mix_samples_are_refused_with_node_and_module(name, fn, op, reason):
    shape = (4, 4, 3) if "norm" in name else (4, 4)
    prog = tdag.trace(scoped("model.block.3", fn), tdag.TensorSpec(shape))
    tdag.verify(prog)
    with pytest.raises(BatchError) as info:
        strip_batch(prog)
    text = str(info.value)
    assert op in text and reason in text and "model.block.3" in text and "node %" in text


def test_a_squeezed_static_batch_of_one_is_refused():
    prog = tdag.trace(lambda x: ops.squeeze(x, 0), tdag.TensorSpec((1, 4)))
    with pytest.raises(BatchError, match="squeezes the batch"):
        strip_batch(prog)


def test_inputs_must_agree_on_the_batch():
    prog = tdag.trace(lambda x, y: (ops.sum(x, 1), ops.sum(y, 1)),
                      tdag.TensorSpec(("b", 4)), tdag.TensorSpec(("c", 4)))
    with pytest.raises(BatchError, match="disagree"):
        strip_batch(prog)


def test_add_batch_refuses_a_taken_symbol():
    with pytest.raises(tdag.ShapeError, match="already"):
        add_batch(scoped_mlp(batch="b"), "b")


# -- the batch rules in the op records --------------------------------------------------------

def test_every_record_has_a_batch_rule_of_one_of_the_four_kinds():
    kinds = (AxisRule, Aligned, OperandRule, Refuse)
    assert not [op.value for op, rec in REGISTRY.items() if not isinstance(rec.batch, kinds)]


WALKERS = ["tdag.refine.batch.rewriter", "tdag.refine.batch.strip", "tdag.refine.batch.add",
           "tdag.refine.batch.affine", "tdag.refine.batch.program"]


@pytest.mark.parametrize("module", WALKERS)
def test_the_walkers_dispatch_on_rule_kinds_never_on_ops(module):
    source = inspect.getsource(importlib.import_module(module))
    assert not re.search(r"\.op\s+(is|in|==|!=|not)\b", source)


REFUSED = [
    ("matmul", lambda x: ops.matmul(x, ops.param("w", torch.randn(8, 4))), ("b", 8), Op.einsum),
    ("conv", lambda x: ops.conv(x, ops.param("w", torch.randn(2, 4, 3, 3))), ("b", 4, 7, 7),
     Op.conv),
]


@pytest.mark.parametrize("name,fn,shape,op", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_refused_kernel_in_a_lowered_program_names_the_op_and_node(name, fn, shape, op):
    prog = tdag.lower.lower(tdag.trace(scoped("model.head", fn), tdag.TensorSpec(shape)))
    (node,) = [n for n in prog.graph.nodes if n.op is op]
    rule = record(op).batch
    assert isinstance(rule, Refuse)
    with pytest.raises(BatchError) as info:
        strip_batch(prog)
    text = str(info.value)
    assert f"{op.value} is refused: it {rule.mixing}" in text
    assert f"node %{node.name}" in text and "model.head" in text


def test_a_kernel_with_an_axis_rule_strips_like_a_primitive():
    prog = tdag.lower.lower(tdag.trace(lambda x: ops.softmax(ops.exp(x), -1),
                                       tdag.TensorSpec(("b", 3, 5))))
    assert any(n.op is Op.softmax for n in prog.graph.nodes)
    stripped = check_strip(prog, (torch.randn(4, 3, 5),))
    assert close(outputs(add_batch(stripped), torch.ones(2, 3, 5)),
                 outputs(prog, torch.ones(2, 3, 5)))


def test_a_broadcast_operand_of_an_operand_rule_is_rebuilt_at_full_size():
    # indices repeated to the static batch size 3: the same for every sample
    prog = tdag.trace(lambda x: ops.gather(x, ops.zeros((3, 2), "int64") + 2, 1),
                      tdag.TensorSpec((3, 4)))
    check_strip(prog, (torch.randn(3, 4),))


# -- index arithmetic over arange(batch) ------------------------------------------------------

def own_rows(x, shift=0):
    """Each sample's rows of a table with the batch folded in, by ``i * s + j`` (as
    transformers' causal masks index positions flattened over the batch)."""
    b, s, d = x.shape
    table = ops.reshape(ops.exp(x), (b * s, d))
    index = ops.unsqueeze(ops.iota(b), 1) * s + ops.unsqueeze(ops.iota(s), 0) + shift
    return ops.gather(table, index, 0)  # wrapped: where(index < 0, index + b*s, index)


def test_a_gather_of_each_samples_own_rows_by_arange_batch_strips_and_rebatches():
    prog = tdag.trace(own_rows, tdag.TensorSpec(("b", 7, 3)))
    stripped = check_strip(prog, (torch.randn(3, 7, 3),))
    # the wrap's branch with b*s (a sum over the batch) is gone with its condition decided
    assert not [n for n in stripped.graph.nodes if n.op is Op.reduce]
    x = torch.randn(4, 7, 3)
    assert close(outputs(add_batch(stripped, "n"), x), (x.exp(),))


@pytest.mark.parametrize("fn,reason", [
    (lambda x: own_rows(x, shift=1), "outside the sample's own rows"),
    (lambda x: ops.exp(x) + ops.cast(ops.unsqueeze(ops.iota(x.shape[0]), 1), "f32")[:, :, None],
     "reads the sample index"),
    (lambda x: x * ops.cast(ops.sum(ops.iota(x.shape[0]), 0), "f32"), "reduce reads the sample"),
    (lambda x: ops.gather(ops.flatten(x), ops.flatten(ops.expand(
        ops.unsqueeze(ops.iota(x.shape[0]), 1), (x.shape[0], 21))), 0),
     "outside the sample's own rows: 1 \\* sample \\+ j with j in \\[0, 0\\]"),
], ids=["another_samples_rows", "sample_index_as_data", "sum_of_sample_index", "folded"])
def test_the_sample_index_used_other_than_as_an_offset_is_refused(fn, reason):
    prog = tdag.trace(fn, tdag.TensorSpec(("b", 7, 3)))
    with pytest.raises(BatchError, match=reason):
        strip_batch(prog)


def test_at_a_static_batch_an_iota_of_its_length_is_read_as_positions_or_samples():
    # positions: arange(3) along the features of a [3, 3] batch (the first reading)
    positions = tdag.trace(lambda x: x + ops.cast(ops.unsqueeze(ops.iota(3), 0), "f32"),
                           tdag.TensorSpec((3, 3)))
    check_strip(positions, (torch.randn(3, 3),))
    # samples: each sample's own rows by arange(batch) * 7 + j (the second reading)
    rows = tdag.trace(own_rows, tdag.TensorSpec((3, 7, 3)))
    stripped = check_strip(rows, (torch.randn(3, 7, 3),))
    x = torch.randn(4, 7, 3)
    assert close(outputs(add_batch(stripped, "n"), x), (x.exp(),))
    # neither reading strips the sample index added as data: the first reading's error
    data = tdag.trace(lambda x: x + ops.cast(ops.unsqueeze(ops.iota(3), 1), "f32"),
                      tdag.TensorSpec((3, 4)))
    with pytest.raises(BatchError, match="does not depend on the batch"):
        strip_batch(data)


# -- controllers ------------------------------------------------------------------------------

def _loop_program(count=3) -> Program:
    w = torch.randn(8, 8) / 3
    step = tdag.trace(lambda i, h: ops.tanh(ops.matmul(h, ops.param("w", w))) + h,
                      tdag.TensorSpec((), "int64"), tdag.TensorSpec(("b", 8))).graph
    i, h = step.inputs
    body = Block((Value("i", i.type), Value("h", h.type)), (Call("step", ("i", "h"), ("h1",)),),
                 ("h1", "h1"))
    loop = Loop(("h0",), body, ("hn", "hs"), count=count, scanned=1)
    return Program({"step": step}, Block((Value("h0", h.type),), (loop,), ("hn", "hs")))


def test_strip_batch_goes_through_loops():
    prog = _loop_program()
    x = torch.randn(4, 8)
    stripped = strip_batch(prog)
    tdag.verify(stripped)
    runs = [outputs(stripped, x[i]) for i in range(4)]
    final, scanned = outputs(prog, x)
    assert torch.allclose(torch.stack([r[0] for r in runs]), final, atol=1e-6)
    # scanned values are stacked in front, so their batch axis is 1
    assert torch.allclose(torch.stack([r[1] for r in runs], 1), scanned, atol=1e-6)


def test_a_graph_called_with_different_batch_layouts_is_copied():
    f = tdag.trace(lambda a: ops.exp(a) * 0.5, tdag.TensorSpec((3, 3))).graph
    g = tdag.trace(lambda a: ops.permute(a, 1, 0), tdag.TensorSpec((3, 3))).graph
    x = Value("x", f.inputs[0].type)
    steps = (Call("f", ("x",), ("y",)), Call("g", ("y",), ("z",)), Call("f", ("z",), ("w",)))
    prog = Program({"f": f, "g": g}, Block((x,), steps, ("w",)))
    tdag.verify(prog)
    stripped = strip_batch(prog)
    tdag.verify(stripped)
    assert len(stripped.graphs) == 3  # f per sample by rows, and by columns
    x = torch.randn(3, 3)
    # the transpose moved the batch to axis 1 of the output
    assert close(per_sample(stripped, (x,), out_axis=1), outputs(prog, x))


def test_add_batch_through_a_loop_keeps_scanned_values_batch_first():
    prog = _loop_program()
    rebatched = add_batch(strip_batch(prog), "n")
    tdag.verify(rebatched)
    x = torch.randn(4, 8)
    final, scanned = outputs(rebatched, x)
    expected_final, expected_scanned = outputs(prog, x)
    assert torch.allclose(final, expected_final, atol=1e-6)
    # the per-step values were stacked in front; add_batch moves the batch back to axis 0
    assert torch.allclose(scanned, expected_scanned.transpose(0, 1), atol=1e-6)


# -- transformers models (tiny configs, random weights) ---------------------------------------

def _gpt2():
    import transformers as T
    return T.GPT2Model(T.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100,
                                    n_positions=64, bos_token_id=1, eos_token_id=2))


def _llama():
    import transformers as T
    return T.LlamaModel(T.LlamaConfig(num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, hidden_size=32,
                                      intermediate_size=64, vocab_size=100,
                                      max_position_embeddings=64))


def _whisper():
    from support.hf_encoders import whisper_encoder
    return whisper_encoder()[0]


def _hf(name: str):
    """(module with one tensor out, batch -> example args); ``*_no_cache``: called with
    use_cache=False, which builds the causal mask from arange(batch)."""
    from support.hf_encoders import LastHidden, tokens

    class NoCache(LastHidden):
        def forward(self, x):
            return self.model(x, use_cache=False).last_hidden_state

    torch.manual_seed(0)
    base = name.removesuffix("_no_cache")
    make = {"gpt2": _gpt2, "llama": _llama, "whisper_encoder": _whisper}[base]
    args = (lambda b: (torch.randn(b, 8, 32),)) if base == "whisper_encoder" else tokens
    wrap = NoCache if name.endswith("_no_cache") else LastHidden
    return wrap(make().eval()).eval(), args


def check_per_sample_equals_eager(module, prog, example):
    stripped = strip_batch(prog)
    tdag.verify(stripped)
    with torch.no_grad():
        expected = module(*example)
    torch.testing.assert_close(per_sample(stripped, example)[0], expected, rtol=1e-4, atol=1e-5)


# with use_cache=False, the causal mask of transformers' GPT-2 and Llama gathers from positions
# flattened over the batch at i * 7 + j (i = arange(batch), 0 <= j < 7), wrapped as
# where(idx < 0, idx + n, idx): the index's affine form in the sample index makes the gather
# each sample's own rows, and the wrap's bounds drop the n (a sum over the batch)
@pytest.mark.parametrize("name", ["gpt2", "llama", "whisper_encoder", "gpt2_no_cache",
                                  "llama_no_cache"])
def test_transformers_model_with_a_symbolic_batch_strips(name):
    module, args = _hf(name)
    prog = tdag.from_torch(module, args(2), dynamic_batch=True)
    check_per_sample_equals_eager(module, prog, args(3))
    rebatched = add_batch(strip_batch(prog), "n")
    tdag.verify(rebatched)
    example = args(4)
    with torch.no_grad():
        torch.testing.assert_close(tdag.run(rebatched, *example), module(*example),
                                   rtol=1e-4, atol=1e-5)


def check_captured_at(name: str, batch: int) -> None:
    """Captured at a static ``batch``: per sample as eager, and re-batched at 3."""
    module, args = _hf(name)
    prog = tdag.from_torch(module, args(batch))
    check_per_sample_equals_eager(module, prog, args(batch))
    rebatched = add_batch(strip_batch(prog), "n")
    example = args(3)
    with torch.no_grad():
        torch.testing.assert_close(tdag.run(rebatched, *example), module(*example),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["gpt2", "llama", "whisper_encoder", "gpt2_no_cache",
                                  "llama_no_cache"])
def test_transformers_model_captured_at_batch_1_strips_and_rebatches(name):
    # a batch of one: constants of size 1 on the batch axis are the one sample's
    check_captured_at(name, 1)


@pytest.mark.parametrize("name", ["gpt2_no_cache", "llama_no_cache"])
def test_transformers_model_captured_at_a_static_batch_strips_and_rebatches(name):
    # the causal mask's arange(batch) at a static batch of 2: read as the sample index
    check_captured_at(name, 2)
