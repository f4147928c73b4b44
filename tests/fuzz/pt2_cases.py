""".pt2 cases: archives written by torch.export.save, rewritten member by member: members
dropped, duplicated, renamed; the graph's JSON corrupted; pickles, AOTInductor libraries,
compiler-flag files and Python in symbolic sizes inserted. Every payload that could run
creates the case's marker file, so running it at all is seen."""
from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
import warnings
import zipfile
from pathlib import Path

import torch

from .harness import Case, CaseDirs, flips, splices, truncations


# -- seeds ------------------------------------------------------------------------------------

class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x)).sum(-1)


class _ConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(3)
        self.offset = torch.linspace(0, 1, 3).reshape(1, 3, 1, 1)  # a lifted constant

    def forward(self, x):
        return self.bn(self.conv(x)) + self.offset


class _Cond(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x * 2, (x,))


def seeds(folder: Path, long: bool) -> dict[str, Path]:
    torch.manual_seed(0)
    models = {
        "linear-dynamic": (_Linear(), (torch.randn(2, 4),),
                           ({0: torch.export.Dim("batch")},)),
        "convbn": (_ConvBN().eval(), (torch.randn(1, 2, 5, 5),), None),
    }
    if long:
        models["cond"] = (_Cond(), (torch.randn(4),), None)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, (module, args, dynamic) in models.items():
        ep = torch.export.export(module, args, dynamic_shapes=dynamic, strict=False)
        paths[name] = folder / f"{name}.pt2"
        torch.export.save(ep, str(paths[name]))
    return paths


# -- the zip ----------------------------------------------------------------------------------

def members(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(i.filename, z.read(i.filename)) for i in z.infolist()]


def rezip(items: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are the point of some cases
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            for name, data in items:
                z.writestr(zipfile.ZipInfo(name), data)
    return buf.getvalue()


def _root(items) -> str:
    return items[0][0].split("/", 1)[0] + "/"


def _find(items, suffix: str) -> int:
    return next(i for i, (name, _) in enumerate(items) if name.endswith(suffix))


def edited(data: bytes, rng: random.Random, marker: str, scratch: Path, json_how=None,
           zip_how=None) -> tuple[str, bytes]:
    """One given edit of the graph JSON (``json_how``) or of the members (``zip_how``)."""
    items = members(data)
    if json_how is not None:
        i = _model_json(items)
        model = json.loads(items[i][1])
        label = json_edit(model, rng, marker, json_how)
        items[i] = (items[i][0], json.dumps(model).encode())
    else:
        label = zip_edit(items, rng, marker, scratch, zip_how)
    return label, rezip(items)


def _model_json(items) -> int:
    return next(i for i, (n, _) in enumerate(items) if "/models/" in n and n.endswith(".json"))


# -- payloads that leave the marker if they ever run ------------------------------------------

def python_payloads(marker: str) -> list[str]:
    return [f"__import__('builtins').open({marker!r}, 'w').close()",
            f"__import__('os').system('touch {marker}')",
            f"exec(\"open({marker!r}, 'w')\")",
            f"(lambda: __import__('os').system('touch {marker}'))()",
            f"Symbol('s0') + __import__('os').system('touch {marker}')",
            f"eval(\"__import__('os').system('touch {marker}')\")"]


class _Evil:
    """Pickles as a call of os.system: unpickling it runs the shell."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def pickles(marker: str) -> list[tuple[str, bytes]]:
    saved = io.BytesIO()
    torch.save({"x": _Evil(marker)}, saved)
    return [("pickle", __import__("pickle").dumps(_Evil(marker))),
            ("torch.save", saved.getvalue())]


def shared_library(marker: str, scratch: Path) -> bytes:
    """A .so whose constructor creates the marker (junk bytes where no C compiler exists)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc:
        src = scratch / "evil.c"
        src.write_text('#include <stdio.h>\n__attribute__((constructor)) static void run(void)'
                       f' {{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
        lib = scratch / "evil.so"
        done = subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)],
                              capture_output=True)
        if done.returncode == 0:
            data = lib.read_bytes()
            src.unlink(), lib.unlink()
            return data
    return b"\x7fELF" + bytes(60)


def aoti_members(marker: str, scratch: Path, library: bool, sources: bool) -> dict:
    """An AOTInductor payload as torch's loader wants it: its library is dlopened (the
    constructor runs), or its sources compiled with the command its flag files describe."""
    base = "data/aotinductor/model/model.wrapper"
    shell = f"; touch {marker}; #"
    flags = json.dumps({
        "compiler": f"touch {marker}; true", "definitions": [shell],
        "include_dirs": [f"$(touch {marker})"], "cflags": [shell], "ldflags": [shell],
        "libraries_dirs": [shell], "libraries": [shell], "passthrough_args": [shell],
        "aot_mode": False, "use_relative_path": False, "compile_only": False}).encode()
    parts = {base + "_metadata.json": json.dumps({"AOTI_DEVICE_KEY": "cpu"}).encode()}
    if library:
        parts[base + ".so"] = shared_library(marker, scratch)
    if sources:
        parts.update({base + ".cpp": b"int main() { return 0; }\n",
                      base + "_compile_flags.json": flags, base + "_linker_flags.json": flags})
    return parts


# -- mutations --------------------------------------------------------------------------------

def _walk(obj, path=()):
    yield path, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, path + (i,))


def _set(obj, path, value):
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


def _nested(n: int):
    value: list = []
    for _ in range(n):
        value = [value]
    return value


HOSTILE_VALUES = [None, -1, 2**62, 2**64, -(2**63), "x", [], {}, 1e308, True, "", "\x00"]
TARGETS = ["torch.ops.aten.nonexistent.default", "builtins.eval", "os.system",
           "torch.ops.aten.add.Tensor", "_operator.getitem", "math.floor", "",
           "torch.ops.higher_order.cond", "torch.ops.aten.linear", "torch.ops.aten.view.default"]
SPEC_TYPES = ["os.system", "builtins.eval", "__main__.Evil", "collections.defaultdict",
              "collections.OrderedDict", "torch.nn.Module", "subprocess.Popen"]


def json_edit(model: dict, rng: random.Random, marker: str, how: int | None = None) -> str:
    """Edit the graph JSON in place; say what was done."""
    how = rng.randrange(10) if how is None else how
    payload = rng.choice(python_payloads(marker))
    if how == 0:  # Python in the symbolic sizes
        spots = [p for p, v in _walk(model) if isinstance(v, dict) and "expr_str" in v]
        if not spots:
            model["graph_module"]["graph"]["sym_int_values"]["evil"] = {
                "as_expr": {"expr_str": payload, "hint": {"as_int": 2}}}
            return f"sym_int_values['evil'] := {payload[:40]!r}"
        for p in spots if rng.random() < 0.5 else [rng.choice(spots)]:
            _set(model, p + ("expr_str",), payload)
        return f"expr_str := {payload[:50]!r}"
    if how == 1:
        model.setdefault("range_constraints", {})[payload] = {"min_val": 0, "max_val": None}
        return f"range_constraints key {payload[:40]!r}"
    if how == 2:
        model["guards_code"] = [payload]
        return f"guards_code := [{payload[:40]!r}]"
    if how == 3:  # pytree specs that name modules to import
        calls = model["graph_module"]["module_call_graph"]
        sig = next(c["signature"] for c in calls if c.get("signature"))
        key = rng.choice(("in_spec", "out_spec"))
        spec = json.loads(sig[key])
        victim = rng.choice([v for _, v in _walk(spec) if isinstance(v, dict) and "type" in v])
        victim["type"] = rng.choice(SPEC_TYPES)
        victim["context"] = rng.choice(['"os.system"', payload, json.dumps([payload])])
        sig[key] = json.dumps(spec)
        return f"{key} type {victim['type']!r}"
    if how == 4:
        node = rng.choice(model["graph_module"]["graph"]["nodes"])
        node["target"] = rng.choice(TARGETS)
        return f"node target := {node['target']!r}"
    if how == 5:
        spots = [p for p, v in _walk(model) if isinstance(v, dict) and "as_int" in v
                 and "sizes" in p]
        if not spots:
            return json_edit(model, rng, marker)
        p = rng.choice(spots)
        _set(model, p + ("as_int",), rng.choice((2**62, -5, 0, 2**63 - 1, 10**12)))
        return f"size at {p[-4:]} := huge/negative"
    if how == 6:
        path, _ = rng.choice([(p, v) for p, v in _walk(model) if p])
        _set(model, path, rng.choice(HOSTILE_VALUES + [payload, _nested(50)]))
        return f"value at {path[-3:]} replaced"
    if how == 7:
        dicts = [(p, v) for p, v in _walk(model) if isinstance(v, dict) and v]
        path, d = rng.choice(dicts)
        key = rng.choice(sorted(d, key=str))
        del d[key]
        return f"key {key!r} deleted at {path[-3:]}"
    if how == 8:
        node = rng.choice(model["graph_module"]["graph"]["nodes"])
        field = rng.choice(("name", "metadata"))
        node[field] = payload if field == "name" else {"stack_trace": payload * 100,
                                                        "nn_module_stack": payload}
        return f"node {field} := payload"
    model["schema_version"] = rng.choice(({"major": 99, "minor": 0}, None, {"major": -1},
                                          {"major": 8, "minor": 999}))
    return f"schema_version := {model['schema_version']}"


def zip_edit(items: list, rng: random.Random, marker: str, scratch: Path,
             how: int | None = None) -> str:
    """Edit the list of members in place; say what was done."""
    root = _root(items)
    how = rng.randrange(14) if how is None else how
    if how == 0:
        i = rng.randrange(len(items))
        return f"drop {items.pop(i)[0]}"
    if how == 1:
        i = rng.randrange(len(items))
        items.append((items[i][0], rng.choice((b"", b"junk", items[i][1][::-1]))))
        return f"duplicate {items[i][0]}"
    if how == 2:
        i = rng.randrange(len(items))
        name = items[i][0]
        new = rng.choice((name.upper(), name + ".bak", "other/" + name.split("/", 1)[1],
                          name.replace("model", "evil"), "/" + name, "../" + name, name[1:]))
        items[i] = (new, items[i][1])
        return f"rename {name} -> {new}"
    if how == 3:  # a pickled weight
        i = _find(items, "_weights_config.json")
        config = json.loads(items[i][1])
        key = rng.choice(sorted(config["config"]))
        entry = config["config"][key]
        entry["use_pickle"] = True
        label, blob = rng.choice(pickles(marker))
        items[i] = (items[i][0], json.dumps(config).encode())
        items[_find(items, "data/weights/" + entry["path_name"])] = \
            (root + "data/weights/" + entry["path_name"], blob)
        return f"weight {key!r} as a {label} pickle"
    if how == 4:  # constants that are pickled objects
        i = _find(items, "_constants_config.json")
        prefix = rng.choice(("custom_obj_", "opaque_obj_", "tensor_"))
        config = json.loads(items[i][1])
        config["config"]["evil"] = {"path_name": prefix + "0", "is_param": False,
                                    "use_pickle": True, "tensor_meta": None}
        label, blob = rng.choice(pickles(marker))
        items[i] = (items[i][0], json.dumps(config).encode())
        items.append((root + "data/constants/" + prefix + "0", blob))
        return f"constant {prefix}0 as a {label} pickle"
    if how == 5:
        i = _find(items, "data/sample_inputs/model.pt")
        label, blob = rng.choice(pickles(marker))
        items[i] = (items[i][0], blob)
        return f"sample inputs as a {label} pickle"
    if how == 6:  # the legacy weights / constants files (a pickle each)
        label, blob = rng.choice(pickles(marker))
        where = rng.choice(("data/weights/model.pt", "data/constants/model.pt"))
        items.append((root + where, blob))
        return f"legacy {where} as a {label} pickle"
    if how in (7, 8):  # AOTInductor: a library, or sources and the flags of its compiler
        parts = aoti_members(marker, scratch, library=how == 7 or rng.random() < 0.3,
                             sources=how == 8)
        items.extend((root + k, v) for k, v in parts.items())
        return f"AOTInductor members {sorted(k.rsplit('/', 1)[1] for k in parts)}"
    if how == 9:  # zip slip: a member whose name climbs out to the marker
        name = root + "data/aotinductor/model/" + "../" * 30 + marker.lstrip("/")
        items.append((name, b"slipped"))
        items.extend((root + k, v) for k, v in
                     aoti_members(marker, scratch, library=True, sources=False).items())
        return "zip slip member to the marker"
    if how == 10:
        i = _find(items, "archive_version")
        items[i] = (items[i][0], rng.choice((b"99", b"", b"0\x00", b"-1")))
        return "archive_version changed"
    if how == 11:
        items.append((root + "extra/" + rng.choice(("x", "../x", "a/b")),
                      rng.choice((b"\xff\xfe", marker.encode(), b"\x00" * 1000))))
        return "extra member"
    if how == 12:  # a weight's bytes shorter than its metadata says
        i = next(i for i, (n, _) in enumerate(items) if "data/weights/weight_" in n)
        items[i] = (items[i][0], items[i][1][:len(items[i][1]) // 2])
        return f"truncated member {items[i][0]}"
    i = _find(items, "_weights_config.json")
    config = json.loads(items[i][1])
    entry = config["config"][rng.choice(sorted(config["config"]))]
    meta = entry["tensor_meta"]
    field = rng.choice(("sizes", "strides", "storage_offset", "dtype", "path_name"))
    if field in ("sizes", "strides"):
        meta[field] = [{"as_int": rng.choice((2**62, -3, 0, 10**9))} for _ in meta[field]]
    elif field == "storage_offset":
        meta[field] = {"as_int": rng.choice((2**62, -1))}
    elif field == "dtype":
        meta[field] = rng.choice((0, 99, -1))
    else:
        entry[field] = rng.choice(("../../../etc/passwd", "weight_99", "", "/etc/passwd"))
    items[i] = (items[i][0], json.dumps(config).encode())
    return f"weights config {field} hostile"


def legacy_archive(marker: str) -> bytes:
    """The pre-2.7 layout torch.export.load falls back to: its state dict is a pickle."""
    label, blob = pickles(marker)[1]
    return rezip([("version", b"8.20"), ("serialized_exported_program.json", b"{}"),
                  ("serialized_state_dict.pt", blob), ("serialized_constants.pt", blob),
                  ("serialized_example_inputs.pt", blob)])


def mutant(data: bytes, rng: random.Random, marker: str, scratch: Path) -> tuple[str, bytes]:
    items = members(data)
    labels = []
    for _ in range(rng.randint(1, 2)):
        if rng.random() < 0.5:
            i = _model_json(items)
            model = json.loads(items[i][1])
            labels.append("json: " + json_edit(model, rng, marker))
            try:
                blob = json.dumps(model).encode()
            except RecursionError:
                blob = items[i][1]
            items[i] = (items[i][0], blob)
        else:
            try:
                labels.append("zip: " + zip_edit(items, rng, marker, scratch))
            except (StopIteration, IndexError):  # no such member, or no weights at all
                continue
    return "; ".join(labels) or "rezipped", rezip(items)


def json_text_edit(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """The graph JSON damaged as text: truncated, not JSON, deeply nested."""
    items = members(data)
    i = _model_json(items)
    text = items[i][1]
    how = rng.randrange(4)
    new = [text[:rng.randrange(len(text))], b"null", b"[" * 100000 + b"]" * 100000,
           text.replace(b'"as_int"', b'"as_int" ', 1) + b"}}}"][how]
    items[i] = (items[i][0], new)
    return f"model json text #{how}", rezip(items)


# -- all cases --------------------------------------------------------------------------------

def cases(dirs: CaseDirs, seed_dir: Path, seed: int, long: bool) -> list[Case]:
    rng = random.Random(seed)
    n_bytes, n_edit = (12, 60) if long else (4, 24)
    out = []
    for name, path in seeds(seed_dir, long).items():
        data = path.read_bytes()
        blobs = truncations(data, rng, n_bytes // 2) + flips(data, rng, n_bytes // 2)
        blobs += splices(data, rng, max(1, n_bytes // 4))
        for label, blob in blobs:
            file, marker = dirs.write("pt2", "model.pt2", blob)
            out.append(Case("pt2", f"{name}: {label}", "pt2_path", str(file), marker))
        for i in range(n_edit + 4):
            folder = dirs.new("pt2")
            marker = str(folder / "EXECUTED")
            if i < 3:
                label, blob = json_text_edit(data, rng)
            elif i == 3:
                label, blob = "legacy pre-2.7 archive of pickles", legacy_archive(marker)
            else:
                label, blob = mutant(data, rng, marker, folder)
            (folder / "model.pt2").write_bytes(blob)
            out.append(Case("pt2", f"{name}: {label}", "pt2_path", str(folder / "model.pt2"),
                            marker))
    return out
