"""Capturing a torch model as an ExportedProgram: from a module, an ExportedProgram or a .pt2.

Capture is torch.export in non-strict mode (it runs the Python forward with fake tensors, so
it copes with more models than the strict bytecode tracer). The result is torch's training
IR: ATen ops such as ``aten.linear`` and ``aten.layer_norm`` that the tdag table maps
directly. Only ops the table lacks are decomposed (see ``decompose_unknown``): a full
``run_decompositions()`` costs about three exports, and the direct mappings read better.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import logging
import os
from typing import Callable
from unittest import mock

import torch
from torch._decomp import decomposition_table
from torch.export import Dim, ExportedProgram

from tdag.canonicalize.torch.experts import experts_traceable
from tdag.canonicalize.torch.pt2.archive import Pt2Layout, check_pt2
from tdag.canonicalize.torch.pt2.pytrees import neutral_spec
from tdag.canonicalize.torch.recurrent import has_recurrence, recurrent_as_ops
from tdag.canonicalize.torch.symbols import BATCH
from tdag.errors import FileFormatError


def capture(source, example_args=(), example_kwargs=None, dynamic_batch: bool = False,
            dynamic_shapes=None) -> ExportedProgram:
    """An ExportedProgram for a module, an ExportedProgram, or the path of a .pt2 file."""
    if isinstance(source, (str, os.PathLike)):
        source = load_pt2(source)
    if isinstance(source, ExportedProgram):
        if not (dynamic_batch or dynamic_shapes):
            return source
        # re-export to change which dims are dynamic; the saved example inputs stand in
        saved = source.example_inputs or ((), {})
        example_args = example_args or saved[0]
        example_kwargs = example_kwargs if example_kwargs is not None else saved[1]
        source = source.module(check_guards=False)
    if not isinstance(source, torch.nn.Module):
        raise TypeError(f"from_torch takes an nn.Module, an ExportedProgram or a .pt2 path, "
                        f"not {type(source).__name__}")
    args = tuple(example_args) if isinstance(example_args, (tuple, list)) else (example_args,)
    kwargs = dict(example_kwargs or {})
    # recurrent modules as one node each, so their sequence length may stay symbolic
    with recurrent_as_ops(source) if has_recurrence(source) else contextlib.nullcontext(), \
            experts_traceable(source):
        if dynamic_batch and dynamic_shapes is None:
            return _export_dynamic_batch(source, args, kwargs)
        return torch.export.export(source, args, kwargs, dynamic_shapes=dynamic_shapes,
                                   strict=False)


def _export_dynamic_batch(module, args, kwargs) -> ExportedProgram:
    """Dim 0 of every user tensor input is the symbol ``batch``.

    torch.export specialises sizes 0 and 1, so an example batch of 1 is doubled for capture
    (the graph does not depend on the example's batch size); ``min=1`` is tried first so that
    the program accepts a batch of one, then ``min=2`` for models that branch on batch == 1.
    """
    args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, _batch_of_two, (args, kwargs))
    error = None
    for low in (1, 2):
        batch = Dim(BATCH, min=low)
        shapes = _batch_shapes(module, args, kwargs, batch)
        try:
            return torch.export.export(module, args, kwargs, dynamic_shapes=shapes, strict=False)
        except torch._dynamo.exc.UserError as exc:  # a constraint violation: retry with min=2
            error = exc
    raise error


def _batch_of_two(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x]) if x.dim() and x.shape[0] == 1 else x


def _batch_shapes(module, args, kwargs, batch: Dim):
    """dynamic_shapes naming dim 0 of every tensor; keyed by forward's argument names (a
    ``*args`` parameter is one entry, the tuple of its values, as torch.export reads it)."""
    spec = lambda x: {0: batch} if isinstance(x, torch.Tensor) and x.dim() else None  # noqa: E731
    shapes = lambda tree: torch.utils._pytree.tree_map(spec, tree)  # noqa: E731
    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    return {name: shapes(value) for name, value in bound.arguments.items()}


# -- decomposition ------------------------------------------------------------------------------


def decompose_unknown(ep: ExportedProgram,
                      known: Callable[[ExportedProgram], Callable[[torch.fx.Node], bool]],
                      rounds: int = 4) -> ExportedProgram:
    """Decompose the ops of the nodes ``known(ep)`` rejects, with torch's decompositions.

    A decomposition may itself produce ops the table lacks, hence a few rounds. A
    decomposition torch cannot apply (some of torch._decomp's emit prims, some CIA kernels
    call their own op) is skipped; ops left undecomposed are reported by the converter.
    """
    failed: set = set()
    for _ in range(rounds):
        todo = {op: d for op in _unknown_ops(ep, known) if op not in failed
                and (d := _decomposition(op)) is not None}
        if not todo and not _wrapped_regions(ep):
            break
        try:
            ep = ep.run_decompositions(todo)
        except Exception:  # noqa: BLE001  (torch raises many types here): retry one by one
            before = len(failed)
            for op, decomposition in todo.items():
                try:
                    ep = ep.run_decompositions({op: decomposition})
                except Exception:  # noqa: BLE001
                    failed.add(op)
            if len(failed) - before == len(todo):
                break
    return ep


def _decomposition(op):
    """export's default (core ATen) decomposition, else torch._decomp's (which also reduces
    core ops such as ``native_layer_norm``), else the op's CompositeImplicitAutograd kernel."""
    defaults = _default_decompositions()
    # CustomDecompTable.get skips its lazily added CIA entries; indexing does not
    if op in defaults:
        return defaults[op]
    if op in decomposition_table:
        return decomposition_table[op]
    if op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
        return op.decompose
    return None


@functools.lru_cache(maxsize=1)
def _default_decompositions():  # built once: it takes ~0.2 s, and it is only read
    return torch.export.default_decompositions()


# Regions under ``torch.no_grad()`` / ``torch.autocast`` in forward: any run_decompositions
# inlines them, applying autocast's casts as explicit ``_to_copy`` nodes.
_WRAPPERS = frozenset({"wrap_with_set_grad_enabled", "wrap_with_autocast"})


def _wrapped_regions(ep: ExportedProgram) -> bool:
    return any(n.op == "call_function" and getattr(n.target, "__name__", None) in _WRAPPERS
               for n in ep.graph.nodes)


def _unknown_ops(ep: ExportedProgram, known) -> set:
    known = known(ep)
    return {n.target for n in ep.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and not known(n)}


# -- loading .pt2 files --------------------------------------------------------------------------


def load_pt2(path) -> ExportedProgram:
    """Load a file written by torch.export.save without running anything from it.

    torch's loader runs code from a hostile archive (sympify on the symbolic sizes, imports
    named by pytree specs, AOTInductor libraries and compilers, pickles), so tdag's own reader
    (``pt2_archive.check_pt2``: zipfile and json, no torch) checks the whole archive first,
    and only an archive that passes reaches torch, read from the same open file. While torch
    reads it, pickles are still refused or restricted to tensors (``_no_arbitrary_unpickling``),
    a pytree node of a type this process has not registered (a transformers ``ModelOutput``,
    a user's dataclass) is read as a plain dict or tuple (``_foreign_pytrees_as_data``), and
    torch's loggers are quiet; whatever torch raises becomes a FileFormatError naming the
    file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileFormatError(f"{path!r} is not a file")
    try:
        with open(path, "rb") as file:
            layout = check_pt2(file, repr(path))
            return _torch_load(file, path, layout)
    except OSError as exc:
        raise FileFormatError(f"cannot read {path!r}: {exc}") from exc


def _torch_load(file, path: str, layout: Pt2Layout) -> ExportedProgram:
    """torch's reader on an archive tdag checked. It calls torch.export.load's worker
    directly: torch.export.load answers a RuntimeError by retrying the archive as the
    pre-2.7 layout, which unpickles freely, and it logs the real error instead of raising it."""
    from torch.export.pt2_archive import _package  # noqa: PLC0415  (private: only when loading)
    try:
        with _quiet_torch_loggers(), _no_arbitrary_unpickling(), _foreign_pytrees_as_data():
            _same_view(file, layout)
            file.seek(0)
            contents = _package.load_pt2(file)
    except (MemoryError, torch.OutOfMemoryError):
        raise  # a failure of the process, not of the file (as in from_torch)
    except Exception as exc:  # noqa: BLE001  (torch raises many types on a damaged archive)
        why = exc.message if isinstance(exc, FileFormatError) else \
            f"{type(exc).__name__}: {exc}"
        raise FileFormatError(f"cannot load {path!r} as a torch.export program: {why}") from exc
    if "model" not in contents.exported_programs:  # the name torch.export.save writes
        raise FileFormatError(f"{path!r} holds no program named 'model' "
                              f"(only {sorted(contents.exported_programs)})")
    return contents.exported_programs["model"]


def _same_view(file, layout: Pt2Layout) -> None:
    """torch's zip reader (miniz) sees the members tdag's (zipfile) checked, no more, and
    reads the same bytes from each member tdag read: two zip parsers could otherwise be
    made to disagree on one file."""
    file.seek(0)
    reader = torch._C.PyTorchFileReader(file)
    records = set(reader.get_all_records())
    if records != layout.members:
        raise FileFormatError(f"torch's zip reader sees other members than tdag's "
                              f"{sorted(records ^ layout.members)[:4]}")
    for name, digest in layout.digests:
        if hashlib.sha256(reader.get_record(name)).digest() != digest:
            raise FileFormatError(f"torch's zip reader reads other bytes for {name!r} than "
                                  f"tdag checked")


@contextlib.contextmanager
def _quiet_torch_loggers():
    """torch logs (with tracebacks) what it then raises; tdag raises one FileFormatError
    instead. A logger with no level of its own takes the "torch" logger's."""
    loggers = [logger for name, logger in list(logging.root.manager.loggerDict.items())
               if isinstance(logger, logging.Logger)
               and (name == "torch" or name.startswith("torch."))]
    saved = [(logger, logger.disabled) for logger in loggers]
    top = logging.getLogger("torch")
    level = top.level
    top.setLevel(logging.CRITICAL + 1)
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        top.setLevel(level)
        for logger, disabled in saved:
            logger.disabled = disabled


class _RefusePickle:
    """Stands in for the ``pickle`` module inside torch's .pt2 reader."""

    @staticmethod
    def loads(*args, **kwargs):
        raise FileFormatError("the .pt2 file holds a pickled Python object; tdag refuses to "
                              "unpickle it (it could run arbitrary code)")


@contextlib.contextmanager
def _no_arbitrary_unpickling():
    from torch.export.pt2_archive import _package  # noqa: PLC0415  (private: only when loading)
    real_load = torch.load

    def weights_only_load(*args, **kwargs):
        kwargs["weights_only"] = True
        return real_load(*args, **kwargs)

    with mock.patch.object(torch, "load", weights_only_load), \
            mock.patch.object(_package, "pickle", _RefusePickle), \
            mock.patch.object(torch._C, "_pickle_load_obj", _RefusePickle.loads):
        yield


@contextlib.contextmanager
def _foreign_pytrees_as_data():
    """torch's deserializer reads each input and output spec through this (``pt2.pytrees``):
    a node type the pytree registry lacks becomes a dict of its fields or a tuple, where
    torch would raise "not registered" and tdag would have to import the type's module.
    Only the deserializer's own name is patched, and only while loading; torch's cached
    ``treespec_loads`` keeps answering the original spec as torch would."""
    from torch._export.serde import serialize  # noqa: PLC0415  (private: only when loading)
    real = serialize.treespec_loads
    known = torch.utils._pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE

    def treespec_loads(text: str):
        return real(neutral_spec(text, known))

    with mock.patch.object(serialize, "treespec_loads", treespec_loads):
        yield
