"""Checks shared by a .pt2 archive and the ``torch.save`` file inside it: member names and
entries, and a pickle that may import only what rebuilds tensors.

torch's zip reader (miniz) looks members up by name inside the archive, so a name is never a
path on disk; still, a name with ``..``, a drive or a backslash, a duplicate (two members, one
name: which one does each reader pick?) or a compressed entry (a zip bomb; torch stores
members as they are) has no place in a file torch wrote, and is refused.

A pickle is checked with ``pickletools.genops``, which decodes opcodes and runs none. Code can
only be reached through an import (GLOBAL, STACK_GLOBAL; INST and OBJ import too), so each
import must be a tensor rebuilder, a storage class, a dtype or OrderedDict: what
``torch.save`` writes for tensors in tuples, lists and dicts.
"""
from __future__ import annotations

import io
import pickletools
import re
import struct
import zipfile

from tdag.errors import FileFormatError

MAX_MEMBERS = 200_000

# members of a torch.save file, relative to its root folder
_TORCH_SAVE_LAYOUT = re.compile(r"data\.pkl|byteorder|version|\.format_version"
                                r"|\.storage_alignment|\.data/version|\.data/serialization_id"
                                r"|data/\d+")
_STORAGES = ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte",
             "Bool", "ComplexFloat", "ComplexDouble")
_PICKLE_GLOBALS = frozenset({
    ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor_v3"),
    ("torch.storage", "UntypedStorage"), ("collections", "OrderedDict"),
    *(("torch", f"{name}Storage") for name in _STORAGES),
})
_DTYPE_NAME = re.compile(r"(u?int|float|bfloat|complex|bits)\d+(_[a-z0-9]+)?|bool")
_IMPORTING = frozenset({"INST", "OBJ", "EXT1", "EXT2", "EXT4", "PERSID"})
_STRINGS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"})
_MEMO = frozenset({"MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"})
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError,
               NotImplementedError, struct.error)


def check_names(infos: list[zipfile.ZipInfo], label: str) -> str:
    """The one root folder every member sits in (torch's reader requires one), after
    checking each member's name and entry."""
    if not infos:
        raise FileFormatError(f"{label} is an empty zip, not a .pt2 archive")
    if len(infos) > MAX_MEMBERS:
        raise FileFormatError(f"{label} has {len(infos)} members (at most {MAX_MEMBERS})")
    root = infos[0].filename.split("/", 1)[0]
    seen: set[str] = set()
    for info in infos:
        name = info.filename
        why = _bad_name(name, root) or _bad_entry(info)
        if why is None and name.lower() in seen:
            why = "appears twice (compared ignoring case, as a zip reader may compare)"
        if why is not None:
            raise FileFormatError(f"{label}: member {name!r} {why}")
        seen.add(name.lower())
    return root


def _bad_name(name: str, root: str) -> str | None:
    if "\\" in name or name.startswith("/") or ":" in name:
        return "has an absolute or Windows path; members are named relative to the archive"
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' path segment; a member never names a place " \
               "outside the archive"
    if any(ord(c) < 32 or c == "\x7f" for c in name):
        return "has a control character in its name"
    if len(parts) < 2 or parts[0] != root:
        return f"is not in the archive's root folder {root!r} (torch puts every member there)"
    return None


def _bad_entry(info: zipfile.ZipInfo) -> str | None:
    if info.flag_bits & 0x1:
        return "is encrypted"
    if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
        return "is compressed; torch stores every member as it is"
    return None


def check_torch_save(data: bytes, label: str) -> None:
    """``data`` is a torch.save file (a zip of data.pkl and raw storages) whose pickle
    rebuilds only tensors, containers and numbers; ``label`` names it in errors."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except ZIP_ERRORS as exc:
        raise FileFormatError(f"{label} is not a torch.save file: {exc}") from exc
    root = check_names(infos, label)
    for info in infos:
        if not _TORCH_SAVE_LAYOUT.fullmatch(info.filename[len(root) + 1:]):
            raise FileFormatError(f"{label} holds {info.filename!r}, which a torch.save file "
                                  f"of tensors does not")
    try:
        pickled = zf.read(f"{root}/data.pkl")
    except KeyError as exc:
        raise FileFormatError(f"{label} has no data.pkl: not a torch.save file") from exc
    except ZIP_ERRORS as exc:
        raise FileFormatError(f"{label} cannot be read: {exc}") from exc
    why = pickle_imports_beyond_tensors(pickled)
    if why is not None:
        raise FileFormatError(f"{label} {why}; tdag refuses to unpickle it (it could run "
                              f"arbitrary code)")


def pickle_imports_beyond_tensors(data: bytes) -> str | None:
    """Why the pickle ``data`` may build something besides tensors and containers, or None.

    >>> import pickle
    >>> pickle_imports_beyond_tensors(pickle.dumps({"x": [1, 2.5]})) is None
    True
    >>> pickle_imports_beyond_tensors(pickle.dumps(print))
    'imports builtins.print, which is not a tensor rebuilder, a storage or a dtype'
    """
    strings: list[str] = []  # the strings pushed just before: STACK_GLOBAL's operands
    try:
        for opcode, arg, _ in pickletools.genops(data):
            name = opcode.name
            why = None
            if name in _IMPORTING:
                why = f"uses the pickle opcode {name}, which imports by name"
            elif name == "GLOBAL":
                why = _refused_import(*arg.split(" ", 1))
            elif name == "STACK_GLOBAL":
                why = _refused_import(*strings[-2:]) if len(strings) >= 2 \
                    else "imports a name it computes"
            if why is not None:
                return why
            if name in _STRINGS:
                strings.append(arg)
            elif name not in _MEMO:
                strings.clear()
    except (ValueError, TypeError, IndexError, struct.error) as exc:
        return f"is not a valid pickle ({exc})"
    return None


def _refused_import(module: str, attr: str) -> str | None:
    if (module, attr) in _PICKLE_GLOBALS or module == "torch" and _DTYPE_NAME.fullmatch(attr):
        return None
    return f"imports {module}.{attr}, which is not a tensor rebuilder, a storage or a dtype"
