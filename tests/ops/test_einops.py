"""einops patterns and einsum: traced, verified, run, and compared with einops and torch."""
from __future__ import annotations

import einops
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tdag
from tdag import ops
from tdag.ops import einops as tdag_einops
from tdag.ir.symbols import is_static

# (op, pattern, traced shape, keyword sizes, reduction); a name in the shape is a symbol,
# bound to a concrete size from BINDINGS when the program runs
TABLE = [
    ("rearrange", "b c h w -> b h w c", (2, 3, 4, 5), {}, None),
    ("rearrange", "b h w c -> b (h w) c", (2, 3, 4, 5), {}, None),
    ("rearrange", "b (h w) c -> b h w c", (2, 12, 5), {"h": 3}, None),
    ("rearrange", "b c (h p) (w q) -> b (h w) (p q c)", (2, 3, 8, 6), {"p": 2, "q": 3}, None),
    ("rearrange", "b ... -> b (...)", (2, 3, 4, 5), {}, None),
    ("rearrange", "... h w -> ... w h", (2, 3, 4, 5), {}, None),
    ("rearrange", "b c h w -> b 1 c h w", (2, 3, 4, 5), {}, None),
    ("rearrange", "b c h w -> b c () h () w", (2, 3, 4, 5), {}, None),
    ("rearrange", "b 1 c -> b c", (2, 1, 3), {}, None),
    ("rearrange", "b () c -> c b", (2, 1, 3), {}, None),
    ("rearrange", "(b1 b2) h w c -> (b1 h) (b2 w) c", (6, 2, 3, 4), {"b1": 2}, None),
    ("rearrange", "i j -> j i", (3, 4), {}, None),
    ("rearrange", "a b c -> c b a", (2, 3, 4), {}, None),
    ("rearrange", "x -> x", (7,), {}, None),
    ("rearrange", "b h w c -> (b h w c)", (2, 3, 4, 5), {}, None),
    ("rearrange", "b (h w c) -> b h w c", (2, 24), {"h": 2, "w": 3}, None),
    ("rearrange", "b c (h 1 w) -> b c h w", (2, 3, 12), {"h": 4}, None),
    ("rearrange", "(a b) c -> (b a) c", (6, 5), {"a": 2}, None),
    ("rearrange", "a ... b -> b ... a", (2, 3), {}, None),
    ("rearrange", "b (h w) c -> (h w) c b", (2, 12, 5), {"h": 3}, None),
    ("rearrange", "b (h w) c -> b h w c", ("b", 16, 8), {"h": 4}, None),
    ("rearrange", "b s d -> s b d", ("b", "s", 8), {}, None),
    ("rearrange", "b (h d) -> b h d", ("b", 12), {"d": 4}, None),
    ("rearrange", "b s (h d) -> b h s d", ("b", "s", 12), {"h": 3}, None),
    ("reduce", "b c h w -> b c", (2, 3, 4, 5), {}, "mean"),
    ("reduce", "b c (h 2) (w 2) -> b c h w", (2, 3, 8, 6), {}, "max"),
    ("reduce", "b c h w -> b c 1 1", (2, 3, 4, 5), {}, "mean"),
    ("reduce", "b ... c -> b c", (2, 3, 4, 5), {}, "sum"),
    ("reduce", "b s d -> d", (2, 3, 4), {}, "min"),
    ("reduce", "(b h) w -> w", (6, 4), {"b": 2}, "sum"),
    ("reduce", "a b c -> c a", (2, 3, 4), {}, "prod"),
    ("reduce", "a b c -> (c a)", (2, 3, 4), {}, "prod"),
    ("reduce", "b h (w 2) -> b h w", ("b", 4, 6), {}, "max"),
    ("reduce", "b s d -> b d", ("b", "s", 5), {}, "mean"),
    ("reduce", "(h 2) w -> h w", (6, 5), {}, "sum"),
    ("repeat", "h w -> h w c", (3, 4), {"c": 3}, None),
    ("repeat", "h w -> (h 2) w", (3, 4), {}, None),
    ("repeat", "h w -> (2 h) w", (3, 4), {}, None),
    ("repeat", "b c -> b c h w", (2, 3), {"h": 2, "w": 3}, None),
    ("repeat", "h w -> (h 2) (w 3)", (3, 4), {}, None),
    ("repeat", "... c -> ... c 4", (2, 3, 5), {}, None),
    ("repeat", "b 1 c -> b n c", (2, 1, 3), {"n": 5}, None),
    ("repeat", "h -> h (a b)", (3,), {"a": 2, "b": 4}, None),
    ("repeat", "b c -> c b k", ("b", 3), {"k": 4}, None),
    ("repeat", "b c -> (b k) c", ("b", 3), {"k": 2}, None),
]

# (equation, operand shapes, reference): "einops" runs einops.einsum, "torch" torch.einsum
EINSUM_TABLE = [
    ("b i d, b j d -> b i j", [(2, 3, 4), (2, 5, 4)], "einops"),
    ("bid,bjd->bij", [(2, 3, 4), (2, 5, 4)], "torch"),
    ("ij,jk->ik", [(3, 4), (4, 5)], "torch"),
    ("ij,jk->ki", [(3, 4), (4, 5)], "torch"),
    ("i,i->", [(5,), (5,)], "torch"),
    ("i,j->ij", [(3,), (4,)], "torch"),
    ("ii->i", [(4, 4)], "torch"),
    ("ii->", [(4, 4)], "torch"),
    ("bii->bi", [(2, 3, 3)], "torch"),
    ("iji->j", [(3, 2, 3)], "torch"),
    ("bij->bji", [(2, 3, 4)], "torch"),
    ("ij->", [(3, 4)], "torch"),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 6)], "torch"),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], "torch"),
    ("a b, b c, c d -> d a", [(2, 3), (3, 4), (4, 5)], "einops"),
    ("batch head q d, batch head k d -> batch head q k", [(2, 2, 3, 4), (2, 2, 5, 4)], "einops"),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)], "torch"),
    ("ij,jk", [(3, 4), (4, 5)], "torch"),
    ("i j, j -> i", [(3, 4), (4,)], "einops"),
    ("ij,ij->ij", [(3, 4), (3, 4)], "torch"),
    ("... i d, ... j d -> ... i j", [(2, 3, 4), (2, 5, 4)], "einops"),
    ("b i d, b j d -> b i j", [("b", 3, 4), ("b", 5, 4)], "einops"),
    ("bs,bs->b", [("b", "s"), ("b", "s")], "torch"),
]

BINDINGS = {"b": 2, "s": 3}


def concrete(shape) -> tuple:
    return tuple(BINDINGS[d] if isinstance(d, str) else d for d in shape)


def random_input(shape, positive: bool = False) -> torch.Tensor:
    x = torch.randn(concrete(shape))
    return x.abs() + 0.5 if positive else x  # prod of values near 1 stays well scaled


def run_case(op, pattern, shape, kw, reduction):
    """Trace, verify and run the tdag pattern; return (tdag result, einops result, prog)."""
    if op == "reduce":
        prog = tdag.trace(lambda x: ops.einops_reduce(x, pattern, reduction, **kw),
                          tdag.TensorSpec(shape))
    else:
        fn = ops.rearrange if op == "rearrange" else ops.repeat
        prog = tdag.trace(lambda x: fn(x, pattern, **kw), tdag.TensorSpec(shape))
    tdag.verify(prog)
    x = random_input(shape, positive=reduction == "prod")
    expected = (einops.reduce(x, pattern, reduction, **kw) if op == "reduce"
                else getattr(einops, op)(x, pattern, **kw))
    return tdag.run(prog, x), expected, prog


@pytest.mark.parametrize("op, pattern, shape, kw, reduction", TABLE,
                         ids=[f"{row[0]}:{row[1]}" for row in TABLE])
def test_pattern_matches_einops(op, pattern, shape, kw, reduction):
    got, expected, _ = run_case(op, pattern, shape, kw, reduction)
    assert got.shape == expected.shape
    if reduction is None or reduction in ("max", "min"):
        assert torch.equal(got, expected)  # movement (and max/min) moves values exactly
    else:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("equation, shapes, reference", EINSUM_TABLE,
                         ids=[row[0] for row in EINSUM_TABLE])
def test_einsum_matches_reference(equation, shapes, reference):
    specs = [tdag.TensorSpec(s) for s in shapes]
    prog = tdag.trace(lambda *xs: ops.einsum(equation, *xs), *specs)
    tdag.verify(prog)
    xs = [random_input(s) for s in shapes]
    expected = einops.einsum(*xs, equation) if reference == "einops" else \
        torch.einsum(equation, *xs)
    got = tdag.run(prog, *xs)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_einsum_accepts_einops_argument_order():
    prog = tdag.trace(lambda a, b: ops.einsum(a, b, "i j, j k -> i k"),
                      tdag.TensorSpec((3, 4)), tdag.TensorSpec((4, 5)))
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(tdag.run(prog, a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_einsum_single_letter_words_read_either_way():
    # "batch, batch -> batch" on vectors only fits the einops reading
    prog = tdag.trace(lambda a, b: ops.einsum("batch, batch -> batch", a, b),
                      tdag.TensorSpec((4,)), tdag.TensorSpec((4,)))
    a, b = torch.randn(4), torch.randn(4)
    assert torch.equal(tdag.run(prog, a, b), a * b)


def test_symbolic_output_shapes():
    prog = tdag.trace(lambda x: ops.rearrange(x, "b (h w) c -> b h w c", h=4),
                      tdag.TensorSpec(("b", 16, 8)))
    assert [str(t) for t in prog.graph.output_types] == ["f32[b,4,4,8]"]
    prog = tdag.trace(lambda x: ops.repeat(x, "b c -> b c n", n="s"), tdag.TensorSpec(("b", 3)))
    shape = prog.graph.output_types[0].shape
    assert not is_static(shape[0]) and shape[1] == 3 and str(shape[2]) == "s"


def ops_of(prog) -> list[str]:
    return [n.op.value for n in prog.graph.nodes]


# (fn, shapes, expected op sequence): minimal node counts
NODE_COUNTS = [
    (lambda x: ops.rearrange(x, "b c h w -> b h w c"), [(2, 3, 4, 5)], ["permute"]),
    (lambda x: ops.rearrange(x, "b h w c -> b (h w) c"), [(2, 3, 4, 5)], ["group"]),
    (lambda x: ops.rearrange(x, "b (h w) c -> b h w c", h=3), [(2, 12, 5)], ["ungroup"]),
    (lambda x: ops.rearrange(x, "x y -> x y"), [(2, 3)], []),
    (lambda x: ops.rearrange(x, "b (h w) c -> (h w) c b", h=3), [(2, 12, 5)], ["permute"]),
    (lambda x: ops.rearrange(x, "b 1 c -> b c"), [(2, 1, 3)], ["squeeze"]),
    (lambda x: ops.einops_reduce(x, "(b h) w -> w", "sum", b=2), [(6, 4)], ["reduce"]),
    (lambda x: ops.einops_reduce(x, "b c (h 2) (w 2) -> b c h w", "max"), [(2, 3, 8, 6)],
     ["ungroup", "ungroup", "reduce"]),
    (lambda x: ops.repeat(x, "h -> h (a b)", a=2, b=4), [(3,)], ["unsqueeze", "repeat"]),
    (lambda x: ops.repeat(x, "h -> (h a b)", a=2, b=4), [(3,)], ["unsqueeze", "repeat", "group"]),
    (lambda x: ops.repeat(x, "b c -> b c h w", h=2, w=3), [(2, 3)], ["unsqueeze", "repeat"]),
    (lambda q, k: ops.einsum("b i d, b j d -> b i j", q, k), [(2, 3, 4), (2, 5, 4)],
     ["unsqueeze", "repeat", "unsqueeze", "repeat", "multiply", "reduce"]),
    (lambda a, b: ops.einsum("ij,jk->ik", a, b), [(3, 4), (4, 5)],
     ["unsqueeze", "repeat", "unsqueeze", "repeat", "multiply", "reduce"]),
    (lambda a, b: ops.einsum("ij,kj->ik", a, b), [(3, 4), (5, 4)],
     ["unsqueeze", "repeat", "unsqueeze", "repeat", "multiply", "reduce"]),
    (lambda a: ops.einsum("ij->ji", a), [(3, 4)], ["permute"]),
    (lambda a: ops.einsum("ii->i", a), [(3, 3)], ["group", "slice"]),
]


@pytest.mark.parametrize("fn, shapes, expected", NODE_COUNTS,
                         ids=[str(i) for i in range(len(NODE_COUNTS))])
def test_minimal_nodes(fn, shapes, expected):
    prog = tdag.trace(fn, *(tdag.TensorSpec(s) for s in shapes))
    assert ops_of(prog) == expected


def test_einsum_three_operands_one_multiply_per_pair():
    prog = tdag.trace(lambda a, b, c: ops.einsum("ij,jk,kl->il", a, b, c),
                      tdag.TensorSpec((2, 3)), tdag.TensorSpec((3, 4)), tdag.TensorSpec((4, 5)))
    assert ops_of(prog).count("multiply") == 2
    assert ops_of(prog).count("reduce") == 2


def test_recipe_is_parsed_once():
    tdag_einops._recipe.cache_clear()
    for _ in range(3):
        tdag.trace(lambda x: ops.rearrange(x, "a b -> b a"), tdag.TensorSpec((2, 3)))
    info = tdag_einops._recipe.cache_info()
    assert info.misses == 1 and info.hits == 2
    recipe = tdag_einops._recipe("a b -> b a", "rearrange", 2)
    with pytest.raises(AttributeError):  # frozen: plain data shared between calls
        recipe.perm = ()


# (op, pattern, shape, keyword sizes, words the message must hold)
ERRORS = [
    # unknown axis on the right
    ("rearrange", "a b -> a c", (2, 3), {}, ["unknown axis 'c'"]),
    ("reduce", "a b -> a c", (2, 3), {}, ["unknown axis 'c'"]),
    ("rearrange", "a b -> a", (2, 3), {}, ["left only"]),
    ("repeat", "a b -> a", (2, 3), {}, ["missing on the right"]),
    # axis appearing twice
    ("rearrange", "a a -> a", (2, 2), {}, ["appears twice"]),
    ("rearrange", "a b -> a b b", (2, 3), {}, ["appears twice"]),
    # mismatched sizes
    ("rearrange", "h w -> w h", (4, 5), {"h": 3}, ["size 3", "size 4"]),
    ("rearrange", "(h w) c -> h w c", (12, 2), {"h": 5}, ["not a multiple"]),
    ("rearrange", "b () c -> b c", (2, 3, 4), {}, ["size 3"]),
    ("rearrange", "b (h w) -> b h w", ("b", "s"), {"h": 2}, ["not a known multiple"]),
    # missing size for an ambiguous split or a new axis
    ("rearrange", "(h w) c -> h w c", (12, 2), {}, ["give the sizes", "h, w"]),
    ("repeat", "h -> h w", (3,), {}, ["needs a size"]),
    ("rearrange", "a b -> b a", (2, 3), {"c": 4}, ["'c'", "not in the pattern"]),
    ("rearrange", "a b -> b a", (2, 3), {"a": 0}, ["positive"]),
    # bad parentheses
    ("rearrange", "a (b c -> a b c", (2, 6), {}, ["never closed"]),
    ("rearrange", "a b) -> a b", (2, 3), {}, ["without '('"]),
    ("rearrange", "((a b)) -> a b", (6,), {}, ["nested"]),
    # ellipsis misuse
    ("rearrange", "a -> a ...", (2,), {}, ["'...' on the right but not on the left"]),
    ("rearrange", "(... a) -> a ...", (2, 3), {}, ["inside parentheses"]),
    ("rearrange", "... a ... -> a", (2, 3), {}, ["'...' appears twice"]),
    ("rearrange", "... a -> a", (2, 3), {}, ["must also be on the right"]),
    ("rearrange", "a .. -> a", (2, 3), {}, ["unexpected character"]),
    # pattern shape and syntax
    ("rearrange", "a b c -> c b a", (2, 3), {}, ["rank 2"]),
    ("rearrange", "a b c ... -> c b a ...", (2, 3), {}, ["at least 3"]),
    ("rearrange", "a b", (2, 3), {}, ["'->'"]),
    ("rearrange", "a -> b -> c", (2,), {}, ["'->'"]),
    ("rearrange", "(h 2) -> h", (4,), {}, ["anonymous axis 2"]),
    ("rearrange", "a 2x -> a", (2, 3), {}, ["invalid axis name"]),
]


def call(op, pattern, x, kw):
    if op == "reduce":
        return ops.einops_reduce(x, pattern, "sum", **kw)
    return getattr(ops, op)(x, pattern, **kw)


@pytest.mark.parametrize("op, pattern, shape, kw, words", ERRORS,
                         ids=[f"{row[0]}:{row[1]}" for row in ERRORS])
def test_pattern_errors(op, pattern, shape, kw, words):
    with pytest.raises(tdag.PatternError) as info:
        tdag.trace(lambda x: call(op, pattern, x, kw), tdag.TensorSpec(shape))
    message = str(info.value)
    assert repr(pattern) in message
    assert "[" + ",".join(str(d) for d in shape) + "]" in message  # the input shape
    for word in words:
        assert word in message


def test_unknown_reduction():
    with pytest.raises(tdag.PatternError, match=r"'a b -> a' on input shape \[2,3\].*median"):
        tdag.trace(lambda x: ops.einops_reduce(x, "a b -> a", "median"), tdag.TensorSpec((2, 3)))


EINSUM_ERRORS = [
    ("ij,jk->ik", [(2, 3), (4, 5)], ["sizes 3 and 4"]),
    ("ij,jk->il", [(2, 3), (3, 5)], ["unknown axis 'l'"]),
    ("ij,jk->iki", [(2, 3), (3, 5)], ["appears twice"]),
    ("ij->i", [(2, 3), (3, 5)], ["1 operands", "2 tensors"]),
    ("ijk->i", [(2, 3)], ["rank 2"]),
    ("ii->i", [("s", "s")], ["static size"]),
    ("(a b), c -> a", [(2,), (3,)], ["no axis groups"]),
    ("a b, b c", [(2, 3), (3, 4)], ["needs '->'"]),
    ("i...j...,j->i", [(2, 3, 4), (4,)], ["'...'"]),
    ("ij->i->j", [(2, 3)], ["'->'"]),
]


@pytest.mark.parametrize("equation, shapes, words", EINSUM_ERRORS,
                         ids=[row[0] for row in EINSUM_ERRORS])
def test_einsum_errors(equation, shapes, words):
    with pytest.raises(tdag.PatternError) as info:
        tdag.trace(lambda *xs: ops.einsum(equation, *xs), *(tdag.TensorSpec(s) for s in shapes))
    message = str(info.value)
    assert repr(equation) in message
    assert "[" + ",".join(str(d) for d in shapes[0]) + "]" in message
    for word in words:
        assert word in message


@settings(max_examples=40, deadline=None)
@given(st.permutations(range(4)), st.integers(0, 3))
def test_permute_and_merge_matches_einops(perm, cut):
    """Any order of four axes, the first ``cut`` of them merged, equals einops."""
    names = ["a", "b", "c", "d"]
    out = [names[p] for p in perm]
    right = (f"({' '.join(out[:cut])}) " if cut > 1 else " ".join(out[:cut]) + " ") \
        + " ".join(out[cut:])
    pattern = f"a b c d -> {right.strip()}"
    got, expected, prog = run_case("rearrange", pattern, (2, 3, 4, 5), {}, None)
    assert torch.equal(got, expected)
    assert len(prog.graph.nodes) <= 2  # at most one permute and one group


# -- einops itself on traced tensors (tdag registered as an einops backend) -------------------

def _einops_call(op, pattern, kw, reduction):
    if op == "reduce":
        return lambda x: einops.reduce(x, pattern, reduction, **kw)
    return lambda x: getattr(einops, op)(x, pattern, **kw)


@pytest.mark.parametrize("op, pattern, shape, kw, reduction", TABLE,
                         ids=[f"{row[0]}:{row[1]}" for row in TABLE])
def test_einops_functions_record_tdag_ops(op, pattern, shape, kw, reduction):
    """einops.rearrange/reduce/repeat inside tdag.trace: the program equals einops on torch."""
    call = _einops_call(op, pattern, kw, reduction)
    prog = tdag.trace(call, tdag.TensorSpec(shape))
    tdag.verify(prog)
    x = random_input(shape, positive=reduction == "prod")
    got, expected = tdag.run(prog, x), call(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("equation, shapes, reference", EINSUM_TABLE[:2] + EINSUM_TABLE[-2:],
                         ids=[row[0] for row in EINSUM_TABLE[:2] + EINSUM_TABLE[-2:]])
def test_einops_einsum_records_tdag_ops(equation, shapes, reference):
    words = equation if reference == "einops" else ",".join(" ".join(t) for t in
                                                            equation.split("->")[0].split(","))
    if reference == "torch":  # einops spells axes as words: "bid,bjd->bij" as "b i d, ..."
        words += " -> " + " ".join(equation.split("->")[1])
    prog = tdag.trace(lambda *xs: einops.einsum(*xs, words), *map(tdag.TensorSpec, shapes))
    tdag.verify(prog)
    xs = [random_input(s) for s in shapes]
    torch.testing.assert_close(tdag.run(prog, *xs), einops.einsum(*xs, words),
                               rtol=1e-5, atol=1e-5)


def test_einops_pack_and_any_on_traced_tensors():
    def fn(x, y):
        packed, _ = einops.pack([x, y], "b * c")
        return packed, einops.reduce(x > 0, "b s c -> b", "any")
    specs = tdag.TensorSpec((2, 3, 4)), tdag.TensorSpec((2, 4))
    prog = tdag.trace(fn, *specs)
    tdag.verify(prog)
    x, y = torch.randn(2, 3, 4), torch.randn(2, 4)
    got = tdag.run(prog, x, y)
    assert torch.equal(got[0], einops.pack([x, y], "b * c")[0])
    assert torch.equal(got[1], einops.reduce(x > 0, "b s c -> b", "any"))


def test_ops_reduce_takes_the_einops_call():
    """tdag.ops.reduce(x, pattern, reduction) is einops' call; (x, kind, axes) the primitive's."""
    prog = tdag.trace(lambda x: (ops.reduce(x, "a b -> a", "sum"),
                                 ops.reduce(x, "a (b 2) -> a b", reduction="max"),
                                 ops.reduce(x, "sum", 1)), tdag.TensorSpec((3, 4)))
    x = torch.randn(3, 4)
    got = tdag.run(prog, x)
    torch.testing.assert_close(got[0], einops.reduce(x, "a b -> a", "sum"))
    assert torch.equal(got[1], einops.reduce(x, "a (b 2) -> a b", "max"))
    torch.testing.assert_close(got[2], x.sum(1))


@pytest.mark.parametrize("args, kw, words", [
    (("a b -> a",), {}, ['reduce(x, \'a b -> a\', "sum")']),
    (("a b -> a", "sum"), {"keepdim": True}, ["no keepdim"]),
    (("sum", 1), {"b": 2}, ["axis lengths (b)", "reduce(x, \"sum\", axes)"]),
    (("a b",), {}, ["expected a reduction", "einops pattern"]),
])
def test_ops_reduce_says_which_call_to_use(args, kw, words):
    with pytest.raises(tdag.PatternError) as info:
        tdag.trace(lambda x: ops.reduce(x, *args, **kw), tdag.TensorSpec((3, 4)))
    for word in words:
        assert word in str(info.value)
