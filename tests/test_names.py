"""The one name-minting mechanism: fresh names never collide; mapped names are stable."""
from tdag.ir.names import FreshNames, NameMap


def test_fresh_names_skip_taken_ones():
    names = FreshNames(taken={"x", "x_1"})
    assert [names.fresh("x"), names.fresh("x"), names("y"), names("y")] == [
        "x_2", "x_3", "y", "y_1"]


def test_name_map_is_stable_and_injective():
    names = NameMap(taken={"self"}, sanitize=lambda s: s.replace("/", "_"))
    assert names("a/b") == "a_b" and names("a_b") == "a_b_1" and names("a/b") == "a_b"
    assert names("self") == "self_1"
