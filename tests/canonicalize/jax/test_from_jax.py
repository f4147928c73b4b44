"""tdag.from_jax: flax models and small functions per primitive family, through tdag.run,
tdag.to_torch (and tdag.to_onnx on onnxruntime for the models), against the jitted JAX
function on random inputs (rtol 1e-4, atol 1e-5 unless a case says otherwise)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
flax = pytest.importorskip("flax")
import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import tdag  # noqa: E402
from tdag.ir.types import TensorKind  # noqa: E402

from support.flax_models import CNN, MLP, TransformerBlock, rand, random_variables  # noqa: E402
from support.guards import run_onnx  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5


def _leaves(value) -> list:
    if isinstance(value, (tuple, list)):
        return list(value)
    return [value]


def _close(got, expected, what: str, atol: float) -> None:
    got, expected = _leaves(got), jax.tree_util.tree_leaves(expected)
    assert len(got) == len(expected), f"{what}: {len(got)} outputs, jax gives {len(expected)}"
    for k, (g, e) in enumerate(zip(got, expected)):
        e = np.asarray(e)
        g = g.detach().numpy() if isinstance(g, torch.Tensor) else np.asarray(g)
        assert g.shape == e.shape, f"{what} output {k}: shape {g.shape}, jax {e.shape}"
        if e.dtype == np.bool_ or np.issubdtype(e.dtype, np.integer):
            np.testing.assert_array_equal(g, e, err_msg=f"{what} output {k}")
        else:
            np.testing.assert_allclose(g, e, rtol=RTOL, atol=atol, err_msg=f"{what} output {k}")


def check(fn, *args, onnx: bool = False, atol: float = ATOL) -> tdag.Program:
    """from_jax(fn, *args) matches jax.jit(fn) through tdag.run and to_torch (and ONNX)."""
    prog = tdag.from_jax(fn, *args)
    tdag.verify(prog)
    expected = jax.jit(fn)(*args)
    inputs = [torch.from_numpy(np.array(a)) for a in args if isinstance(a, np.ndarray)]
    _close(tdag.run(prog, *inputs), expected, "tdag.run", atol)
    _close(tdag.to_torch(prog)(*inputs), expected, "to_torch", atol)
    if onnx:
        _close(run_onnx(tdag.to_onnx(prog), *inputs), expected, "to_onnx", atol)
    return prog


# -- flax models ----------------------------------------------------------------------------------


MODELS = {"mlp": (MLP, (4, 16)), "cnn": (CNN, (2, 16, 16, 3)),
          "transformer": (TransformerBlock, (2, 10, 32))}


def model_case(name: str):
    """(apply function, variables, example input) of one of the flax models."""
    cls, shape = MODELS[name]
    module, x = cls(), rand(*shape)
    return module.apply, random_variables(module, x), x


@pytest.mark.parametrize("name", sorted(MODELS))
def test_flax_model_matches_jax_in_run_torch_and_onnx(name):
    apply, variables, x = model_case(name)
    prog = check(apply, variables, x, onnx=True, atol=1e-4)
    kinds = {n: w.kind for g in prog.graphs.values() for n, w in g.weights.items()}
    assert kinds["params.Dense_0.kernel"] is TensorKind.parameter
    if name == "cnn":
        assert kinds["batch_stats.BatchNorm_0.mean"] is TensorKind.buffer
        assert kinds["batch_stats.BatchNorm_0.var"] is TensorKind.buffer
    x2 = rand(*x.shape)  # another input, the same Program
    _close(tdag.run(prog, torch.from_numpy(x2)), jax.jit(apply)(variables, x2), "run x2", 1e-4)


LAYERS = {
    "embed": lambda: (nn.Embed(10, 4), np.array([[1, 2, 9], [0, 0, 3]], np.int32)),
    "group_norm": lambda: (nn.GroupNorm(num_groups=2), rand(2, 4, 4, 8)),
    "rms_norm": lambda: (nn.RMSNorm(), rand(2, 5, 8)),
    "conv_transpose": lambda: (nn.ConvTranspose(3, (3, 3), strides=(2, 2)), rand(1, 5, 5, 2)),
    "gru": lambda: (nn.RNN(nn.GRUCell(4)), rand(2, 5, 3)),
    "dropout_deterministic": lambda: (nn.Dropout(0.5, deterministic=True), rand(2, 3)),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_flax_layers(name):
    module, x = LAYERS[name]()
    check(module.apply, random_variables(module, x), x)


def test_weights_are_named_by_tree_path_and_inputs_by_parameter():
    apply, variables, x = model_case("mlp")
    prog = tdag.from_jax(apply, variables, x)
    assert [v.name for v in prog.inputs] == ["arg1"]  # apply(variables, *args): no name
    names = set(prog.graph.weights)
    assert {"params.Dense_0.kernel", "params.Dense_0.bias", "params.Dense_2.kernel"} <= names

    def plain(weights, x):
        return x @ weights[0] + weights[1]
    prog = tdag.from_jax(plain, [rand(4, 3), rand(3)], rand(2, 4))
    assert [v.name for v in prog.inputs] == ["x"]
    assert {"weights.0", "weights.1"} <= set(prog.graph.weights)

    def nested(tree, x):  # not a flax variables dict: every leaf is a parameter
        return x @ tree["encoder"]["w"] + tree["stats"]["b"]
    prog = tdag.from_jax(nested, {"encoder": {"w": rand(4, 3)}, "stats": {"b": rand(3)}},
                         rand(2, 4))
    assert {n: w.kind for n, w in prog.graph.weights.items()} == {
        "encoder.w": TensorKind.parameter, "stats.b": TensorKind.parameter}


# -- primitive families ---------------------------------------------------------------------------

ELEMENTWISE = {
    "arith": lambda x, y: (x + y, x - y, x * y, x / (jnp.abs(y) + 1), jnp.maximum(x, y),
                           jnp.minimum(x, y), -x, jnp.sign(x), jnp.abs(x)),
    "pow": lambda x, y: (jnp.abs(x) ** y, x ** 3, x ** -2, lax.integer_pow(y, 5)),
    "transcendental": lambda x, y: (jnp.exp(x), jnp.log(jnp.abs(x) + 0.1), jnp.log1p(jnp.abs(x)),
                                    jnp.expm1(x), jnp.tanh(x), jax.nn.sigmoid(x),
                                    jax.scipy.special.erf(x), lax.rsqrt(jnp.abs(y) + 0.5),
                                    jnp.sqrt(jnp.abs(y)), jnp.cbrt(x), jnp.exp2(y)),
    "erf_inv": lambda x, y: jax.scipy.special.erfinv(jnp.tanh(x) * 0.9),
    "atan2": lambda x, y: (jnp.arctan2(x, y), jnp.arctan2(y, jnp.zeros_like(y))),
    "select_clamp": lambda x, y: (jnp.where(x > y, x, y), jnp.clip(x, -0.5, 0.5),
                                  lax.clamp(-0.2, x, 0.3), lax.select_n(x > 0, x, y)),
    "compare_logic": lambda x, y: ((x < y) & (x > -1), (x >= y) | (y <= 0), ~(x == y),
                                   x != y),
    "convert": lambda x, y: ((x * 3).astype(jnp.int32), (x > 0).astype(jnp.float32),
                             lax.stop_gradient(y)),
    "int_div": lambda x, y: (x * 10).astype(jnp.int32) // 3 + lax.div((y * 10).astype(
        jnp.int32), 3) + lax.rem((x * 10).astype(jnp.int32), 4),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise(name):
    check(ELEMENTWISE[name], rand(3, 5), rand(3, 5))


def test_dot_general_any_batch_and_contracting_dims():
    check(lambda a, b: lax.dot_general(a, b, (((3, 1), (0, 2)), ((0,), (3,)))),
          rand(2, 3, 4, 5), rand(5, 6, 3, 2))
    check(lambda a, b: jnp.einsum("bij,bjk->bik", a, b) + a @ b, rand(2, 3, 4), rand(2, 4, 3))


CONVS = {
    "nchw_stride_pad": dict(window_strides=(2, 1), padding=((1, 2), (0, 1)),
                            dimension_numbers=("NCHW", "OIHW", "NCHW")),
    "nhwc_dilated": dict(window_strides=(1, 1), padding=((2, 2), (2, 2)), rhs_dilation=(2, 2),
                         dimension_numbers=("NHWC", "HWIO", "NHWC")),
    "lhs_dilation": dict(window_strides=(1, 1), padding=((1, 1), (-1, 1)), lhs_dilation=(2, 1),
                         dimension_numbers=("NCHW", "OIHW", "NCHW")),
    "groups": dict(window_strides=(1, 1), padding="SAME", feature_group_count=2,
                   dimension_numbers=("NHWC", "HWIO", "NHWC")),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv_general_dilated(name):
    kw = CONVS[name]
    lhs, rhs, _ = kw["dimension_numbers"]
    x = rand(2, 4, 7, 6) if lhs == "NCHW" else rand(2, 7, 6, 4)
    groups = kw.get("feature_group_count", 1)
    w = rand(6, 4 // groups, 3, 2) if rhs == "OIHW" else rand(3, 2, 4 // groups, 6)
    check(lambda x, w: lax.conv_general_dilated(x, w, **kw), x, w)


def test_conv_of_other_ranks_and_depthwise():
    check(lambda x, w: lax.conv_general_dilated(x, w, (2,), [(1, 1)],
                                                dimension_numbers=("NWC", "WIO", "NWC")),
          rand(2, 9, 3), rand(3, 3, 4))
    check(lambda x, w: lax.conv_general_dilated(x, w, (1, 2, 1), "SAME"),
          rand(1, 2, 5, 6, 4), rand(3, 2, 3, 2, 2))
    check(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "VALID", feature_group_count=4),
          rand(1, 4, 6, 6), rand(8, 1, 3, 3))


REDUCTIONS = {
    "sum_max_min_prod": lambda x: (x.sum(1), x.max((0, 2)), x.min(-1), jnp.prod(x, 0),
                                   x.mean(), jnp.any(x > 1, 1), jnp.all(x > -1, 2)),
    "argmax_argmin": lambda x: (jnp.argmax(x, 1), jnp.argmin(x, -1)),
    "pools": lambda x: (lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2), (1, 2, 1), "SAME"),
                        lax.reduce_window(x, 0.0, lax.add, (1, 3, 2), (1, 1, 2),
                                          ((0, 0), (1, 1), (0, 1)))),
    "cumulative": lambda x: (jnp.cumsum(x, 1), lax.cummax(x, 2), lax.cumsum(x, 0, reverse=True),
                             lax.cummin(x, 1), jnp.cumprod(x * 0.5, 2), lax.cumlogsumexp(x, 1)),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions_and_windows(name):
    check(REDUCTIONS[name], rand(3, 4, 5))


MOVEMENT = {
    "reshape_transpose": lambda x: (x.reshape(4, 15).T, jnp.transpose(x, (2, 0, 1)),
                                    x[None, :, None], jnp.squeeze(x[:, :1], 1),
                                    jnp.broadcast_to(x[:, :, :1], (3, 4, 5))),
    "concat_stack_split": lambda x: (jnp.concatenate([x, x * 2], 1), x[1:, ::2, 1:4],
                                     jnp.stack(jnp.split(x, 2, axis=1), 0)[1],
                                     jnp.split(x, [1, 3], axis=2)[1], jnp.tile(x[:1], (2, 1, 1)),
                                     lax.slice(x, (0, 1, 0), (3, 4, 5), (2, 2, 3)),
                                     x[::-1, :, ::-1]),
    "pad": lambda x: (lax.pad(x, 0.5, ((1, 2, 0), (-1, 1, 1), (0, -2, 2))),
                      jnp.pad(x, ((0, 0), (2, 1), (1, 0)), mode="constant")),
    "iota": lambda x: x + jnp.arange(5, dtype=jnp.float32) + lax.broadcasted_iota(
        jnp.float32, (3, 4, 5), 1),
    "dynamic_slice": lambda x: (lax.dynamic_slice(x, (1, 2, 0), (2, 2, 3)),
                                lax.dynamic_update_slice(x, jnp.ones((1, 2, 2)), (2, 3, 4))),
}


@pytest.mark.parametrize("name", sorted(MOVEMENT))
def test_movement(name):
    check(MOVEMENT[name], rand(3, 4, 5))


def test_dynamic_slice_at_positions_from_data():
    def fn(x, i):
        start = (i[0] % 3).astype(jnp.int32)
        return (lax.dynamic_slice(x, (start, 0), (2, 5)),
                lax.dynamic_update_slice(x, jnp.zeros((2, 2)), (start, start + 1)))
    check(fn, rand(4, 5), np.array([7.0], np.float32))
    check(fn, rand(4, 5), np.array([1.0], np.float32))


GATHERS = {
    "take": lambda x, i: (jnp.take(x, i, axis=1), x[i], x[:, i % 4]),
    "take_along_axis": lambda x, i: (jnp.take_along_axis(x, jnp.tile((i % 4)[None], (5, 1)), 1),
                                     jnp.take_along_axis(x, jnp.tile(i[:, None] % 5, (1, 4)), 0)),
    "at_set_add": lambda x, i: (x.at[i].set(1.0), x.at[:, i % 4].add(2.0), x.at[1, 2].mul(3.0),
                                x.at[i, 0].max(0.5)),
    "clip_and_fill": lambda x, i: (jnp.take(x, i + 3, axis=0, mode="clip"),
                                   jnp.take(x, i + 3, axis=0, mode="fill", fill_value=-1.0)),
}


@pytest.mark.parametrize("name", sorted(GATHERS))
def test_gather_and_scatter(name):
    check(GATHERS[name], rand(5, 4), np.array([0, 3, -1, 2], np.int32))


def test_sort_and_top_k():
    check(lambda x: (jnp.sort(x, axis=1), jnp.argsort(x, axis=0), lax.top_k(x, 3)),
          rand(4, 6))


# -- control flow and calls -----------------------------------------------------------------------

def _cond(x, y):
    return lax.cond(x.sum() > 0, lambda a, b: (a * b, a.sum()), lambda a, b: (a - b, b.max()),
                    x, y)


def _switch(x, i):
    branches = [lambda a: a + 1, lambda a: a * 2, lambda a: jnp.sin(a)]
    return lax.switch(i[0], branches, x)


def _while(x):
    def body(state):
        k, v = state
        return k + 1, v * 1.5 + 0.1
    return lax.while_loop(lambda s: (s[0] < 10) & (s[1].sum() < 100.0), body, (0, x))


def _fori(x, w):
    return lax.fori_loop(0, 4, lambda k, v: jnp.tanh(v @ w) + k, x)


def _scan(xs, h):
    def step(carry, x):
        carry = jnp.tanh(carry + x)
        return carry, carry * 2
    return lax.scan(step, h, xs)


def _scan_reverse(xs, h):
    return lax.scan(lambda c, x: (c * x + 1, c - x), h, xs, reverse=True)


def test_cond_takes_the_branch_the_data_chooses():
    for x in (rand(3, 4), -np.abs(rand(3, 4))):
        prog = check(_cond, x, rand(3, 4))
    assert any(type(s).__name__ == "If" for s in prog.main.steps)


def test_switch_with_three_branches():
    for i in (0, 1, 2, 5):
        check(_switch, rand(3), np.array([i], np.int32))


def test_while_loop_stops_on_its_condition():
    for x in (rand(4) * 0.1, rand(4) * 10):
        prog = check(_while, x)
    loop = next(s for s in prog.main.steps if type(s).__name__ == "Loop")
    assert loop.cond is not None


def test_fori_loop_with_a_weight_read_in_the_body():
    check(_fori, rand(2, 3), rand(3, 3) * 0.5)


@pytest.mark.parametrize("fn", [_scan, _scan_reverse], ids=["forward", "reverse"])
def test_scan_stacks_its_outputs(fn):
    prog = check(fn, rand(5, 3), rand(3))
    loop = next(s for s in prog.main.steps if type(s).__name__ == "Loop")
    assert loop.count == 5 and loop.scanned == 1


def test_scan_over_a_symbolic_length():
    prog = tdag.from_jax(_scan_reverse, rand(5, 3), rand(3), dynamic_shapes={0: {0: "n"}})
    assert str(prog.input_types[0]) == "f32[n,3]"
    for n in (2, 7):
        xs, h = rand(n, 3), rand(3)
        args = (torch.from_numpy(xs), torch.from_numpy(h))
        expected = jax.jit(_scan_reverse)(xs, h)
        _close(tdag.run(prog, *args), expected, f"run n={n}", ATOL)
        _close(tdag.to_torch(prog)(*args), expected, f"to_torch n={n}", ATOL)


def _cache_writes(x):
    def body(i, cache):  # a KV-cache update: row i written at a position the loop decides
        return lax.dynamic_update_slice(cache, x[i][None] * i, (i, 0))
    return lax.fori_loop(0, 4, body, jnp.zeros((6, 3)))


def _nested(xs, p):
    def step(c, x):
        c = lax.cond(x.sum() > 0, lambda c: c @ p["w"], lambda c: c - 1.0, c)
        c = lax.while_loop(lambda c: c.sum() > 10.0, lambda c: c * 0.5, c)
        return c, c.sum()
    return lax.scan(step, jnp.ones(3), xs)


def test_nested_control_flow_and_writes_in_a_loop():
    check(_cache_writes, rand(5, 3), onnx=True)
    check(_nested, rand(5, 3), {"w": rand(3, 3)}, onnx=True)


def test_control_flow_in_onnx():
    check(_cond, rand(3, 4), rand(3, 4), onnx=True)
    check(_scan, rand(5, 3), rand(3), onnx=True)
    check(_while, rand(4) * 0.1, onnx=True)


@jax.custom_jvp
def _softplus(x):
    return jnp.logaddexp(x, 0.0)


_softplus.defjvp(lambda primals, tangents: (_softplus(primals[0]), tangents[0]))


@jax.custom_vjp
def _clip_gradient(x):
    return x * 2


_clip_gradient.defvjp(lambda x: (x * 2, None), lambda _, g: (g,))


def test_jit_custom_derivatives_and_remat_are_inlined():
    inner = jax.jit(lambda a: jnp.exp(a) - 1)

    def fn(x):
        y = inner(x) + inner(x * 2)  # one jaxpr inlined twice
        y = jax.checkpoint(lambda a: jnp.sin(a) * a)(y)
        return _softplus(y) + _clip_gradient(x) + jax.nn.relu(x) + jax.nn.gelu(x)
    check(fn, rand(3, 4))


def test_flax_rnn_drops_its_dead_rng_code():
    # nn.RNN makes its initial carry with an RNG key no inference result depends on
    module, x = nn.RNN(nn.LSTMCell(6)), rand(2, 5, 3)
    check(module.apply, random_variables(module, x), x)


def test_closed_over_arrays_are_consts():
    table = rand(4, 3)
    prog = check(lambda x: x @ table + jnp.asarray(table[0]), rand(2, 4))
    assert any(w.kind is TensorKind.const and tuple(w.type.shape) == (4, 3)
               for w in prog.graph.weights.values())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_dynamic_shapes_keep_the_batch_symbolic(name):
    apply, variables, x = model_case(name)
    prog = tdag.from_jax(apply, variables, x, dynamic_shapes={1: {0: "batch"}})
    assert str(prog.input_types[0]) == f"f32[batch,{','.join(map(str, x.shape[1:]))}]"
    for n in (1, 3):
        x = rand(n, *x.shape[1:])
        _close(tdag.run(prog, torch.from_numpy(x)), jax.jit(apply)(variables, x), f"batch {n}",
               1e-4)
    per_sample = tdag.strip_batch(prog)  # the batch symbol is one tdag's passes understand
    _close(tdag.run(per_sample, torch.from_numpy(x[0])), jax.jit(apply)(variables, x[:1])[0],
           "strip_batch", 1e-4)


def test_weights_read_in_a_scan_body_keep_their_names():
    def rnn(params, xs):
        def step(h, x):
            h = jnp.tanh(h @ params["w"] + x + params["b"])
            return h, h * 2
        return lax.scan(step, jnp.zeros(3, jnp.float32), xs)
    prog = check(rnn, {"w": rand(3, 3) * 0.5, "b": rand(3)}, rand(6, 3), onnx=True)
    assert set(dict(tdag.to_torch(prog).named_parameters())) == {"w", "b"}


def test_nodes_carry_the_flax_module_path_and_source_line():
    apply, variables, x = model_case("transformer")
    prog = tdag.from_jax(apply, variables, x)
    scopes = {node.origin.scope for node in prog.graph.nodes}
    assert {"TransformerBlock.Dense_0", "TransformerBlock.LayerNorm_1",
            "TransformerBlock.MultiHeadDotProductAttention_0.query"} <= scopes
    assert all(node.origin.op.startswith("jax.") for node in prog.graph.nodes)
    assert any("linen" in node.origin.location for node in prog.graph.nodes)


def test_unsupported_primitives_are_listed_together_with_their_lines():
    def fn(x):
        y = lax.clz(x.astype(jnp.int32)).astype(jnp.float32)  # line A
        return lax.population_count(x.astype(jnp.int32)) + y  # line B
    with pytest.raises(tdag.UnsupportedOpError) as info:
        tdag.from_jax(fn, rand(8))
    message = str(info.value)
    assert "clz" in message and "population_count" in message
    line = fn.__code__.co_firstlineno
    assert f"test_from_jax.py:{line + 1}" in message and f"test_from_jax.py:{line + 2}" in message


def test_an_unsupported_primitive_in_a_loop_body_is_reported_with_its_line():
    def fn(xs):
        return lax.scan(lambda c, x: (c + lax.population_count(x), c), 0, xs)[1]
    with pytest.raises(tdag.UnsupportedOpError, match=r"population_count at .*test_from_jax"):
        tdag.from_jax(fn, np.arange(4, dtype=np.int32))
