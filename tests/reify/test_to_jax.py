"""tdag.to_jax: every op's JAX emitter, models, controllers, state and guards.

- every primitive on its differential cases (``support.primitive_cases``) and every kernel
  on the lowering tables' programs (``support.lowering_tables.KERNEL_PROGRAMS``) against
  ``tdag.run``;
- the test zoo (``support.torch_models.MODELS``) through from_torch and to_jax, jitted, against
  torch eager at several batch sizes, and its gradients against torch autograd;
- ONNX light models against onnxruntime on the original (two by default, all nine slow);
- If / Loop / state programs, ONNX's own control-flow conformance cases, against tdag.run;
- wrong inputs raise ShapeError; ``import tdag`` works without jax.

Tolerances: floats within rtol 1e-4 and atol 1e-4 x the largest reference magnitude (XLA
sums in its own order), bf16/f16 as support.guards.assert_close; integers and bools exactly.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")

import tdag  # noqa: E402
from tdag.ir.record import REGISTRY  # noqa: E402
from tdag.reify.jax.context import NO_JAX, jax_dtype  # noqa: E402

from support import control_programs as P  # noqa: E402
from support.guards import assert_close  # noqa: E402
from support.jax_arrays import run_jax, to_numpy, to_torch  # noqa: E402
from support.lowering_tables import JAX_REFUSED, KERNEL_PROGRAMS, random_args  # noqa: E402
from support.onnx_cases import node_cases  # noqa: E402
from support.primitive_cases import CASES, build  # noqa: E402
from support.torch_models import MODELS, make_model  # noqa: E402


def check(prog, args, lower=True, what=""):
    """to_jax against tdag.run on ``args``; returns the JAX function."""
    fn = tdag.to_jax(prog, lower=lower)
    assert_close(run_jax(fn, args), tdag.run(prog, *args), what)
    return fn


# -- the records ------------------------------------------------------------------------------

def test_every_record_has_a_jax_emitter():
    assert all(callable(rec.jax) for rec in REGISTRY.values())


def test_the_dtype_table_covers_every_dtype():
    for dtype in set(tdag.DType) - set(NO_JAX):
        assert np.dtype(jax_dtype(dtype)).itemsize == dtype.itemsize, dtype
    for dtype in NO_JAX:
        with pytest.raises(tdag.UnsupportedOpError, match=f"dtype {dtype.value} has no JAX type"):
            jax_dtype(dtype)


def test_import_tdag_does_not_import_jax():
    code = ("import sys; sys.modules['jax'] = None\n"
            "import tdag, tdag.reify, tdag.lower, tdag.refine\n"
            "from tdag import ops\n"
            "p = tdag.trace(lambda x: ops.softmax(x, -1), tdag.TensorSpec((2, 3)))\n"
            "tdag.to_torch(p)\n"
            "try:\n    tdag.to_jax(p)\nexcept ImportError:\n    print('no jax')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "no jax"


def _primitive_cases():
    """Every differential case; the first of each op in the default run, the rest slow."""
    seen: set = set()
    for c in CASES:
        marks = [pytest.mark.slow] if c.op in seen else []
        seen.add(c.op)
        yield pytest.param(c, id=c.id, marks=marks)


@pytest.mark.parametrize("case", list(_primitive_cases()))
def test_every_primitive_matches_the_interpreter(case):
    prog = build(case)
    fn = tdag.to_jax(prog, lower=False)
    rng = np.random.default_rng(len(case.id))
    for dims in case.bindings:
        args = [torch.from_numpy(np.array(x.draw(rng, dims))) for x in case.ins]
        assert_close(run_jax(fn, args), tdag.run(prog, *args), f"{case.id} at {dims}")


# one program per kernel in the default run (together they lower to every kernel), the rest slow
_KERNELS_FAST = {"matmul", "plain", "max", "avg", "max-1d-on-last", "softmax", "log-softmax",
                 "layer-norm", "rms-norm", "gelu", "silu", "sigmoid", "relu", "relu6",
                 "hardswish", "bilinear-x2", "group-norm", "batch-norm", "sdpa", "conv-transpose",
                 "lstm", "lstm-bidirectional-stack", "concat", "adamw-update", "max-pool-backward"}


def _sweep(names, fast):
    return [pytest.param(n, marks=[] if n in fast else [pytest.mark.slow]) for n in names]


@pytest.mark.parametrize("name", _sweep(KERNEL_PROGRAMS, _KERNELS_FAST))
def test_every_kernel_matches_the_interpreter(name):
    fn, specs = KERNEL_PROGRAMS[name]
    prog = tdag.trace(fn, *specs)
    jitted = tdag.to_jax(prog)
    if name in JAX_REFUSED:
        with pytest.raises(tdag.UnsupportedOpError, match=JAX_REFUSED[name]):
            run_jax(jitted, random_args(prog, 1))
        return
    for batch in (1, 3):
        args = random_args(prog, batch)
        assert_close(run_jax(jitted, args), tdag.run(prog, *args), f"{name} at {batch}")


@pytest.mark.parametrize("width", [4, 16])
def test_attention_rows_with_every_key_masked_give_zeros(width):
    mask = torch.rand(5, 8) > 0.3
    mask[1] = False
    fn = lambda q, k, v: tdag.ops.scaled_dot_product_attention(  # noqa: E731
        q, k, v, attn_mask=tdag.ops.const(mask))
    S = tdag.TensorSpec
    prog = tdag.trace(fn, S(("b", 2, 5, 4)), S(("b", 2, 8, 4)), S(("b", 2, 8, width)))
    check(prog, random_args(prog, 3), what=f"fully masked row, width {width}")


# -- the test zoo -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def zoo():
    cache = {}

    def get(name):
        if name not in cache:
            model, inputs = make_model(name)
            prog = tdag.from_torch(model, inputs(2), dynamic_batch=True)
            cache[name] = model, inputs, tdag.to_jax(prog)
        return cache[name]
    return get


@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_matches_torch_eager(zoo, name):
    model, inputs, fn = zoo(name)
    assert fn.staged, fn.unstaged_because
    assert set(fn.params) <= set(dict(model.named_parameters()) | dict(model.named_buffers()))
    for batch in (2, 1):  # each a compile: jit specialises on the batch
        args = inputs(batch)
        with torch.no_grad():
            ref = tuple(torch.utils._pytree.tree_leaves(model(*args)))
        assert_close(run_jax(fn, args), ref, f"{name} at batch {batch}")


def test_apply_is_jittable_and_its_gradient_is_torchs(zoo):
    model, inputs, fn = zoo("cnn")
    (x,) = inputs(3)
    trainable = {k: v for k, v in fn.params.items() if k in dict(model.named_parameters())}

    def loss(params):
        return (fn.apply({**fn.params, **params}, to_numpy(x)) ** 2).sum()

    with jax.enable_x64(True):
        value, grads = jax.jit(jax.value_and_grad(loss))(trainable)
    model.zero_grad()
    (model(x) ** 2).sum().backward()
    np.testing.assert_allclose(float(value), (model(x) ** 2).sum().item(), rtol=1e-4)
    for name, p in model.named_parameters():
        scale = p.grad.abs().max().item()
        np.testing.assert_allclose(np.asarray(grads[name]), p.grad.numpy(), rtol=1e-3,
                                   atol=1e-4 * scale, err_msg=name)


# -- ONNX light models ------------------------------------------------------------------------

LIGHT = os.path.join(os.path.dirname(__import__("onnx").__file__), "backend", "test", "data",
                     "light")
FAST_LIGHT = ["zfnet512", "resnet50"]
SLOW_LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "shufflenet",
              "squeezenet", "vgg19"]


@pytest.mark.parametrize("name", FAST_LIGHT)
def test_light_onnx_models_match_onnxruntime(name):
    _light(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_LIGHT)
def test_light_onnx_models_match_onnxruntime_slow(name):
    _light(name)


def _light(name):
    """As test_onnx_robust: the original on onnxruntime against to_jax of its Program."""
    import onnx
    from support.guards import run_onnx
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    original = onnx.load(path)
    weights = {i.name for i in original.graph.initializer}  # old files list them as inputs
    data = next(i for i in original.graph.input if i.name not in weights)
    shape = [d.dim_value for d in data.type.tensor_type.shape.dim]
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(0))
    got = run_jax(tdag.to_jax(tdag.from_onnx(path)), [x])
    torch.testing.assert_close(got, run_onnx(original, x), rtol=1e-4, atol=1e-5)


# -- controllers and state --------------------------------------------------------------------

@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_if_becomes_lax_cond(sign):
    fn = check(P.if_program(), [sign * (torch.rand(3, 3) + 0.1)], what="if")
    assert fn.staged


@pytest.mark.parametrize("count", [0, 5])
def test_counted_loop_becomes_a_scan(count):
    fn = check(P.affine_loop(count), [torch.randn(3, 4)], what="loop")
    assert fn.staged


@pytest.mark.parametrize("n", [0, 1, 4])
def test_symbolic_loop_with_scans(n):
    x = torch.randint(-5, 6, (n, 3)).float()
    check(P.row_sum_loop(), [x], what="scan loop")


@pytest.mark.parametrize("count", [None, 3])
def test_while_loop_becomes_a_while_loop(count):
    fn = check(_without_scans(P.doubling_loop(count)), [torch.tensor([1.0, 2.0])],
               what="while")
    assert fn.staged


@pytest.mark.parametrize("count", [None, 3])
def test_while_loop_with_scans_runs_in_python(count):
    """How many trips a while loop stacks is the data's: no single trace."""
    fn = check(P.doubling_loop(count), [torch.tensor([1.0, 2.0])], what="while")
    assert not fn.staged and "stacks" in fn.unstaged_because


def _without_scans(prog):
    """``prog``'s last loop without its scanned outputs."""
    *before, loop = prog.main.steps
    body = replace(loop.body, outputs=loop.body.outputs[:-loop.scanned])
    loop = replace(loop, body=body, outputs=loop.outputs[:-loop.scanned], scanned=0)
    main = replace(prog.main, steps=(*before, loop), outputs=loop.outputs)
    return tdag.Program(prog.graphs, main, prog.state)


@pytest.mark.parametrize("steps", [None, 5])
def test_state_is_carried_as_a_pytree(steps):
    prog = P.accumulator_program(steps)
    x = torch.tensor([[1.0, 2.0]])
    fn = tdag.to_jax(prog)
    ref, ref_state = tdag.run(prog, x, return_state=True)
    out, state = fn(to_numpy(x), return_state=True)
    assert_close(to_torch(out), ref)
    assert set(state) == set(ref_state)
    for k in state:
        assert_close(to_torch(state[k]), ref_state[k], k)
    # fed back, carried on, as tdag.run(..., state=) does
    again, _ = fn(to_numpy(x), state=state)
    ref_again, ref_state2 = tdag.run(prog, x, state=ref_state, return_state=True)
    assert_close(to_torch(again), ref_again)
    with jax.enable_x64(True):
        pure = jax.jit(fn.apply)(fn.params, to_numpy(x), state=state)[1]
    assert_close(to_torch(pure["total"]), ref_state2["total"])


CONTROL = node_cases(("test_loop", "test_if", "test_scan", "test_rnn", "test_gru", "test_lstm"),
                     modules=("loop", "if_", "scan", "rnn", "gru", "lstm"))
_CONTROL_RUN = sorted(n for n in CONTROL if not any(s in n for s in ("seq", "opt")))


_CONTROL_FAST = {"test_if", "test_loop11", "test_scan9_sum", "test_lstm_defaults",
                 "test_gru_defaults"}


@pytest.mark.parametrize("name", _sweep(_CONTROL_RUN, _CONTROL_FAST))
def test_onnx_control_conformance_matches_the_interpreter(name):
    model, ins, _ = CONTROL[name]
    prog = tdag.from_onnx(model)
    args = [torch.from_numpy(np.array(a)) for a in ins]
    check(prog, args, what=name)


def test_a_size_only_data_decides_runs_unstaged():
    """nonzero's row count is the data's: no single trace; each call still runs."""
    prog = tdag.trace(lambda x: tdag.ops.nonzero(x > 0.0), tdag.TensorSpec(("n",)))
    fn = tdag.to_jax(prog)
    assert not fn.staged and "nonzero" in fn.unstaged_because
    for x in (torch.tensor([1.0, -1.0, 2.0]), torch.tensor([-1.0, -2.0])):
        assert_close(run_jax(fn, [x]), tdag.run(prog, x))


@pytest.mark.slow
@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_generation_and_its_step_with_a_cache_match_the_interpreter(which):
    """transformers' static-cache export (tests/canonicalize/torch/test_generate.py): the
    decode loop, without and with an eos that stops it at once, and the step called token by
    token with its cache as the state it returns."""
    from support import decoder_lms as G
    make, batch, whole_prompt = {"gpt2": (G.gpt2, 1, False), "llama": (G.llama, 2, True)}[which]
    lm = G.Exported(make, batch, whole_prompt)
    prompt = G.random_prompt(lm)
    free = tdag.run(tdag.decode_loop(lm.step, G.NEW), prompt)
    for eos in (None, int(free[0, prompt.shape[1]])):
        gen = tdag.decode_loop(lm.step, G.NEW, eos_token_id=eos)
        fn = tdag.to_jax(gen)
        # a static cache keeps every shape; an eos makes it a while loop stacking tokens
        assert fn.staged == (eos is None), fn.unstaged_because
        assert torch.equal(run_jax(fn, [prompt]), tdag.run(gen, prompt)), eos
    step, state, ref_state = tdag.to_jax(lm.step), {}, None
    tokens = G.random_prompt(lm, 4)
    for i in range(tokens.shape[1]):
        ids, pos = tokens[:, i:i + 1], torch.tensor([i])
        ref, ref_state = tdag.run(lm.step, ids, pos, state=ref_state, return_state=True)
        out, state = step(to_numpy(ids), to_numpy(pos), state=state)
        assert_close(to_torch(out), ref, f"{which} step {i}")


# -- guards -----------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, words", [
    (np.zeros((2, 16), np.float64), "%x"),        # dtype
    (np.zeros((2, 16, 1), np.float32), "%x"),     # rank
    (np.zeros((2, 15), np.float32), "%x"),        # a static size
])
def test_a_wrong_input_raises_shape_error(zoo, bad, words):
    _, _, fn = zoo("mlp")
    with pytest.raises(tdag.ShapeError, match=words):
        fn(bad)


def test_one_value_per_symbol():
    prog = tdag.trace(lambda a, b: a + b, tdag.TensorSpec(("n",)), tdag.TensorSpec(("n",)))
    fn = tdag.to_jax(prog)
    assert fn(np.ones(3, np.float32), np.ones(3, np.float32)).shape == (3,)
    with pytest.raises(tdag.ShapeError, match="n = 3"):
        fn(np.ones(3, np.float32), np.ones(4, np.float32))


def test_64_bit_programs_never_run_in_32_bits():
    """fn(...) turns x64 on for its run; apply, traced by the caller, asks for it."""
    fn = tdag.to_jax(tdag.trace(lambda i: i * i, tdag.TensorSpec((3,), "int64")))
    big = np.array([3, 2**20, 2**31], np.int64)
    assert fn(big).dtype == np.int64 and np.array_equal(fn(big), big * big)
    with pytest.raises(tdag.TdagError, match="enable_x64"):
        fn.apply(fn.params, big)
    with jax.enable_x64(True):
        assert np.array_equal(jax.jit(fn.apply)(fn.params, big), big * big)


def test_one_compile_per_input_signature():
    """A symbolic batch specialises under jit: each new shape compiles once, then hits."""
    fn = tdag.to_jax(tdag.trace(lambda x: tdag.ops.softmax(x, -1), tdag.TensorSpec(("b", 4))))
    for batch in (2, 2, 3, 2, 3):
        assert fn(np.ones((batch, 4), np.float32)).shape == (batch, 4)
    assert fn._jitted._cache_size() == 2
