"""A .pt2 file never runs code while tdag reads it, and legitimate archives still load.

Archives are real ones written by ``torch.export.save``; hostile variants rewrite them with
``zipfile``. Where a payload could run, it would create a marker file: each test checks that
tdag raises a FileFormatError naming the file and that the marker does not exist, and where
the route is live in torch (sympify, pytree imports) it first shows that the payload runs
there, so that the refusal is not vacuous.
"""
from __future__ import annotations

import dataclasses
import inspect
import io
import json
import re
import struct
import sys
import zipfile

import pytest
import sympy
import torch
import torch.nn as nn
from torch.export import Dim

import tdag
from tdag.canonicalize.torch.pt2 import exprs as pt2_exprs
from tdag.canonicalize.torch.pt2.archive import check_pt2
from tdag.canonicalize.torch.pt2.exprs import check_guard, check_size
from tdag.canonicalize.torch.pt2.members import pickle_imports_beyond_tensors
from tdag.canonicalize.torch.capture import _same_view

MODEL_JSON = "models/model.json"
WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
SAMPLE_INPUTS = "data/sample_inputs/model.pt"


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x):
        return self.net(x)


class ConvNet(nn.Module):
    """Conv, batch norm (running statistics are buffers), pooling, a linear head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.norm = nn.BatchNorm2d(6)
        self.head = nn.Linear(6, 5)

    def forward(self, x):
        y = torch.relu(self.norm(self.conv(x)))
        return self.head(y.mean(dim=(2, 3)))


class WithBuffers(nn.Module):
    """A registered buffer and a plain tensor attribute (a lifted constant)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("offset", torch.arange(3.0))
        self.scale = torch.tensor([0.5, 1.0, 2.0])

    def forward(self, x):
        return self.lin(x) * self.scale + self.offset


class Pair(nn.Module):
    """Two inputs that share their batch: torch writes a guard that ties the two sizes."""

    def forward(self, x, y):
        return torch.cat([x, y], dim=1).sum(dim=1)


def _save(tmp_path, name, model, args, dynamic_shapes=None) -> str:
    torch.manual_seed(0)
    ep = torch.export.export(model.eval(), args, dynamic_shapes=dynamic_shapes, strict=False)
    path = str(tmp_path / f"{name}.pt2")
    torch.export.save(ep, path)
    return path


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> str:
    """A dynamic-batch archive with parameters, a buffer and a constant: the hostile seed."""
    return _save(tmp_path_factory.mktemp("seed"), "seed", WithBuffers(), (torch.randn(5, 4),),
                 ({0: Dim("batch", min=2)},))


def _rewrite(src: str, dst, edit=lambda name, data: data, add=()) -> str:
    """Copy the archive at ``src``, passing each member (name relative to the root folder)
    through ``edit`` (None drops it), then adding ``add``: (relative name, bytes) pairs."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        root = zin.namelist()[0].split("/")[0]
        for info in zin.infolist():
            data = edit(info.filename[len(root) + 1:], zin.read(info))
            if data is not None:
                zout.writestr(info.filename, data)
        for name, data in add:
            zout.writestr(f"{root}/{name}", data)
    return str(dst)


def _edit_json(member: str, change):
    """An ``edit`` that applies ``change`` to the JSON object of ``member``."""
    def edit(name, data):
        if name != member:
            return data
        value = json.loads(data)
        value = change(value) or value
        return json.dumps(value).encode()
    return edit


def _refused(path, *fragments) -> str:
    with pytest.raises(tdag.FileFormatError) as info:
        tdag.from_torch(path)
    message = str(info.value)
    assert repr(str(path)) in message or str(path) in message
    for fragment in fragments:
        assert fragment in message
    return message


# -- legitimate archives -----------------------------------------------------------------------


LEGIT = {  # name -> (model, example args, dynamic shapes, other inputs to compare at)
    "mlp": (MLP, lambda b: (torch.randn(b, 8),), None, ()),
    "convnet": (ConvNet, lambda b: (torch.randn(b, 3, 10, 10),), None, ()),
    "buffers": (WithBuffers, lambda b: (torch.randn(b, 4),), None, ()),
    "dynamic": (MLP, lambda b: (torch.randn(b, 8),), ({0: Dim("batch", min=2)},), (3, 7)),
    "guarded": (Pair, lambda b: (torch.randn(b, 2), torch.randn(b, 3)),
                ({0: Dim("b", min=2)}, {0: Dim("b", min=2)}), (4,)),
}


@pytest.mark.parametrize("name", list(LEGIT))
def test_legitimate_archives_load_and_match_eager(tmp_path, name):
    factory, inputs, shapes, batches = LEGIT[name]
    torch.manual_seed(0)
    model = factory().eval()
    path = _save(tmp_path, name, model, inputs(2), shapes)
    prog = tdag.from_torch(path)
    tdag.verify(prog)
    for batch in (2, *batches):
        args = inputs(batch)
        with torch.no_grad():
            torch.testing.assert_close(tdag.run(prog, *args), model(*args), rtol=1e-4,
                                       atol=1e-5)


def test_a_guarded_archive_really_holds_guards_and_sizes(tmp_path):
    """The "guarded" case exercises both grammars on what torch writes."""
    _, inputs, shapes, _ = LEGIT["guarded"]
    path = _save(tmp_path, "guarded", Pair(), inputs(2), shapes)
    with zipfile.ZipFile(path) as zf:
        program = json.loads(zf.read(f"guarded/{MODEL_JSON}"))
    assert program["guards_code"] and all(check_guard(g) is None for g in program["guards_code"])
    assert "Symbol(" in json.dumps(program)


# -- the routes to code execution --------------------------------------------------------------


def test_a_symbolic_size_that_runs_code_is_refused(seed, tmp_path):
    marker = tmp_path / "sympify_ran"
    payload = f"open({str(marker)!r}, 'w') and Symbol('s"
    sympy.sympify(payload + "0')")  # live: torch's deserializer sympifies every size
    assert marker.exists()
    marker.unlink()

    def inject(name, data):
        return data.replace(b"Symbol('s", payload.encode(), 1) if name == MODEL_JSON else data

    path = _rewrite(seed, tmp_path / "sympify.pt2", inject)
    _refused(path, "expr_str", MODEL_JSON)
    assert not marker.exists()


@pytest.mark.parametrize("member", [
    "data/aotinductor/model/model.so",            # loaded with dlopen: its constructor runs
    "data/aotinductor/model/model_metadata.json",  # what makes torch look for the library
    "data/aotinductor/model/model.wrapper_compile_flags.json",  # names the compiler to run
    "model.wrapper_compile_flags.json",
    "extra/helper.dylib",
])
def test_aotinductor_payloads_and_libraries_are_refused(seed, tmp_path, member):
    marker = tmp_path / "compiler_ran"
    flags = json.dumps({"compiler": f"touch {marker}", "AOTI_DEVICE_KEY": "cpu"}).encode()
    payload = flags if member.endswith(".json") else b"\x7fELF" + b"\0" * 60
    path = _rewrite(seed, tmp_path / "aoti.pt2", add=[(member, payload)])
    _refused(path, member, "compiled code")
    assert not marker.exists()


class _Exploit:
    """Unpickling it opens (creates) the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _pickled(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_a_pickled_weight_is_refused(seed, tmp_path):
    marker = tmp_path / "unpickled"

    def pickle_first(config):
        entry = next(iter(config["config"].values()))
        entry["use_pickle"] = True
        return config

    weights = _edit_json(WEIGHTS_CONFIG, pickle_first)

    def edit(name, data):
        return _pickled({"w": _Exploit(marker)}) if name == "data/weights/weight_0" \
            else weights(name, data)

    path = _rewrite(seed, tmp_path / "pickled_weight.pt2", edit)
    _refused(path, WEIGHTS_CONFIG, "pickled")
    assert not marker.exists()


def test_pickled_sample_inputs_and_objects_are_refused(seed, tmp_path):
    marker = tmp_path / "unpickled"
    evil = _pickled(((_Exploit(marker),), {}))
    path = _rewrite(seed, tmp_path / "inputs.pt2",
                    lambda name, data: evil if name == SAMPLE_INPUTS else data)
    _refused(path, SAMPLE_INPUTS, f"imports {open.__module__}.open")
    for member in ("data/constants/custom_obj_0", "data/constants/opaque_obj_0",
                   "data/weights/model.pt"):
        path = _rewrite(seed, tmp_path / "objects.pt2", add=[(member, evil)])
        _refused(path, member, "pickled Python object")
    assert not marker.exists()


def test_a_pytree_spec_that_imports_a_module_is_refused(seed, tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    module = "tdag_pt2_marker_module"
    (tmp_path / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').close()\nlist = list\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    leaf = {"type": None, "context": None, "children_spec": []}
    spec = json.dumps([1, {"type": "collections.defaultdict", "children_spec": [leaf],
                           "context": {"default_factory_module": module,
                                       "default_factory_name": "list", "dict_context": ["x"]}}])
    torch.utils._pytree.treespec_loads.__wrapped__(spec)  # live: torch imports the module
    assert marker.exists()
    marker.unlink()
    monkeypatch.delitem(sys.modules, module)
    path = _rewrite(seed, tmp_path / "spec.pt2", _edit_json(MODEL_JSON, _in_spec(spec)))
    _refused(path, "in_spec", "defaultdict")
    enum = json.dumps([1, {"type": "builtins.dict", "children_spec": [leaf],
                           "context": json.dumps([{"__enum__": True, "fqn": f"{module}:E",
                                                   "name": "A"}])}])
    path = _rewrite(seed, tmp_path / "enum.pt2", _edit_json(MODEL_JSON, _in_spec(enum)))
    _refused(path, "in_spec", "enum")
    assert not marker.exists()


def _in_spec(spec: str, key: str = "in_spec"):
    def change(program):
        program["graph_module"]["module_call_graph"][0]["signature"][key] = spec
    return change


def test_a_pytree_type_naming_a_module_is_read_as_data_not_imported(seed, tmp_path,
                                                                     monkeypatch):
    """A node type tdag has not registered (a ModelOutput, a user's dataclass, here a module
    that would write a marker when imported) becomes a dict of its fields, or a tuple where
    its context names none: the archive loads, the output is named by the field, and the
    module is never imported."""
    marker = tmp_path / "imported"
    module = "tdag_pt2_foreign_type_module"
    (tmp_path / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                           f"class Out(dict): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    leaf = {"type": None, "context": None, "children_spec": []}
    inputs = [1, {"type": "builtins.tuple", "context": "null", "children_spec": [
        {"type": f"{module}.Args", "context": json.dumps(None), "children_spec": [leaf]},
        {"type": "builtins.dict", "context": "[]", "children_spec": []}]}]
    x = torch.randn(3, 4)
    reference = tdag.run(tdag.from_torch(seed), x)
    for context, name in (('["y"]', "y"), ('[["y"], ["unused"]]', "y"), ("7", "out0")):
        outputs = [1, {"type": f"{module}.Out", "context": context, "children_spec": [leaf]}]
        def change(program, outputs=outputs):
            _in_spec(json.dumps(inputs))(program)
            _in_spec(json.dumps(outputs), "out_spec")(program)
        path = _rewrite(seed, tmp_path / "foreign.pt2", _edit_json(MODEL_JSON, change))
        prog = tdag.from_torch(path)
        assert prog.main.outputs == (name,)
        torch.testing.assert_close(tdag.run(prog, x), reference)
    assert not marker.exists() and module not in sys.modules
    # the rewrite lives only inside tdag's load: torch's own reader still refuses the type
    assert torch._export.serde.serialize.treespec_loads is torch.utils._pytree.treespec_loads
    with pytest.raises(NotImplementedError, match="not registered"):
        torch.utils._pytree.treespec_loads(json.dumps(outputs))
    assert not marker.exists()


def test_guards_that_run_code_are_refused(seed, tmp_path):
    marker = tmp_path / "guard_ran"
    guard = f"open({str(marker)!r}, 'w') is not None"  # ExportedProgram.module() execs guards
    path = _rewrite(seed, tmp_path / "guard.pt2", _edit_json(
        MODEL_JSON, lambda program: program.update(guards_code=[guard])))
    _refused(path, "guards_code")
    assert not marker.exists()


# -- damaged and malformed archives ------------------------------------------------------------


def _truncated(seed, dst):
    data = open(seed, "rb").read()
    dst.write_bytes(data[: len(data) // 2])
    return str(dst)


def _bad_zip64_locator(seed, dst):
    """A zip64 end-of-central-directory locator (before the end record) claiming 2 disks."""
    data = open(seed, "rb").read()
    end = data.rindex(b"PK\x05\x06")
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, 0, 2)
    dst.write_bytes(data[:end] + locator + data[end:])
    return str(dst)


def _empty_zip(seed, dst):
    zipfile.ZipFile(dst, "w").close()
    return str(dst)


def _compressed(seed, dst):
    with zipfile.ZipFile(seed) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    return str(dst)


DAMAGED = {  # name -> (make the file from the seed, fragments of the error)
    "empty model.json": (lambda s, d: _rewrite(s, d, _edit_json(MODEL_JSON, lambda p: p.clear())),
                         ("graph_module",)),
    "model.json not JSON": (lambda s, d: _rewrite(
        s, d, lambda n, data: b"{'graph'" if n == MODEL_JSON else data), ("not valid JSON",)),
    "model.json a list": (lambda s, d: _rewrite(
        s, d, lambda n, data: b"[]" if n == MODEL_JSON else data), ("not a JSON object",)),
    "truncated": (_truncated, ("zip",)),
    "bad zip64 locator": (_bad_zip64_locator, ("zip",)),
    "empty zip": (_empty_zip, ("empty zip",)),
    "not a zip": (lambda s, d: _text_file(d), ("not a .pt2 archive",)),
    "climbs out": (lambda s, d: _rewrite(s, d, add=[("../outside.json", b"{}")]), ("'..'",)),
    "absolute": (lambda s, d: _absolute(s, d), ("absolute",)),
    "duplicate": (lambda s, d: _rewrite(s, d, add=[("MODELS/MODEL.JSON", b"{}")]),
                  ("twice",)),
    "compressed": (_compressed, ("compressed",)),
    "unknown member": (lambda s, d: _rewrite(s, d, add=[("data/notes.bin", b"x")]),
                       ("data/notes.bin", "not part of a program")),
    "wrong format": (lambda s, d: _rewrite(
        s, d, lambda n, data: b"pt3" if n == "archive_format" else data), ("archive_format",)),
    "missing weights": (lambda s, d: _rewrite(
        s, d, lambda n, data: None if n == "data/weights/weight_0" else data), ("weight_0",)),
}


def _text_file(dst):
    dst.write_text("hello")
    return str(dst)


def _absolute(seed, dst):
    with zipfile.ZipFile(seed) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
        zout.writestr("/etc/evil", b"x")
    return str(dst)


@pytest.mark.parametrize("name", list(DAMAGED))
def test_damaged_archives_raise_file_format_errors_only(seed, tmp_path, capfd, name):
    make, fragments = DAMAGED[name]
    path = make(seed, tmp_path / "damaged.pt2")
    _refused(path, *fragments)
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("symbol", ["u999999999999", "zuf1_000_000_000"])
def test_a_huge_unbacked_symbol_index_is_refused_not_counted_to(seed, tmp_path, symbol):
    """torch would bump a counter once per index up to it: a hang, not an error."""
    ranges = {symbol: {"min_val": 0, "max_val": 5}}
    path = _rewrite(seed, tmp_path / "count.pt2", _edit_json(
        MODEL_JSON, lambda program: program["range_constraints"].update(ranges)))
    _refused(path, symbol, "count up to")


def test_errors_inside_torch_become_file_format_errors_without_logging(seed, tmp_path, capfd):
    def break_first_node(program):
        node = program["graph_module"]["graph"]["nodes"][0]
        node["inputs"][0]["arg"] = {"as_tensor": {"name": "no_such_value"}}

    path = _rewrite(seed, tmp_path / "broken.pt2", _edit_json(MODEL_JSON, break_first_node))
    _refused(path, "cannot load", "SerializeError")
    # a range for a symbol the graph lacks: torch logs a warning and loads the program
    path = _rewrite(seed, tmp_path / "noisy.pt2", _edit_json(
        MODEL_JSON, lambda p: p["range_constraints"].update(zz9={"min_val": 2, "max_val": 5})))
    tdag.verify(tdag.from_torch(path))
    assert capfd.readouterr().err == ""


def test_torch_must_read_the_bytes_tdag_checked(seed):
    with open(seed, "rb") as file:
        layout = check_pt2(file, "seed")
        name, digest = layout.digests[0]
        _same_view(file, layout)  # the same archive: torch reads what tdag read
        forged = dataclasses.replace(layout, digests=((name, bytes(32)),))
        with pytest.raises(tdag.FileFormatError, match="other bytes"):
            _same_view(file, forged)
        fewer = dataclasses.replace(layout, members=layout.members - {name})
        with pytest.raises(tdag.FileFormatError, match="other members"):
            _same_view(file, fewer)


# -- the grammar of sizes and guards -----------------------------------------------------------


def _torch_sizes():
    """srepr of the expressions torch's shape environment builds, as the serializer writes."""
    from torch.utils._sympy import functions as F
    from torch.utils._sympy.numbers import int_oo
    s = sympy.Symbol("s0", integer=True, positive=True)
    u = sympy.Symbol("u1", integer=True)
    exprs = [s, 2 * s + 1, s * u - 3, s**2, 1 / s, sympy.sqrt(s), F.FloorDiv(s, 2),
             F.CeilDiv(s, 3), F.Mod(s, 4), F.PythonMod(u, 3), sympy.Max(s, u), sympy.Min(s, 8),
             F.ToFloat(s), F.IntTrueDiv(s, 2), F.Where(s > 2, s, u), sympy.Eq(s, 2),
             sympy.Ne(s, 3), s < 4, sympy.And(s >= u, u > 2), sympy.Not(sympy.Eq(s, 1)),
             sympy.Float(1.5), sympy.Rational(1, 3), int_oo, -int_oo, sympy.oo, sympy.true,
             sympy.Piecewise((s, s > 2), (u, True)), F.OpaqueUnaryFn_sqrt(s),
             F.ModularIndexing(s, 2, 4), F.LShift(s, 2), F.PowByNatural(s, 3)]
    return [sympy.srepr(e) for e in exprs]


@pytest.mark.parametrize("text", _torch_sizes())
def test_sizes_torch_writes_are_accepted(text):
    assert check_size(text) is None


REFUSED_SIZES = {
    "open('/tmp/m', 'w')": "open",
    "__import__('os').system('true')": "__import__",
    "Symbol('s0').__class__": "attribute",
    "Integer(1).__class__.__base__": "attribute",
    "(lambda: 0)()": "character ':'",
    "Symbol('s0')[0]": "character '['",
    "Symbol('s0', integer=Integer(1))": "passes",
    "Max(*Symbol('s0'))": "starred",
    "Add(s0, key=1)": "keywords",
    "Symbol('a b')": "Symbol takes one literal",
    "Symbol('open')": "function's name",
    "Symbol(open)": "Symbol takes one literal",
    "Integer('1')": "literal '1'",
    "Pow(Integer(2), Integer(1000000000))": "raises to",
    "2**99999999": "raises to",
    "LShift(Integer(1), Integer(10000000000))": "raises to",
    "Pow(Integer(2), Symbol('s0'))": "raises to",
    "Integer(123456789012345678901234567890)": "digits",
    "f'{1}'": "character '{'",
    "Symbol('s0') < 2": "character '<'",
    "Symbol('s0') == 2": "compare",
    "Float('1.5', _assumptions=1)": "passes",
    "exec": "exec",
    "s0 ^ 2": "character",
    "\"s0\"": "character",
    "s0\nopen('x')": "character",
}


@pytest.mark.parametrize("text,why", list(REFUSED_SIZES.items()))
def test_sizes_outside_the_grammar_are_refused(text, why):
    reason = check_size(text)
    assert reason is not None and why.lower() in reason.lower(), reason


def test_size_grammar_knows_every_function_torch_gives_sympify():
    from torch._export.serde.serialize import GraphModuleDeserializer
    source = inspect.getsource(GraphModuleDeserializer.deserialize)
    names = set(re.findall(r'"(\w+)": torch\.utils\._sympy\.functions\.\w+', source))
    assert names and names <= pt2_exprs.TORCH_SYMPY_FUNCTIONS


def test_huge_and_deep_sizes_are_refused_without_recursing():
    assert "characters long" in check_size("s0 + " * 10_000 + "s0")
    assert check_size("(" * 3000 + "s0" + ")" * 3000) is not None
    assert "deeper" in check_size("Add(" * 60 + "s0" + ")" * 60)


GUARDS_ACCEPTED = [
    "L['x'].size()[0] == L['y'].size()[0]",
    "((L['y'].size()[0] + L['x'].size()[0]) % 2) == 0",
    "2 <= L['x'].size()[0] and L['x'].size()[0] <= 64",
    "math.floor(L['x'].size()[0] / 2) != 3",
    "torch.sym_float(L['args'][0].size()[1]) < math.inf",
    "max(L['x'].stride()[0], 1) >= abs(-L['x'].storage_offset())",
    "L['n'] == 3",
]


@pytest.mark.parametrize("text", GUARDS_ACCEPTED)
def test_guards_torch_writes_are_accepted(text):
    assert check_guard(text) is None


REFUSED_GUARDS = {
    "__import__('os').system('true')": "__import__",
    "open('m', 'w') == 0": "open",
    "L['x'].size()[0] is None": "'in' or 'is'",
    "L['x'].__class__": "reads",
    "L['x'].size.__self__": "reads",
    "L['x'].size()[0].bit_length()": "calls",
    "L[__import__('os')]": "indexes",
    "L['a b']": "indexes",
    "L": "names",
    "math.__loader__": "reads",
    "torch.load('x')": "calls",
    "[c for c in 'x']": "listcomp",
    "L['x'].size()[0] in (1, 2)": "'in' or 'is'",
    "L['x'].size()[0] ** 99999999": "raises to",
    "\"quoted\"": "character",
}


@pytest.mark.parametrize("text,why", list(REFUSED_GUARDS.items()))
def test_guards_outside_the_grammar_are_refused(text, why):
    reason = check_guard(text)
    assert reason is not None and why.lower() in reason.lower(), reason


# -- pickles -----------------------------------------------------------------------------------


def test_tensor_pickles_pass_and_every_protocol_of_an_import_is_caught(tmp_path):
    tensors = ((torch.randn(2, 3), torch.arange(4), torch.zeros(2, dtype=torch.float8_e4m3fn)),
               {"mask": torch.ones(2, dtype=torch.bool)})
    with zipfile.ZipFile(io.BytesIO(_pickled(tensors))) as zf:
        assert pickle_imports_beyond_tensors(zf.read("archive/data.pkl")) is None
    import pickle
    marker = tmp_path / "unpickled"
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        why = pickle_imports_beyond_tensors(pickle.dumps(_Exploit(marker), protocol))
        assert why is not None and f"imports {open.__module__}.open" in why, (protocol, why)
    assert "not a valid pickle" in pickle_imports_beyond_tensors(b"\x80\x02garbage")
    assert not marker.exists()
