"""The one node emitter: a node typed by its op's record, refused in the caller's terms."""
from __future__ import annotations

import subprocess
import sys

import pytest

import tdag
from tdag import InvalidModelError, ShapeError, TensorType
from tdag.deinops.movement import Unsqueeze
from tdag.ir.emit import typed_node
from tdag.ir.op import Op
from tdag.ir.record import NoSpec
from tdag.ir.types import Origin


def f32(*shape):
    return TensorType(shape, "float32")


def test_the_output_type_is_the_shape_rule_s():
    node = typed_node(Op.add, None, ["x", "y"], [f32(2, 3), f32(2, 3)], name="z",
                      origin=Origin("aten.add", "fc"))
    assert (node.name, node.inputs, node.spec, node.type) == ("z", ("x", "y"), NoSpec(),
                                                              f32(2, 3))
    assert node.origin == Origin("aten.add", "fc")


def test_a_refused_node_names_the_op_node_origin_and_operands():
    with pytest.raises(ShapeError) as info:
        typed_node(Op.add, None, ["x", "y"], [f32(2), f32(3)], name="z",
                   origin=Origin("aten.add", "fc"))
    assert type(info.value) is ShapeError
    assert str(info.value).endswith("(operands: %x: f32[2], %y: f32[3]) "
                                     "[node %z, from aten.add @ fc]")


def test_a_wrong_spec_or_arity_is_refused_before_the_shape_rule():
    with pytest.raises(ShapeError, match=r"neg: expected 1 inputs and a NoSpec spec"):
        typed_node(Op.neg, None, ["x", "y"], [f32(2), f32(2)], name="z")
    with pytest.raises(ShapeError, match="a NoSpec spec"):
        typed_node(Op.neg, Unsqueeze((0,)), ["x"], [f32(2)], name="z")


def test_the_caller_may_report_a_refusal_in_its_own_terms():
    def refused(reason):
        return InvalidModelError(f"a rewrite built a bad add: {reason}", node="root")
    with pytest.raises(InvalidModelError, match="^a rewrite built a bad add: .*node %root"):
        typed_node(Op.add, None, ["x", "y"], [f32(2), f32(3)], name="z", refused=refused)


def test_a_cache_runs_each_shape_rule_once():
    cache: dict = {}
    a = typed_node(Op.exp, None, ["x"], [f32(4)], name="a", cache=cache)
    b = typed_node(Op.exp, None, ["y"], [f32(4)], name="b", cache=cache)
    assert a.type == b.type and list(cache.values()) == [f32(4)]


def test_str_of_a_program_is_its_text_form_whatever_module_is_imported_first():
    code = ("from tdag.ir.program import Program\n"
            "from tdag.ir.graph import TDAG, Value\n"
            "from tdag.ir.types import TensorType\n"
            "g = TDAG((Value('x', TensorType((2,), 'float32')),), {}, (), ('x',))\n"
            "print(str(Program.from_tdag(g)).splitlines()[0], str(g).splitlines()[-2])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["tdag", "main(%x:", "f32[2])", "{", "return", "%x"]
    assert tdag.Program.__str__ is not object.__str__
