"""``from_torch``: an ExportedProgram's ATen graph, walked node by node into a tdag Program.

Placeholders become inputs (user inputs, flattened as torch.export flattens the calling
convention) and weights (parameters, buffers and constants under their state-dict names);
each ATen node is emitted through the op table inside ``Builder.scope(origin)``; outputs are
the flattened user outputs. Unsupported ops are collected over the whole graph and reported
in one UnsupportedOpError. A graph with ``torch.cond`` or ``while_loop`` is split into
several TDAGs joined by If and Loop controllers (``torch_control``); one without stays a
single TDAG.

``from_torch`` is the API boundary: whatever torch.export or the converter raises reaches the
caller as a tdag error (``FileFormatError``, ``CaptureError``, ``ConversionError``) whose
message is one line, with the original exception kept as ``__cause__``.
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable

import torch
from torch.export import ExportedProgram

from tdag.canonicalize.torch.capture import capture, decompose_unknown
from tdag.canonicalize.torch.control import convert_control, has_control_flow
from tdag.canonicalize.torch.converter import Converter, handled
from tdag.canonicalize.torch.inplace import buffer_placeholders, inplace_safe
from tdag.canonicalize.torch.names import dim_names, name_outputs
from tdag.errors import (
                         CaptureError,
                         ConversionError,
                         FileFormatError,
                         InvalidModelError,
                         TdagError,
)
from tdag.ir.graph import TDAG
from tdag.ir.names import FreshNames
from tdag.ir.program import Block, Call, Program
from tdag.refine.dataflow import prune


def from_torch(source, example_args=(), example_kwargs=None, dynamic_batch: bool = False,
               dynamic_shapes=None) -> Program:
    """Canonicalize a torch model into a tdag Program.

    ``source`` is an ``nn.Module`` (exported with ``example_args``/``example_kwargs``), an
    ``ExportedProgram``, or the path of a ``.pt2`` file written by ``torch.export.save``.
    ``dynamic_batch=True`` makes dim 0 of every input the symbol ``batch``;
    ``dynamic_shapes`` takes torch.export's own spec instead. Weights on the meta device give
    a shape-only program (weights with no value).

    Failures are tdag errors, the original exception kept as ``__cause__``: a ``.pt2`` that
    does not load is a ``FileFormatError``, a model torch.export cannot capture a
    ``CaptureError``, ops with no mapping an ``UnsupportedOpError``.

    >>> import torch, tdag
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    >>> prog = from_torch(model, (torch.randn(2, 4),), dynamic_batch=True)
    >>> [str(t) for t in prog.input_types], [str(t) for t in prog.graph.output_types]
    (['f32[batch,4]'], ['f32[batch,3]'])
    >>> prog.graph.weights["0.weight"].kind
    <TensorKind.parameter: 'param'>
    """
    if not isinstance(source, (torch.nn.Module, ExportedProgram, str, os.PathLike)):
        raise InvalidModelError(f"from_torch takes an nn.Module, an ExportedProgram or a .pt2 "
                                f"path, not {type(source).__name__}")
    if isinstance(source, (str, os.PathLike)):
        where = f"cannot load {os.fspath(source)!r} as a torch.export program"
        with _reraised(lambda exc: FileFormatError(f"{where}: {_summary(exc, True)}")):
            source = capture(source)
    ep, names = exported(source, example_args, example_kwargs, dynamic_batch, dynamic_shapes)
    with converting():
        return convert(ep, names)


def exported(source, example_args=(), example_kwargs=None, dynamic_batch: bool = False,
             dynamic_shapes=None) -> tuple[ExportedProgram, dict]:
    """The ExportedProgram ``from_torch`` converts (ops the table lacks decomposed) and the
    names of its dynamic dims (see ``convert``); torch's failures as tdag errors."""
    with _reraised(_capture_error):
        ep = capture(source, example_args, example_kwargs, dynamic_batch, dynamic_shapes)
        ep = functional_writes(decompose_unknown(ep, convertible))
    with converting():
        return ep, dim_names(ep, source, example_args, example_kwargs, dynamic_batch,
                             dynamic_shapes)


def converting():
    """A context in which a failure to convert an ExportedProgram is a ConversionError."""
    return _reraised(_conversion_error)


def _capture_error(exc: Exception) -> CaptureError:
    return CaptureError(f"torch.export could not capture the model: {_summary(exc)}")


def _conversion_error(exc: Exception) -> ConversionError:
    return ConversionError(f"tdag could not convert the exported program: "
                           f"{_summary(exc, True)}")


# Failures of the process rather than of the model: never relabelled. (KeyboardInterrupt and
# SystemExit are not Exceptions, so ``except Exception`` already lets them through.)
_PASS_THROUGH = (TdagError, MemoryError, torch.OutOfMemoryError)


@contextlib.contextmanager
def _reraised(make_error: Callable[[Exception], TdagError]):
    """Raise ``make_error(exc)`` from any non-tdag ``exc``. torch raises dozens of types here
    (UserError, GuardOnDataDependentSymNode, TypeError from forward, ...) whose messages run
    to pages; the caller gets one tdag type and one line, and the full story in __cause__."""
    try:
        yield
    except _PASS_THROUGH:
        raise
    except Exception as exc:
        raise make_error(exc) from exc


def _summary(exc: Exception, with_type: bool = False) -> str:
    """The first line of ``exc``'s message; with its type where the type says what went wrong
    (a bare KeyError reads ``'w'``)."""
    lines = str(exc).strip().splitlines()
    first = lines[0].strip() if lines else ""
    if with_type or not first:
        return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return first


def convert(ep: ExportedProgram, names: dict | None = None) -> Program:
    """The Program of an ExportedProgram whose ops the table knows; ``names`` maps
    (user input number, axis) to the name of that dynamic dimension."""
    if has_control_flow(ep):
        return convert_control(ep, names or {})
    converter = Converter(ep, names or {}, buffer_placeholders(ep))
    with converter.builder.active():
        converter.run()
    return program_of(converter.graph, converter.state, converter.state_outputs,
                      converter.output_fields)


def program_of(graph: TDAG, state: dict, written: list[str], fields) -> Program:
    """The Program of a Converter's graph: what no output needs dropped (statistics and
    indices the table computed for multi-result ops), outputs named by ``fields``, the
    ``written`` state carried (``stateful_program``)."""
    return stateful_program(name_outputs(prune(graph), fields), state, written, fields=fields)


def functional_writes(ep: ExportedProgram) -> ExportedProgram:
    """``ep`` with its writes made functional where one goes through a view that is not the
    whole tensor (``out[:, t] = h`` in a Python loop: RWKV's and RecurrentGemma's scans), which
    the converter cannot keep as a rebind: torch's functionalization writes them as
    select/slice scatters. ``ep`` itself where every write is kept, or where torch cannot
    (the converter then names the writes)."""
    writable = () if has_control_flow(ep) else buffer_placeholders(ep)
    if all(inplace_safe(node, writable) for node in ep.graph.nodes
           if node.op == "call_function"):
        return ep
    try:
        return ep.run_decompositions({})
    except Exception:  # noqa: BLE001  (torch raises many types here)
        return ep


def convertible(ep: ExportedProgram) -> Callable[[torch.fx.Node], bool]:
    """Which of ep's nodes the converter takes as they are. A buffer written in place (a
    static KV cache) is state in a straight-line graph; with control flow it is not (see
    ``torch_control``), and functionalization reports it."""
    writable = () if has_control_flow(ep) else buffer_placeholders(ep)
    return lambda node: handled(node, writable)


def stateful_program(graph: TDAG, state: dict, written: list[str], name: str = "main",
                     fields=()) -> Program:
    """The Program that calls ``graph`` once with its state: the TDAG reads each state
    buffer as an input named after it and returns the new values of ``written`` after its
    own outputs; the call writes them back to the state dict. The program's outputs are
    named by ``fields`` (the output pytree's ``logits``...), else ``out0``, ``out1``..."""
    user_inputs = tuple(v for v in graph.inputs if v.name not in state)
    n_user = len(graph.outputs) - len(written)
    names = FreshNames([v.name for v in graph.inputs] + list(written),
                       variant=lambda base, k: "_" * k + base)  # out0, else _out0 ...
    fields = list(fields) + [None] * n_user
    outs = tuple(names.fresh(fields[i] if fields[i] is not None else f"out{i}")
                 for i in range(n_user))
    call = Call(name, tuple(v.name for v in graph.inputs), outs + tuple(written))
    return Program({name: graph}, Block(user_inputs, (call,), outs), dict(state))
