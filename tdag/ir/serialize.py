"""The ``.tdag`` file: one safetensors file holding the text form and every weight.

safetensors stores raw tensors and a string-to-string metadata header; it never unpickles, so
opening a file from anywhere runs no code. The metadata holds:

- ``format``: ``"tdag"`` (the magic) and ``tdag.version``: the format version;
- ``tdag.text``: the program's text form (``tdag.ir.printer``);
- ``tdag.weights``: JSON ``{"graphs": {graph: {weight: key}}, "state": {name: key}}`` mapping
  each valued weight to its tensor key (a tensor shared by name is stored once);
- ``tdag.sha256``: a checksum over the other metadata and every tensor's bytes, so that a
  flipped byte anywhere is caught on load.

>>> import os, tempfile, torch, tdag
>>> from tdag import ops
>>> prog = tdag.trace(lambda x: x * ops.param("w", torch.ones(3)), tdag.TensorSpec((3,)))
>>> path = os.path.join(tempfile.mkdtemp(), "m.tdag")
>>> save(prog, path)
>>> load(path) == prog
True
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import time

import safetensors
import safetensors.torch
import torch

from tdag.errors import FileFormatError, TdagError
from tdag.ir.graph import Weight
from tdag.ir.names import FreshNames
from tdag.ir.parser import parse
from tdag.ir.printer import format_program
from tdag.ir.program import Program
from tdag.ir.symbols import shape_is_static
from tdag.ir.types import DType
from tdag.ir.verify import verify

try:
    import fcntl
except ImportError:  # Windows: no flock, so stale temporary folders are left alone there
    fcntl = None

MAGIC = "tdag"
VERSION = "1"
_FORMAT, _VERSION, _TEXT, _WEIGHTS, _SHA = ("format", "tdag.version", "tdag.text",
                                            "tdag.weights", "tdag.sha256")


# -- saving -----------------------------------------------------------------------------------

class _TensorTable:
    """Assigns tensor keys: a name whose value was already stored reuses that key."""

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}
        self._storages: set[int] = set()

    def add(self, scope: str, name: str, weight: Weight) -> str | None:
        value = weight.value
        if value is None or value.device.type == "meta":
            return None  # shape-only: the text form already holds the type
        value = value.detach()
        if value.is_complex():  # safetensors has no complex128: every complex as its pairs
            value = torch.view_as_real(value.resolve_conj())
        if name in self.tensors and _same_tensor(self.tensors[name], value):
            return name
        # the name, else scope/name, else _scope/name, __scope/name ...
        keys = FreshNames(variant=lambda base, k: "_" * (k - 1) + f"{scope}/{base}")
        key = keys.fresh(name, avoid=self.tensors, take=False)
        self.tensors[key] = self._own(value)
        return key

    def _own(self, value: torch.Tensor) -> torch.Tensor:
        # safetensors refuses tensors that share memory; copy a view of one already stored
        value = value.cpu().contiguous()
        if value.numel() == 0:
            return value
        ptr = value.untyped_storage().data_ptr()
        if ptr in self._storages:
            value = value.clone()
            ptr = value.untyped_storage().data_ptr()
        self._storages.add(ptr)
        return value


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a is b or torch.equal(a.cpu(), b.cpu())


def _weight_map(prog: Program, table: _TensorTable) -> dict:
    graphs = {}
    for gname, graph in prog.graphs.items():
        keys = {name: table.add(gname, name, w) for name, w in graph.weights.items()}
        graphs[gname] = {k: v for k, v in keys.items() if v is not None}
    state = {name: table.add("state", name, w) for name, w in prog.state.items()}
    return {"graphs": graphs, "state": {k: v for k, v in state.items() if v is not None}}


def _checksum(metadata: dict, tensors: dict) -> str:
    """sha256 over the metadata (but the checksum) and every tensor's key, type and bytes."""
    h = hashlib.sha256()

    def feed(data) -> None:
        view = memoryview(data)
        h.update(view.nbytes.to_bytes(8, "little"))  # length-prefixed: no two payloads collide
        h.update(view)

    for key in sorted(k for k in metadata if k != _SHA):
        feed(key.encode())
        feed(metadata[key].encode())
    for key in sorted(tensors):
        t = tensors[key].detach().cpu().contiguous().reshape(-1)
        feed(key.encode())
        feed(f"{t.dtype}{list(tensors[key].shape)}".encode())
        feed(t.view(torch.uint8).numpy() if t.numel() else b"")  # no copy of the data
    return h.hexdigest()


def save(prog: Program, path: str | os.PathLike) -> None:
    """Write ``prog`` and its weights to ``path`` atomically (all or nothing).

    The file is written inside a private folder ``.{name}.{hex}.tmp`` next to ``path`` and
    renamed over ``path``, so a crash mid-save leaves the old file as it was. A folder, not a
    temporary file, because safetensors itself writes to a temporary file beside its target:
    whatever a killed save leaves lies in that one folder, which the next save to ``path``
    removes (see ``_remove_stale``).
    """
    started = time.time()
    if not isinstance(prog, Program):
        raise TypeError(f"save() takes a tdag.Program, got {type(prog).__name__}")
    table = _TensorTable()
    metadata = {_FORMAT: MAGIC, _VERSION: VERSION, _TEXT: format_program(prog),
                _WEIGHTS: json.dumps(_weight_map(prog, table), sort_keys=True)}
    metadata[_SHA] = _checksum(metadata, table.tensors)
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    _remove_stale(directory, name, started)
    with _scratch_folder(directory, name) as scratch:
        written = os.path.join(scratch, name)
        mode = _new_file_mode(written)
        safetensors.torch.save_file(table.tensors, written, metadata=metadata)
        os.chmod(written, mode)
        _fsync(written)
        os.replace(written, path)


@contextlib.contextmanager
def _scratch_folder(directory: str, name: str):
    """A new folder for one save, locked until it is removed again.

    The lock (flock) marks the save as alive: the kernel drops it when the process ends,
    however it ends (kill -9 included), and it holds across processes, containers sharing a
    volume and NFS clients. A writer's pid in the name would not: pids are reused and mean
    nothing in another pid namespace or on another host.
    """
    scratch = os.path.join(directory, f".{name}.{secrets.token_hex(8)}.tmp")
    try:
        os.mkdir(scratch)  # fails rather than share a folder with another save
    except FileNotFoundError as exc:  # name the folder the caller gave, not the scratch one
        raise FileNotFoundError(exc.errno, exc.strerror, directory) from None
    fd = None
    try:
        if fcntl is not None:
            fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
            with contextlib.suppress(OSError):  # a filesystem without locks: unprotected
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if fd is not None:
            os.close(fd)


def _new_file_mode(path: str) -> int:
    """Create ``path`` as open() would (0o666 less the umask) and return its mode, to give
    the saved file: safetensors creates its file 0o600 whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        return stat.S_IMODE(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def _remove_stale(directory: str, name: str, started: float) -> None:
    """Remove what interrupted saves to ``name`` left in ``directory`` (each up to the size
    of the model): ``.{name}.{hex}.tmp`` folders (plain files from earlier tdag versions)
    older than this save that no live save holds locked."""
    if fcntl is None:
        return
    pattern = re.compile(rf"\.{re.escape(name)}\.[0-9a-f]{{16}}\.tmp")
    try:
        with os.scandir(directory) as entries:
            candidates = [e.path for e in entries if pattern.fullmatch(e.name)]
    except OSError:
        return  # an unlistable folder: the save itself will say what is wrong
    for candidate in candidates:
        _remove_if_stale(candidate, started)


def _remove_if_stale(path: str, started: float) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return  # gone meanwhile (its save finished), or a link: not ours to follow
    try:
        info = os.fstat(fd)
        # younger than this save: its writer may not have taken the lock yet
        if info.st_mtime >= started:
            return
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # OSError while its writer lives
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(path)
        elif stat.S_ISREG(info.st_mode):
            os.unlink(path)
    except OSError:
        pass  # locked, or not ours to remove: leave it
    finally:
        os.close(fd)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- loading ----------------------------------------------------------------------------------

def _read(path: str) -> tuple[dict, dict]:
    """Metadata and tensors of a safetensors file; any failure is a FileFormatError."""
    if not os.path.isfile(path):
        raise FileFormatError(f"{path}: no such file")
    try:
        with safetensors.safe_open(path, framework="pt") as f:
            metadata = dict(f.metadata() or {})
            if metadata.get(_FORMAT) != MAGIC:
                raise FileFormatError(f"{path}: not a tdag file (no tdag format marker)")
            _check_version(path, metadata)
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except FileFormatError:
        raise
    except Exception as exc:  # safetensors raises its own error type, OSError, ValueError...
        raise FileFormatError(f"{path}: not a tdag file, or damaged or truncated "
                              f"({type(exc).__name__}: {exc})") from None
    return metadata, tensors


def _check_version(path: str, metadata: dict) -> None:
    version = metadata.get(_VERSION)
    if version != VERSION:
        raise FileFormatError(f"{path}: tdag file format version {version!r} is not supported "
                              f"(this tdag reads version {VERSION}); upgrade tdag")


def _attach(path: str, value: torch.Tensor, weight: Weight, where: str) -> Weight:
    declared = weight.type
    if declared.dtype.is_complex and value.dtype == declared.dtype.real.torch and \
            value.ndim and value.shape[-1] == 2:  # saved as its (real, imaginary) pairs
        value = torch.view_as_complex(value.contiguous())
    try:
        dtype = DType.of(value.dtype)
    except TdagError:
        raise FileFormatError(f"{path}: weight %{where} has unsupported dtype "
                              f"{value.dtype}") from None
    if dtype is not declared.dtype or (
            shape_is_static(declared.shape) and tuple(value.shape) != declared.shape):
        raise FileFormatError(f"{path}: weight %{where} is declared {declared} but the file "
                              f"holds {dtype.value}{list(value.shape)}")
    return Weight(weight.kind, weight.type, value)


def _attach_all(path: str, prog: Program, mapping: dict, tensors: dict) -> Program:
    def fill(weights: dict, keys: dict, scope: str) -> dict:
        result = dict(weights)
        for name, key in keys.items():
            if name not in weights or key not in tensors:
                raise FileFormatError(f"{path}: weight table names %{name} ({key!r}) "
                                      f"which the file does not hold")
            result[name] = _attach(path, tensors[key], weights[name], f"{scope}/{name}")
        return result

    graphs = {}
    for gname, graph in prog.graphs.items():
        keys = mapping.get("graphs", {}).get(gname, {})
        graphs[gname] = graph.replace(weights=fill(graph.weights, keys, gname))
    state = fill(prog.state, mapping.get("state", {}), "state")
    return prog.replace(graphs=graphs, state=state)


def load(path: str | os.PathLike) -> Program:
    """Read a Program saved with ``save``; a damaged file raises FileFormatError, and so does
    one whose program ``verify`` rejects (a checksum catches damage, not a forged file)."""
    path = os.fspath(path)
    metadata, tensors = _read(path)
    for key in (_TEXT, _WEIGHTS, _SHA):
        if key not in metadata:
            raise FileFormatError(f"{path}: damaged tdag file: no {key!r} entry")
    if _checksum(metadata, tensors) != metadata[_SHA]:
        raise FileFormatError(f"{path}: checksum mismatch: the file is damaged")
    try:
        mapping = json.loads(metadata[_WEIGHTS])
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than json parses
        raise FileFormatError(f"{path}: damaged weight table") from None
    if not isinstance(mapping, dict):
        raise FileFormatError(f"{path}: damaged weight table")
    try:
        prog = parse(metadata[_TEXT])
    except FileFormatError as exc:
        raise FileFormatError(f"{path}: {exc.args[0]}") from None
    except TdagError as exc:  # parse verifies what it read
        raise FileFormatError(f"{path}: the program in the file is malformed: {exc}") from None
    try:
        prog = _attach_all(path, prog, mapping, tensors)
    except (AttributeError, TypeError):  # a weight table of the wrong shape
        raise FileFormatError(f"{path}: damaged weight table") from None
    try:
        verify(prog)
    except TdagError as exc:
        raise FileFormatError(f"{path}: the program in the file is malformed: {exc}") from None
    return prog
