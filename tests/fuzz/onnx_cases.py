"""ONNX cases: real models (onnx's light CNNs and small models built here, If and Loop
included), damaged in their bytes and in their structure, loaded with ``tdag.from_onnx``."""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from .harness import Case, CaseDirs, flips, splices, truncations

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
QUICK_LIGHT = ("squeezenet", "shufflenet")
OPSET = 17

HUGE_DIMS = (2**62, 2**63 - 1, 2**40, 10**12, 9**9, -1, -7, -(2**63), 0)
HOSTILE_STRINGS = (
    "9**9**9", "-1", "", " ", "a b", "s0*s0", "%x", "}", "program", "\x00", "x\x00y",
    "((((((((((((((((((((((((((((((((((((((((b))))))))))))))))))))))))))))))))))))))",
    "../../../etc/passwd", "\u202e\u0645", "\U0001f600", "x" * 5000,
)


def _inject(marker: str) -> list[str]:
    """Python that creates ``marker`` if anything ever evaluates it."""
    return [f"__import__('builtins').open({marker!r}, 'w').close()",
            f"exec(\"open({marker!r}, 'w')\")",
            f"__import__('os').system('touch {marker}')"]


class Skip(Exception):
    """The mutation does not apply to this model."""


# -- seeds ------------------------------------------------------------------------------------

def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), name="g", opset=OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _const(name, array) -> TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def mlp() -> onnx.ModelProto:
    w = np.arange(32, dtype=np.float32).reshape(8, 4) / 32
    return _model([helper.make_node("MatMul", ["x", "w"], ["h"], name="/fc/MatMul"),
                   helper.make_node("Add", ["h", "b"], ["a"], name="/fc/Add"),
                   helper.make_node("Relu", ["a"], ["y"], name="/act/Relu")],
                  [_vi("x", TensorProto.FLOAT, ["batch", 8])],
                  [_vi("y", TensorProto.FLOAT, ["batch", 4])],
                  [_const("w", w), _const("b", np.ones(4, np.float32))])


def shapes() -> onnx.ModelProto:
    """Shape arithmetic: Shape/Gather/Concat/Reshape, ConstantOfShape, Expand, Tile, Slice,
    Pad, Range: every shape input is a target for huge and negative values."""
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["sx"]), n("Gather", ["sx", "zero"], ["b0"], axis=0),
        n("Unsqueeze", ["b0", "ax0"], ["b1"]), n("Concat", ["b1", "twelve"], ["newshape"], axis=0),
        n("Reshape", ["x", "newshape"], ["r"]),
        n("ConstantOfShape", ["cshape"], ["c"],
          value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5])),
        n("Expand", ["c", "eshape"], ["e"]), n("Tile", ["e", "reps"], ["t"]),
        n("Slice", ["r", "starts", "ends", "axes"], ["s"]),
        n("Pad", ["s", "pads"], ["p"], mode="constant"),
        n("Range", ["rstart", "rlimit", "rdelta"], ["rg"]),
    ]
    i64 = np.int64
    inits = [_const("zero", np.array(0, i64)), _const("ax0", np.array([0], i64)),
             _const("twelve", np.array([12], i64)), _const("cshape", np.array([2, 3], i64)),
             _const("eshape", np.array([4, 2, 3], i64)), _const("reps", np.array([1, 2, 1], i64)),
             _const("starts", np.array([1], i64)), _const("ends", np.array([9], i64)),
             _const("axes", np.array([1], i64)), _const("pads", np.array([0, 1, 0, 2], i64)),
             _const("rstart", np.array(0, i64)), _const("rlimit", np.array(10, i64)),
             _const("rdelta", np.array(3, i64))]
    return _model(nodes, [_vi("x", TensorProto.FLOAT, ["batch", 3, 4])],
                  [_vi("p", TensorProto.FLOAT, None), _vi("t", TensorProto.FLOAT, None),
                   _vi("rg", TensorProto.INT64, None)], inits)


def if_model() -> onnx.ModelProto:
    one = helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(
        np.ones(4, np.float32), "one_v"))
    then = helper.make_graph([one, helper.make_node("Add", ["x", "one"], ["t_out"])], "then",
                             [], [_vi("t_out", TensorProto.FLOAT, [4])])
    other = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["e_out"])], "else",
                              [], [_vi("e_out", TensorProto.FLOAT, [4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
    return _model(nodes, [_vi("x", TensorProto.FLOAT, [4])], [_vi("y", TensorProto.FLOAT, [4])],
                  [_const("two", np.full(4, 2, np.float32)), _const("zero", np.float32(0))])


def loop_model() -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "step"], ["v_out"]),
         helper.make_node("Mul", ["v_out", "v_out"], ["scan"])],
        "body", [_vi("iter", TensorProto.INT64, []), _vi("cond_in", TensorProto.BOOL, []),
                 _vi("v_in", TensorProto.FLOAT, [4])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("v_out", TensorProto.FLOAT, [4]),
         _vi("scan", TensorProto.FLOAT, [4])])
    nodes = [helper.make_node("Loop", ["trip", "keep", "x"], ["v", "scans"], body=body)]
    return _model(nodes, [_vi("x", TensorProto.FLOAT, [4])],
                  [_vi("v", TensorProto.FLOAT, [4]), _vi("scans", TensorProto.FLOAT, [3, 4])],
                  [_const("trip", np.array(3, np.int64)), _const("keep", np.array(True)),
                   _const("step", np.ones(4, np.float32))])


def conv() -> onnx.ModelProto:
    n = helper.make_node
    rng = np.random.default_rng(0)
    nodes = [n("Conv", ["x", "w", "wb"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1],
               kernel_shape=[3, 3], name="/features/0/Conv"),
             n("BatchNormalization", ["c", "g", "beta", "mu", "var"], ["bn"]),
             n("Relu", ["bn"], ["r"]),
             n("MaxPool", ["r"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
             n("GlobalAveragePool", ["m"], ["gp"]), n("Flatten", ["gp"], ["f"], axis=1),
             n("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
             n("Softmax", ["y"], ["prob"], axis=-1)]
    f32 = np.float32
    inits = [_const("w", rng.standard_normal((3, 2, 3, 3)).astype(f32)),
             _const("wb", np.zeros(3, f32)), _const("g", np.ones(3, f32)),
             _const("beta", np.zeros(3, f32)), _const("mu", np.zeros(3, f32)),
             _const("var", np.ones(3, f32)),
             _const("fw", rng.standard_normal((5, 3)).astype(f32)), _const("fb", np.zeros(5, f32))]
    return _model(nodes, [_vi("x", TensorProto.FLOAT, ["n", 2, 6, 6])],
                  [_vi("prob", TensorProto.FLOAT, ["n", 5])], inits)


BUILT = {"mlp": mlp, "shapes": shapes, "if": if_model, "loop": loop_model, "conv": conv}


def seeds(long: bool) -> dict[str, onnx.ModelProto]:
    models = {name: make() for name, make in BUILT.items()}
    for path in sorted(LIGHT.glob("light_*.onnx")):
        name = path.stem[len("light_"):]
        if long or name in QUICK_LIGHT:
            models[name] = onnx.load(str(path))
    return models


# -- structural mutations: each edits a copy of the model in place and says what it did ------

def graphs(model: onnx.ModelProto):
    """The main graph and every subgraph (If branches, Loop bodies), depth first."""
    todo = [model.graph]
    while todo:
        g = todo.pop()
        yield g
        for node in g.node:
            for a in node.attribute:
                if a.type == AttributeProto.GRAPH:
                    todo.append(a.g)
                todo.extend(a.graphs)


def _nodes(model):
    found = [(g, i, node) for g in graphs(model) for i, node in enumerate(g.node)]
    if not found:
        raise Skip()
    return found


def m_attribute_type(model, rng, marker):
    nodes = [(n, a) for _, _, n in _nodes(model) for a in n.attribute]
    if not nodes:
        raise Skip()
    node, attr = rng.choice(nodes)
    how = rng.randrange(7)
    if how == 0:
        attr.type = rng.choice([t for t in AttributeProto.AttributeType.values()
                                if t != attr.type])
    elif how == 1:
        attr.ClearField("ints"), attr.ClearField("floats")
        attr.type, attr.i = AttributeProto.INT, rng.choice(HUGE_DIMS)
    elif how == 2:
        attr.type = AttributeProto.INTS
        attr.ClearField("ints")
        attr.ints.extend(rng.choice(([], [2**62, -(2**62)], [-1] * 9, list(range(300)))))
    elif how == 3:
        attr.type, attr.s = AttributeProto.STRING, rng.choice(HOSTILE_STRINGS).encode()
    elif how == 4:
        attr.type, attr.f = AttributeProto.FLOAT, rng.choice((float("nan"), float("inf"), 1e300))
    elif how == 5:
        node.attribute.append(onnx.AttributeProto(name=attr.name, type=AttributeProto.INT, i=-3))
    else:
        node.attribute.remove(attr)
    return f"attribute {attr.name!r} of {node.op_type} #{how}"


def m_attribute_value(model, rng, marker):
    """A hostile value of the attribute's own type (what the checker lets through)."""
    found = [(n, a) for _, _, n in _nodes(model) for a in n.attribute
             if a.type in (AttributeProto.INT, AttributeProto.INTS, AttributeProto.FLOAT)]
    if not found:
        raise Skip()
    node, attr = rng.choice(found)
    pick = [2**62, -(2**62), 2**31, 99, -99, 0, -1]
    if attr.type == AttributeProto.INT:
        attr.i = rng.choice(pick)
        value = attr.i
    elif attr.type == AttributeProto.INTS:
        n = len(attr.ints) if rng.random() < 0.7 else rng.choice((0, 1, 7, 64))
        attr.ClearField("ints")
        attr.ints.extend(rng.choice(pick) for _ in range(n))
        value = list(attr.ints)[:6]
    else:
        attr.f = rng.choice((float("nan"), float("inf"), -1e38, 0.0))
        value = attr.f
    return f"{node.op_type}.{attr.name} := {value}"


def m_dangling(model, rng, marker):
    _, _, node = rng.choice(_nodes(model))
    if not node.input:
        node.input.append("ghost")
    k = rng.randrange(len(node.input))
    node.input[k] = rng.choice(("ghost", "", "y" * 300))
    return f"dangling input {k} of {node.op_type}"


def m_cycle(model, rng, marker):
    g = rng.choice([g for g in graphs(model) if g.node])
    if len(g.node) < 2 or rng.random() < 0.3:
        node = rng.choice(g.node)
        if not node.input or not node.output:
            raise Skip()
        node.input[0] = node.output[0]
        return f"self loop on {node.op_type}"
    i, j = sorted(rng.sample(range(len(g.node)), 2))
    if not g.node[i].input or not g.node[j].output:
        raise Skip()
    g.node[i].input[0] = g.node[j].output[0]
    return f"cycle: node {i} reads node {j}'s output"


def m_duplicate_output(model, rng, marker):
    g = model.graph
    how = rng.randrange(4)
    names = [o for n in g.node for o in n.output] + [i.name for i in g.input]
    if how == 0 and len(g.node) >= 2:
        a, b = rng.sample(list(g.node), 2)
        a.output[0] = rng.choice([o for o in b.output] or names)
    elif how == 1 and g.input:
        rng.choice(list(g.node)).output[0] = rng.choice(g.input).name
    elif how == 2:
        g.output.append(g.output[0])
    else:
        g.output[0].name = rng.choice(names)
    return f"duplicate output #{how}"


def _dims_of(model):
    protos = [v for g in graphs(model) for v in list(g.input) + list(g.output) +
              list(g.value_info) if v.type.HasField("tensor_type")]
    return [(v, d) for v in protos for d in v.type.tensor_type.shape.dim]


def m_value_dims(model, rng, marker):
    dims = _dims_of(model)
    if not dims:
        raise Skip()
    value, dim = rng.choice(dims)
    if rng.random() < 0.6:
        dim.dim_value = rng.choice(HUGE_DIMS)
        return f"dim of {value.name!r} := {dim.dim_value}"
    dim.dim_param = rng.choice(HOSTILE_STRINGS + tuple(_inject(marker)))
    return f"dim of {value.name!r} := {dim.dim_param[:40]!r}"


def _int_tensors(model):
    found = [t for g in graphs(model) for t in g.initializer if t.data_type == TensorProto.INT64]
    found += [a.t for _, _, n in _nodes(model) if n.op_type == "Constant"
              for a in n.attribute if a.name == "value" and a.t.data_type == TensorProto.INT64]
    return found


def m_shape_values(model, rng, marker):
    tensors = _int_tensors(model)
    if not tensors:
        raise Skip()
    t = rng.choice(tensors)
    values = rng.choice(([2**62], [-7], [0], [2**63 - 1], [-(2**63)], [9**9, 9**9, 9**9],
                         [-1, -1], [1] * 64, list(range(1000)), [2**31] * 3))
    rank = len(t.dims)
    values = values[:1] if rank == 0 else values
    t.CopyFrom(numpy_helper.from_array(
        np.array(values, np.int64).reshape(() if rank == 0 else (-1,)), t.name))
    return f"int64 tensor {t.name!r} := {values[:4]}{'...' if len(values) > 4 else ''}"


def m_tensor_dims(model, rng, marker):
    tensors = [t for g in graphs(model) for t in g.initializer]
    if not tensors:
        raise Skip()
    t = rng.choice(tensors)
    how = rng.randrange(4)
    if how == 0 and t.dims:
        t.dims[rng.randrange(len(t.dims))] = rng.choice(HUGE_DIMS)
    elif how == 1:
        t.dims.append(rng.choice((2**40, 3, 0)))
    elif how == 2:
        del t.dims[:]
    else:
        t.data_type = rng.choice((0, TensorProto.STRING, TensorProto.INT64, 99,
                                  TensorProto.COMPLEX64, TensorProto.BOOL))
    return f"initializer {t.name!r} dims/type #{how}: {list(t.dims)[:6]} {t.data_type}"


def m_tensor_data(model, rng, marker):
    tensors = [t for g in graphs(model) for t in g.initializer]
    if not tensors:
        raise Skip()
    t = rng.choice(tensors)
    how = rng.randrange(3)
    if how == 0 and t.raw_data:
        t.raw_data = t.raw_data[:rng.randrange(len(t.raw_data))]
    elif how == 1:
        t.float_data.extend([1.0, 2.0, 3.0])
    else:
        t.data_location = TensorProto.EXTERNAL
    return f"initializer {t.name!r} data #{how}"


def m_inputs(model, rng, marker):
    g = model.graph
    inits = {t.name for t in g.initializer}
    real = [v for v in g.input if v.name not in inits]
    if not real:
        raise Skip()
    v = rng.choice(real)
    how = rng.randrange(5)
    if how == 0:
        g.input.remove(v)
    elif how == 1:
        v.type.tensor_type.elem_type = rng.choice((0, TensorProto.STRING, 99, 17,
                                                   TensorProto.COMPLEX128, TensorProto.UINT64))
    elif how == 2:
        v.type.tensor_type.shape.dim.add().dim_value = 3
    elif how == 3:
        v.type.CopyFrom(onnx.TypeProto(sequence_type=onnx.TypeProto.Sequence(
            elem_type=v.type)))
    else:
        v.type.tensor_type.ClearField("shape")
    return f"input {v.name!r} #{how}"


def m_opset(model, rng, marker):
    how = rng.randrange(5)
    if how == 0:
        model.opset_import[0].version = rng.choice((1, 5, 7, 9, 11, 13, 999, 0, -1, 2**62))
    elif how == 1:
        del model.opset_import[:]
    elif how == 2:
        model.opset_import.add(domain="", version=1)
    elif how == 3:
        model.ir_version = rng.choice((0, 1, 99, -1))
    else:
        model.opset_import[0].domain = rng.choice(("ai.onnx.ml", "com.evil", "\x00"))
    return f"opset #{how}: {[(o.domain, o.version) for o in model.opset_import]}, " \
           f"ir {model.ir_version}"


def m_unknown_op(model, rng, marker):
    _, _, node = rng.choice(_nodes(model))
    old = node.op_type
    if rng.random() < 0.7:
        node.op_type = rng.choice(("Frobnicate", "", "relu", "Loop", "If", "Scan", "Constant",
                                   "MatMul", "Conv", "Reshape", "Split"))
    else:
        node.domain = rng.choice(("com.evil", "ai.onnx.ml", "com.microsoft"))
    return f"op {old} -> {node.domain}:{node.op_type}"


def m_arity(model, rng, marker):
    _, _, node = rng.choice(_nodes(model))
    how = rng.randrange(4)
    if how == 0:
        node.input.extend(node.input[:1] * 3 or ["x"])
    elif how == 1:
        del node.input[:]
    elif how == 2:
        node.output.append(node.output[0] + "_extra" if node.output else "extra")
    else:
        del node.output[:]
    return f"arity of {node.op_type} #{how}"


def m_subgraph(model, rng, marker):
    nodes = [n for _, _, n in _nodes(model) if n.op_type in ("If", "Loop")]
    if not nodes:
        raise Skip()
    node = rng.choice(nodes)
    attr = rng.choice(list(node.attribute))
    how = rng.randrange(5)
    if how == 0:
        node.attribute.remove(attr)
    elif how == 1 and attr.g.output:
        attr.g.output.append(attr.g.output[0])
    elif how == 2 and attr.g.input:
        attr.g.input.pop()
    elif how == 3:
        attr.g.node.extend(list(attr.g.node))  # every node twice
    else:
        del attr.g.output[:]
    return f"{node.op_type} subgraph {attr.name} #{how}"


def m_names(model, rng, marker):
    """Rename one tensor everywhere to a hostile name (valid UTF-8)."""
    g = model.graph
    names = [o for n in g.node for o in n.output] + [v.name for v in g.input]
    if not names:
        raise Skip()
    old = rng.choice(names)
    new = rng.choice(HOSTILE_STRINGS + tuple(_inject(marker)) + ("0", "%0", "tdag", "const"))
    for sub in graphs(model):
        for node in sub.node:
            node.input[:] = [new if x == old else x for x in node.input]
            node.output[:] = [new if x == old else x for x in node.output]
        for v in list(sub.input) + list(sub.output) + list(sub.value_info):
            if v.name == old:
                v.name = new
        for t in sub.initializer:
            if t.name == old:
                t.name = new
    return f"rename {old!r} -> {new[:40]!r}"


def m_empty(model, rng, marker):
    g = model.graph
    how = rng.randrange(3)
    if how == 0:
        del g.node[:]
    elif how == 1:
        del g.output[:]
    else:
        g.output[0].name = g.input[0].name if g.input else "nothing"
    return f"empty #{how}"


# (mutation, weight): the ones that keep a model past onnx's checker (hostile values of the
# right type, names, dims) weigh more, as most others stop at the checker
STRUCTURAL = [(m_attribute_type, 1), (m_attribute_value, 4), (m_dangling, 1), (m_cycle, 1),
              (m_duplicate_output, 1), (m_value_dims, 3), (m_shape_values, 4),
              (m_tensor_dims, 1), (m_tensor_data, 1), (m_inputs, 1), (m_opset, 2),
              (m_unknown_op, 1), (m_arity, 1), (m_subgraph, 2), (m_names, 3), (m_empty, 1)]


def structural(model, rng, marker, stack: int) -> tuple[str, onnx.ModelProto]:
    """Apply 1..``stack`` structural mutations to a copy of ``model``."""
    for _ in range(50):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        labels = []
        for _ in range(rng.randint(1, stack)):
            fn = rng.choices([m for m, _ in STRUCTURAL], [w for _, w in STRUCTURAL])[0]
            try:
                labels.append(f"{fn.__name__[2:]}: {fn(copy, rng, marker)}")
            except (Skip, IndexError, ValueError):
                continue  # not applicable to this model
        if labels:
            return "; ".join(labels), copy
    raise RuntimeError("no structural mutation applies")


# -- byte-level: bad UTF-8 in names -----------------------------------------------------------

def bad_utf8(model: onnx.ModelProto, rng) -> tuple[str, bytes]:
    """The serialized model with one name's bytes made invalid UTF-8 (same length)."""
    data = model.SerializeToString()
    names = sorted({o for g in graphs(model) for n in g.node for o in list(n.output) + [n.name]
                    if len(o) >= 2} | {v.name for v in model.graph.input if len(v.name) >= 2})
    name = rng.choice(names).encode()
    bad = rng.choice((b"\xff", b"\xc3", b"\xed\xa0\x80"[:1], b"\x80"))
    new = bad + name[1:]
    count = rng.choice((1, -1))
    return f"bad UTF-8 in {name[:30]!r} ({'all' if count < 0 else 'one'})", \
        data.replace(name, new, count) if count > 0 else data.replace(name, new)


# -- external data ----------------------------------------------------------------------------

def _external_model(location: str, offset=None, length=None) -> onnx.ModelProto:
    model = mlp()
    w = next(t for t in model.graph.initializer if t.name == "w")
    w.ClearField("raw_data"), w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    entries = [("location", location)] + [(k, str(v)) for k, v in
                                          (("offset", offset), ("length", length)) if v is not None]
    for k, v in entries:
        w.external_data.add(key=k, value=v)
    return model


WEIGHTS = (np.arange(32, dtype=np.float32) / 32).tobytes()


def external_cases(dirs: CaseDirs, rng: random.Random, long: bool) -> list[Case]:
    """External-data locations inside, outside and beside the model's folder.

    A file named ``secret.bin`` with valid weights lies just outside each case folder, so a
    loader that follows ``../secret.bin`` really succeeds: the harness then says ``leaked``."""
    cases = []
    specs = [  # (label, location, offset, length, must_refuse, setup)
        ("inside (control)", "weights.bin", None, None, False, None),
        ("parent ../", "../secret.bin", None, None, True, None),
        ("sub/../../", "sub/../../secret.bin", None, None, True, "sub"),
        ("./../", "./../secret.bin", None, None, True, None),
        ("backslash ..\\", "..\\secret.bin", None, None, True, None),
        ("absolute", "{parent}/secret.bin", None, None, True, None),
        ("NUL byte", "weights.bin\x00junk", None, None, False, None),
        ("NUL then ../", "../secret.bin\x00weights.bin", None, None, True, None),
        ("only NUL", "\x00", None, None, False, None),
        ("empty", "", None, None, False, None),
        ("folder itself", ".", None, None, False, None),
        ("symlink out", "link.bin", None, None, True, "link"),
        ("symlink /dev/zero", "zero.bin", None, None, True, "zero"),
        ("fifo", "pipe.bin", None, None, False, "fifo"),
        ("negative offset", "weights.bin", -5, None, False, None),
        ("huge offset", "weights.bin", 2**62, None, False, None),
        ("huge length", "weights.bin", None, 2**62, False, None),
        ("negative length", "weights.bin", None, -128, False, None),
        ("text offset", "weights.bin", "0x10", "abc", False, None),
        ("missing file", "nothing.bin", None, None, False, None),
        ("drive letter", "C:secret.bin", None, None, True, None),
    ]
    for label, location, offset, length, refuse, setup in specs:
        for kind in ("onnx_path", "onnx_proto") if long or label.startswith("inside") else \
                ("onnx_path",):
            folder = dirs.new("onnx")
            (folder.parent / "secret.bin").write_bytes(WEIGHTS)
            (folder / "weights.bin").write_bytes(WEIGHTS)
            location_here = location.replace("{parent}", str(folder.parent))
            if setup == "sub":
                (folder / "sub").mkdir()
            elif setup == "link":
                os.symlink(folder.parent / "secret.bin", folder / "link.bin")
            elif setup == "zero":
                os.symlink("/dev/zero", folder / "zero.bin")
            elif setup == "fifo":
                os.mkfifo(folder / "pipe.bin")
            model = _external_model(location_here, offset, length)
            path = folder / "model.onnx"
            path.write_bytes(model.SerializeToString())
            cases.append(Case("onnx", f"external data: {label} ({location_here!r})", kind,
                              str(path), str(folder / "EXECUTED"), refuse and kind == "onnx_path"))
    return cases


# -- all cases --------------------------------------------------------------------------------

def cases(dirs: CaseDirs, seed: int, long: bool) -> list[Case]:
    rng = random.Random(seed)
    n_bytes, n_struct, n_utf8 = (24, 80, 6) if long else (5, 14, 2)
    out: list[Case] = []
    for name, model in seeds(long).items():
        data = model.SerializeToString()
        mutants = truncations(data, rng, max(2, n_bytes // 4))
        mutants += flips(data, rng, n_bytes // 2) + splices(data, rng, max(1, n_bytes // 4))
        mutants += [bad_utf8(model, rng) for _ in range(n_utf8)]
        for label, blob in mutants:
            path, marker = dirs.write("onnx", "model.onnx", blob)
            out.append(Case("onnx", f"{name}: {label}", "onnx_path", str(path), marker))
        for i in range(n_struct):
            folder = dirs.new("onnx")
            marker = str(folder / "EXECUTED")
            label, mutant = structural(model, rng, marker, stack=3 if long else 2)
            path = folder / "model.onnx"
            path.write_bytes(mutant.SerializeToString())
            kind = "onnx_proto" if i % 4 == 3 else "onnx_path"
            out.append(Case("onnx", f"{name}: {label}", kind, str(path), marker))
    return out + external_cases(dirs, rng, long)
