"""``from_torch``: an ExportedProgram's ATen graph, walked node by node into a tdag Program.

Placeholders become inputs (user inputs, flattened as torch.export flattens the calling
convention) and weights (parameters, buffers and constants under their state-dict names);
each ATen node is emitted through the op table inside ``Builder.scope(origin)``; outputs are
the flattened user outputs. Unsupported ops are collected over the whole graph and reported
in one UnsupportedOpError. A graph with ``torch.cond`` or ``while_loop`` is split into
several TDAGs joined by If and Loop controllers (``torch_control``); one without stays a
single TDAG.
"""
from __future__ import annotations

from torch.export import ExportedProgram

from tdag.canonicalize.torch_capture import capture, decompose_unknown
from tdag.canonicalize.torch_control import convert_control, has_control_flow
from tdag.canonicalize.torch_converter import Converter, handled
from tdag.canonicalize.torch_names import dim_names
from tdag.ir.program import Program
from tdag.refine.dataflow import prune


def from_torch(source, example_args=(), example_kwargs=None, dynamic_batch: bool = False,
               dynamic_shapes=None) -> Program:
    """Canonicalize a torch model into a tdag Program.

    ``source`` is an ``nn.Module`` (exported with ``example_args``/``example_kwargs``), an
    ``ExportedProgram``, or the path of a ``.pt2`` file written by ``torch.export.save``.
    ``dynamic_batch=True`` makes dim 0 of every input the symbol ``batch``;
    ``dynamic_shapes`` takes torch.export's own spec instead. Weights on the meta device give
    a shape-only program (weights with no value).

    >>> import torch, tdag
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    >>> prog = from_torch(model, (torch.randn(2, 4),), dynamic_batch=True)
    >>> [str(t) for t in prog.input_types], [str(t) for t in prog.graph.output_types]
    (['f32[batch,4]'], ['f32[batch,3]'])
    >>> prog.graph.weights["0.weight"].kind
    <TensorKind.parameter: 'param'>
    """
    ep = capture(source, example_args, example_kwargs, dynamic_batch, dynamic_shapes)
    ep = decompose_unknown(ep, handled)
    names = dim_names(ep, source, example_args, example_kwargs, dynamic_batch, dynamic_shapes)
    return convert(ep, names)


def convert(ep: ExportedProgram, names: dict | None = None) -> Program:
    """The Program of an ExportedProgram whose ops the table knows; ``names`` maps
    (user input number, axis) to the name of that dynamic dimension."""
    if has_control_flow(ep):
        return convert_control(ep, names or {})
    converter = Converter(ep, names or {})
    with converter.builder.active():
        converter.run()
    # drop what no output needs: statistics and indices the table computed for multi-result ops
    return Program.from_tdag(prune(converter.graph))
