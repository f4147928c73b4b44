"""tdag's own reader of .pt2 archives: it checks a file before torch's loader reads any of it.

``torch.export.load`` runs code from a hostile archive in several ways: ``sympy.sympify``
evaluates the graph's symbolic sizes as Python; a pytree spec names a module that is
imported to rebuild a ``defaultdict`` or an enum; an AOTInductor payload has its shared
library loaded, or its "compiler" run through the shell; pickled members run whatever they
name. This module reads the archive with ``zipfile``, ``json`` and ``pickletools`` only (no
torch) and accepts exactly what ``torch.export.save`` writes for a program:

- members under one root folder, stored uncompressed (as torch stores them), with plain
  relative names: no ``..``, no absolute or backslashed paths, no duplicates. A name never
  reaches the file system: torch reads members by name from the zip;
- ``models/<m>.json`` whose symbolic sizes and guards parse under ``pt2_exprs``' grammar and
  whose pytree specs import nothing;
- weights and constants as raw tensor bytes listed in ``*_config.json``, never pickled;
- sample inputs as a ``torch.save`` file whose pickle imports only tensor rebuilders,
  storages and dtypes (``pt2_zip``).

Anything else (compiled code, pickled objects, unknown members, malformed JSON) raises a
FileFormatError that names the member.
"""
from __future__ import annotations

import hashlib
import json
import re
import zipfile
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

from tdag.canonicalize.torch.pt2.exprs import check_guard, check_size
from tdag.canonicalize.torch.pt2.members import ZIP_ERRORS, check_names, check_torch_save
from tdag.errors import FileFormatError

MAX_METADATA_BYTES = 256 << 20  # one JSON or pickle member: a model's graph is a few MB

# members of a torch.export.save archive, relative to its root folder, and their kinds
_LAYOUT = [
    (re.compile(r"archive_format|archive_version|byteorder|\.data/version"
                r"|\.data/serialization_id|extra/[\w.\-]+(/[\w.\-]+)*"), "text"),
    (re.compile(r"models/(\w+)\.json"), "model"),
    (re.compile(r"data/weights/\w+_weights_config\.json"), "config"),
    (re.compile(r"data/constants/\w+_constants_config\.json"), "config"),
    (re.compile(r"data/weights/weight_\d+|data/constants/tensor_\d+"), "tensor"),
    (re.compile(r"data/sample_inputs/\w+\.pt"), "sample_inputs"),
]
# compiled code: AOTInductor's (and other backends') folders, shared libraries and sources,
# and the json files that tell AOTInductor's loader which compiler to run and how
_CODE_DIRS = ("data/aotinductor/", "data/executorch/", "data/mtia", "xl_model_weights/")
_CODE_SUFFIXES = (".so", ".dll", ".dylib", ".pyd", ".cpp", ".cubin", ".ptx", ".hsaco",
                  "_compile_flags.json", "_linker_flags.json", "_metadata.json")
# the pytree specs of the inputs and outputs; a defaultdict's factory is imported by name
_SPEC_KEYS = ("in_spec", "out_spec")
_FACTORIES = frozenset({"list", "dict", "set", "int", "float", "str", "tuple"})
# torch bumps its counter of unbacked symbols (u0, u1, ...; zuf0 for floats) once per index
# up to the largest index in range_constraints: "u999999999999" would loop for hours
_UNBACKED_PREFIXES = ("u", "zuf")
MAX_SYMBOL_INDEX = 1 << 20

Refuse = Callable[[str], FileFormatError]


@dataclass(frozen=True)
class Pt2Layout:
    """What the check found: the members torch will see (relative to the root folder), the
    programs (``models/<name>.json``), and the SHA-256 of each member the check read, so that
    the caller can confirm torch's own zip reader reads the same bytes."""

    root: str
    members: frozenset[str]
    models: tuple[str, ...]
    digests: tuple[tuple[str, bytes], ...]


def check_pt2(file: BinaryIO, label: str) -> Pt2Layout:
    """Check the .pt2 archive in ``file`` (open for binary reading); raise a FileFormatError
    naming ``label`` and the member at fault where torch's loader must not read it."""
    archive = _Archive(_open_zip(file, label), label)
    root, members, models = archive.layout()
    for model in models:
        archive.check_model(model)
    return Pt2Layout(root, members, models, tuple(sorted(archive.digests.items())))


def _open_zip(file: BinaryIO, label: str) -> zipfile.ZipFile:
    # a file that does not start with a member may hide a second archive in front, which
    # zipfile and torch's zip reader would locate differently
    file.seek(0)
    head = file.read(4)
    if head == b"PK\x05\x06":  # the end record, and nothing before it
        raise FileFormatError(f"{label} is an empty zip, not a .pt2 archive")
    if head != b"PK\x03\x04":
        raise FileFormatError(f"{label} is not a .pt2 archive (torch.export.save writes a "
                              f"zip that starts with its first member)")
    try:
        return zipfile.ZipFile(file)
    except ZIP_ERRORS as exc:
        raise FileFormatError(f"{label} is not a readable zip archive: {exc}") from exc


class _Archive:
    """One zip being checked; errors name ``label`` (the file) and the member."""

    def __init__(self, zf: zipfile.ZipFile, label: str):
        self.zf = zf
        self.label = label
        self.root = ""
        self.infos: dict[str, zipfile.ZipInfo] = {}  # relative name -> member
        self.digests: dict[str, bytes] = {}  # relative name -> SHA-256 of what was read

    def refuse(self, name: str) -> Refuse:
        full = f"{self.root}/{name}"
        return lambda why: FileFormatError(f"{self.label}: member {full!r} {why}")

    def layout(self) -> tuple[str, frozenset[str], tuple[str, ...]]:
        """The root folder, every member and the programs, after checking each name."""
        self.root = check_names(self.zf.infolist(), self.label)
        self.infos = {i.filename[len(self.root) + 1:]: i for i in self.zf.infolist()}
        models = [model for name in self.infos if (model := self.model_of(name)) is not None]
        for name, value in (("archive_format", "pt2"), ("archive_version", "0")):
            if self.read_text(name) != value:
                raise self.refuse(name)(f"is not {value!r}: not an archive this torch reads")
        if not models:
            raise FileFormatError(f"{self.label} holds no program (no {self.root}/models/"
                                  f"*.json)")
        return self.root, frozenset(self.infos), tuple(sorted(models))

    def model_of(self, name: str) -> str | None:
        """The model ``models/<m>.json`` names; None for another member of the layout."""
        refuse = self.refuse(name)
        if name.startswith(_CODE_DIRS) or name.lower().endswith(_CODE_SUFFIXES):
            raise refuse("is compiled code or an AOTInductor payload; tdag never loads or "
                         "compiles code from a file")
        if "custom_obj_" in name or "opaque_obj_" in name \
                or (name.endswith((".pt", ".pkl")) and not name.startswith("data/sample_")):
            raise refuse("is a pickled Python object; tdag refuses to unpickle it (it could "
                         "run arbitrary code)")
        for pattern, kind in _LAYOUT:
            if match := pattern.fullmatch(name):
                return match.group(1) if kind == "model" else None
        raise refuse("is not part of a program written by torch.export.save")

    def read(self, name: str) -> bytes:
        info = self.infos.get(name)
        if info is None:
            raise FileFormatError(f"{self.label} has no member {self.root}/{name} (a program "
                                  f"written by torch.export.save has one)")
        if info.file_size > MAX_METADATA_BYTES:
            raise self.refuse(name)(f"is {info.file_size} bytes; tdag reads at most "
                                    f"{MAX_METADATA_BYTES} bytes of metadata")
        try:
            data = self.zf.read(info)
        except ZIP_ERRORS as exc:
            raise self.refuse(name)(f"cannot be read: {exc}") from exc
        self.digests[name] = hashlib.sha256(data).digest()
        return data

    def read_text(self, name: str) -> str:
        try:
            return self.read(name).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.refuse(name)(f"is not UTF-8 text: {exc}") from exc

    def read_json(self, name: str) -> dict:
        value = _json(self.read_text(name), self.refuse(name))
        if not isinstance(value, dict):
            raise self.refuse(name)("is not a JSON object")
        return value

    def check_model(self, model: str) -> None:
        graph = f"models/{model}.json"
        program = self.read_json(graph)
        _check_program(program, self.refuse(graph))
        self.check_payload(f"data/weights/{model}_weights_config.json", "data/weights/",
                           "weight_")
        self.check_payload(f"data/constants/{model}_constants_config.json",
                           "data/constants/", "tensor_")
        sample_inputs = f"data/sample_inputs/{model}.pt"
        data = self.read(sample_inputs)
        if data:  # empty when the program has no sample inputs
            full = f"{self.root}/{sample_inputs}"
            check_torch_save(data, f"{self.label}: member {full!r}")

    def check_payload(self, name: str, folder: str, prefix: str) -> None:
        """A weights or constants config: each entry raw tensor bytes in a member here."""
        refuse = self.refuse(name)
        config = self.read_json(name).get("config")
        if not isinstance(config, dict):
            raise refuse("has no 'config' object")
        for fqn, entry in config.items():
            path = entry.get("path_name") if isinstance(entry, dict) else None
            if not isinstance(path, str) or not re.fullmatch(re.escape(prefix) + r"\d+", path):
                raise refuse(f"lists {fqn!r} at {path!r}, not at a {prefix}<n> member")
            if entry.get("use_pickle") is not False:
                raise refuse(f"stores {fqn!r} pickled; tdag refuses to unpickle it (it could "
                             f"run arbitrary code)")
            if not isinstance(entry.get("tensor_meta"), dict):
                raise refuse(f"gives {fqn!r} no tensor_meta")
            if folder + path not in self.infos:
                raise refuse(f"lists {fqn!r} in {path!r}, which the archive lacks")
        _check_strings(config, refuse)


def _json(text: str, refuse: Refuse):
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise refuse(f"is not valid JSON: {exc}") from exc


def _check_program(program: dict, refuse: Refuse) -> None:
    """A serialized ExportedProgram: the fields torch indexes first, then every string
    that torch evaluates, executes or imports from."""
    module = program.get("graph_module")
    if not isinstance(module, dict):
        raise refuse("has no 'graph_module' object: not a serialized torch.export program")
    for key, kind in (("graph", dict), ("signature", dict), ("module_call_graph", list)):
        if not isinstance(module.get(key), kind):
            raise refuse(f"has no graph_module.{key} {kind.__name__}")
    if not isinstance(program.get("guards_code", []), list):
        raise refuse("has a guards_code that is not a list")
    _check_ranges(program.get("range_constraints", {}), refuse)
    _check_strings(program, refuse)


def _check_ranges(ranges, refuse: Refuse) -> None:
    if not isinstance(ranges, dict):
        raise refuse("has range_constraints that are not an object")
    for key in ranges:
        prefix = next((p for p in _UNBACKED_PREFIXES if key.startswith(p)), None)
        try:  # torch reads the index with int(), which also takes " 7" and "1_000"
            index = int(key[len(prefix):]) if prefix else None
        except ValueError:
            index = None  # torch fails on it before counting
        if index is not None and index > MAX_SYMBOL_INDEX:
            raise refuse(f"has a range for the symbol {key[:40]!r}: torch would count up to "
                         f"its index, at most {MAX_SYMBOL_INDEX} is accepted")


def _check_strings(tree, refuse: Refuse) -> None:
    """Symbolic sizes (sympify evaluates them), guards (``module()`` execs them) and pytree
    specs (they may name a module to import), wherever they sit in the JSON ``tree``."""
    for key, value in _items(tree):
        if key == "expr_str":
            checks = [(value, check_size(value))]
        elif key == "guards_code":
            checks = [(guard, check_guard(guard)) for guard in value] \
                if isinstance(value, list) else [(value, "is not a list")]
        elif key in _SPEC_KEYS:
            checks = [(value, _check_spec(value, refuse))]
        else:
            continue
        for text, why in checks:
            if why is not None:
                raise refuse(f"holds the {key} {str(text)[:80]!r}, which {why}")


def _check_spec(text, refuse: Refuse) -> str | None:
    """A pytree spec (JSON in a string): no enum (torch imports its module by name to rebuild
    it) and no defaultdict whose factory is not a builtin type (imported the same way)."""
    if text is None:
        return None
    if not isinstance(text, str):
        return "is not a string"
    for key, value, node in _items_with_parent(_json(text, refuse)):
        if key == "context" and isinstance(value, str):
            context = _json_or_none(value)
            if any(k == "__enum__" for k, _ in _items(context)):
                return "rebuilds an enum, which imports the enum's module"
        if key == "type" and value == "collections.defaultdict":
            context = node.get("context")
            context = _json_or_none(context) if isinstance(context, str) else context
            if not isinstance(context, dict) \
                    or context.get("default_factory_module") != "builtins" \
                    or context.get("default_factory_name") not in _FACTORIES:
                return "rebuilds a defaultdict whose factory is not a builtin type"
    return None


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None  # torch fails on it too, before importing anything


def _items(tree) -> Iterator[tuple[str, object]]:
    """Every (key, value) pair of the JSON objects in ``tree``."""
    for key, value, _ in _items_with_parent(tree):
        yield key, value


def _items_with_parent(tree) -> Iterator[tuple[str, object, dict]]:
    """Every (key, value, object holding them) in ``tree``; iterative, so a deeply nested
    file cannot exhaust the interpreter's stack."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                yield key, value, node
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
