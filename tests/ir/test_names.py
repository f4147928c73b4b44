"""The one name-minting mechanism: fresh names never collide; mapped names are stable."""
import tdag
from tdag import ops
from tdag.ir.names import FreshNames, NameMap
from tdag.ir.rewrite import Context
from tdag.ops.builder import Builder


def test_fresh_names_skip_taken_ones():
    names = FreshNames(taken={"x", "x_1"})
    assert [names.fresh("x"), names.fresh("x"), names("y"), names("y")] == [
        "x_2", "x_3", "y", "y_1"]


def test_name_map_is_stable_and_injective():
    names = NameMap(taken={"self"}, sanitize=lambda s: s.replace("/", "_"))
    assert names("a/b") == "a_b" and names("a_b") == "a_b_1" and names("a/b") == "a_b"
    assert names("self") == "self_1"


def test_a_counted_scheme_numbers_every_name_with_one_counter():
    names = FreshNames(taken={"c1"}, pattern="{hint}{n}")
    assert [names("c"), names("c"), names(""), names("v")] == ["c0", "c2", "3", "v4"]


def test_a_counted_name_not_taken_is_not_handed_out_again():
    names = FreshNames(pattern="{hint}_l{n}")
    first = names.fresh("x", take=False)
    assert first == "x_l0" and first not in names.taken
    assert names.fresh("x") == "x_l1" and names.claim(first) and not names.claim(first)


def test_avoid_skips_names_without_taking_them():
    names = FreshNames(pattern="nz{n}")
    assert names.fresh("", avoid={"nz0", "nz1"}) == "nz2"
    assert names.taken == {"nz2"}


def test_the_builder_and_the_rewrite_engine_mint_with_the_one_minter():
    assert isinstance(Builder().names, FreshNames)
    prog = tdag.trace(lambda x: ops.exp(x) + 1.0, tdag.TensorSpec((4,)))
    assert [n.name for n in prog.graph.nodes] == ["0", "2", "3", "4"]
    ctx = Context(prog.graph)
    assert [ctx.fresh("4"), ctx.fresh("0")] == ["4_l0", "0_l1"]


def test_a_name_map_mints_names_that_stand_for_no_source():
    names = NameMap(sanitize=lambda s: s.replace("#", "_"))
    assert names("carry") == "carry" and names.fresh("carry") == "carry_1"
    assert names.fresh("it") == "it_2"


def test_a_suffixed_name_not_taken_is_handed_out_again_until_it_is():
    graphs: dict = {"main": None}
    names = FreshNames()
    assert names.fresh("main", avoid=graphs, take=False) == "main_1"
    assert names.fresh("main", avoid=graphs, take=False) == "main_1"  # still free
    graphs["main_1"] = None
    assert names.fresh("main", avoid=graphs, take=False) == "main_2"


def test_a_variant_spells_the_names_tried_after_the_hint():
    names = FreshNames({"x", "x2"}, variant=lambda base, k: f"{base}{k + 1}")
    assert [names("x"), names("x"), names("y")] == ["x3", "x4", "y"]
    repeated = FreshNames({"g", "g_b"}, variant=lambda base, k: base + "_b" * k)
    assert repeated("g") == "g_b_b"
