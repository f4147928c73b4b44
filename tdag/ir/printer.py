"""The readable text form of a Program: one node per line, in the seed's notation.

    tdag main(%x: f32[b,3]) {
      param %w: f32[4,3]
      const %c0: f32[] = 0.5
      %1: f32[b,4] = reduce[sum](%0, axes=(2,))  # aten.sum @ encoder.layer.3 (model.py:12)
      return %1
    }

    state %kv: f32[2,8]

    program(%x: f32[b,3]) {
      %out0 = call main(%x)
      return %out0
    }

Every line parses back (``tdag.ir.parser.parse``) to an equal Program, so the printer makes
only choices the parser can undo: names and strings that would be ambiguous are quoted, and
floats print with ``repr`` so their bits survive.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
import re

import sympy
import torch

from tdag.ir.graph import TDAG, Node, Weight
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.symbols import format_dim, shape_is_static
from tdag.ir.types import Origin, TensorKind, TensorType

INDENT = "  "
MAX_INLINE = 16  # consts with at most this many elements print their values

# Names that print bare; anything else is quoted (``%"odd name"``). A bare name cannot end in
# ``.`` or ``:`` so that ``%x: f32[]`` never reads as a name ``x:``.
BARE_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.:]*[A-Za-z0-9_])?\Z")
BARE_IDENT = re.compile(r"[A-Za-z_](?:[A-Za-z0-9_.:]*[A-Za-z0-9_])?\Z")
RESERVED = frozenset({"True", "False", "None"})


# -- atoms ------------------------------------------------------------------------------------

def quote(text: str) -> str:
    # ensure_ascii: no character that str.splitlines or an editor would break a line at
    return json.dumps(text, ensure_ascii=True)


def format_name(name: str) -> str:
    return "%" + (name if BARE_NAME.match(name) else quote(name))


def format_ident(name: str) -> str:
    """A graph name: bare when it reads as one word, else a quoted string."""
    return name if BARE_IDENT.match(name) and name not in RESERVED else quote(name)


def format_type(t: TensorType) -> str:
    return str(t)


def format_float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)  # shortest text that reads back to the same double


def format_value(v) -> str:
    """A spec field value: ints, floats, Dims, enums, None, bools, strings, (nested) tuples."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, sympy.Expr):
        return format_dim(v)
    if isinstance(v, enum.Enum):
        value = v.value
        return value if isinstance(value, str) and BARE_IDENT.match(value) else format_value(value)
    if isinstance(v, str):
        return quote(v)
    if isinstance(v, tuple):
        items = ", ".join(format_value(x) for x in v)
        return f"({items},)" if len(v) == 1 else f"({items})"
    if isinstance(v, list):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    return repr(v)  # not a spec value the format knows; the parser will reject it


# -- provenance -------------------------------------------------------------------------------

def _plain_origin(o: Origin) -> str:
    parts = [o.op] if o.op else []
    if o.scope:
        parts.append(f"@ {o.scope}")
    if o.location:
        parts.append(f"({o.location})")
    return " ".join(parts)


def parse_plain_origin(text: str) -> Origin:
    """Undo ``_plain_origin``: ``op @ scope (location)``, each part optional."""
    op, scope, location = text.strip(), "", ""
    if op.endswith(")"):
        i = op.rfind("(")
        if i == 0 or (i > 0 and op[i - 1] == " "):
            op, location = op[:max(i - 1, 0)], op[i + 1:-1]
    padded = " " + op
    k = padded.find(" @ ")
    if k >= 0:
        op, scope = padded[1:k], padded[k + 3:]
    return Origin(op, scope, location)


def format_origin(o: Origin) -> str:
    """The trailing comment text: plain when it parses back exactly, else three strings."""
    plain = _plain_origin(o)
    if "\n" not in plain and "\r" not in plain and not plain.startswith('"') \
            and parse_plain_origin(plain) == o:
        return plain
    return f"{quote(o.op)} @ {quote(o.scope)} ({quote(o.location)})"


# -- TDAGs ------------------------------------------------------------------------------------

def format_params(values) -> str:
    return ", ".join(f"{format_name(v.name)}: {format_type(v.type)}" for v in values)


def inline_values(weight: Weight) -> str | None:
    """The values of a small const as a (nested) list literal, or None."""
    value = weight.value
    if (weight.kind is not TensorKind.const or value is None or value.device.type == "meta"
            or not shape_is_static(weight.type.shape) or value.numel() > MAX_INLINE):
        return None
    value = value.detach().cpu()
    if value.is_complex():  # as (real, imaginary) pairs; the type says they are complex
        value = torch.view_as_real(value.resolve_conj())
    return _format_list(value.tolist())


def _format_list(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_format_list(x) for x in v) + "]"
    return format_value(v)


def format_weight(name: str, weight: Weight) -> str:
    text = f"{weight.kind.value} {format_name(name)}: {format_type(weight.type)}"
    values = inline_values(weight)
    return text if values is None else f"{text} = {values}"


def format_spec_call(op_name: str, spec, inputs) -> str:
    """``op[kind](%a, %b, key=value)``: a leading enum field prints in brackets."""
    head, keywords = op_name, []
    if spec is not None and dataclasses.is_dataclass(spec):
        fields = dataclasses.fields(spec)
        first = getattr(spec, fields[0].name) if fields else None
        if isinstance(first, enum.Enum):
            head += f"[{format_value(first)}]"
            fields = fields[1:]
        keywords = [f"{f.name}={format_value(getattr(spec, f.name))}" for f in fields]
    elif spec is not None:
        keywords = [f"spec={spec!r}"]
    args = [format_name(n) for n in inputs] + keywords
    return f"{head}({', '.join(args)})"


def format_node(node: Node) -> str:
    op_name = node.op.value if isinstance(node.op, enum.Enum) else str(node.op)
    text = (f"{format_name(node.name)}: {format_type(node.type)} = "
            f"{format_spec_call(op_name, node.spec, node.inputs)}")
    if node.origin != Origin():
        text += f"  # {format_origin(node.origin)}"
    return text


def format_return(outputs) -> str:
    return "return " + ", ".join(format_name(n) for n in outputs) if outputs else "return"


def format_tdag(graph: TDAG, name: str = "main") -> str:
    lines = [f"tdag {format_ident(name)}({format_params(graph.inputs)}) {{"]
    lines += [INDENT + format_weight(k, w) for k, w in graph.weights.items()]
    lines += [INDENT + format_node(n) for n in graph.nodes]
    lines += [INDENT + format_return(graph.outputs), "}"]
    return "\n".join(lines)


# -- programs ---------------------------------------------------------------------------------

def format_state(name: str, weight: Weight) -> str:
    # buffers are the usual state (a KV cache), so their kind is left implicit
    text = format_weight(name, weight)
    return "state " + (text[len("buffer "):] if weight.kind is TensorKind.buffer else text)


def format_labels(name: str, labels: tuple) -> str:
    """``labels %probabilities = [0, 1, 2]``: an output's class labels (Program.class_labels)."""
    return f"labels {format_name(name)} = [{', '.join(str(k) for k in labels)}]"


def _outs(names) -> str:
    return ", ".join(format_name(n) for n in names) + " = " if names else ""


def format_step(step, depth: int) -> list[str]:
    pad = INDENT * depth
    if isinstance(step, Call):
        args = ", ".join(format_name(n) for n in step.inputs)
        return [f"{pad}{_outs(step.outputs)}call {format_ident(step.graph)}({args})"]
    if isinstance(step, If):
        args = [format_name(n) for n in step.inputs] + [f"cond={format_name(step.cond)}"]
        lines = [f"{pad}{_outs(step.outputs)}if({', '.join(args)}) "
                 f"then({format_params(step.then_branch.inputs)}) {{"]
        lines += format_block_body(step.then_branch, depth + 1)
        lines.append(f"{pad}}} else({format_params(step.else_branch.inputs)}) {{")
        lines += format_block_body(step.else_branch, depth + 1)
        return lines + [pad + "}"]
    if isinstance(step, Loop):
        args = [format_name(n) for n in step.inputs]
        if step.count is not None:
            args.append(f"count={format_value(step.count)}")
        if step.cond is not None:
            args.append(f"cond={format_name(step.cond)}")
        if step.scanned:
            args.append(f"scanned={step.scanned}")
        lines = [f"{pad}{_outs(step.outputs)}loop({', '.join(args)}) "
                 f"body({format_params(step.body.inputs)}) {{"]
        lines += format_block_body(step.body, depth + 1)
        return lines + [pad + "}"]
    return [f"{pad}# unknown controller {type(step).__name__}"]


def format_block_body(block: Block, depth: int) -> list[str]:
    lines = []
    for step in block.steps:
        lines += format_step(step, depth)
    return lines + [INDENT * depth + format_return(block.outputs)]


def format_program(prog: Program) -> str:
    sections = [format_tdag(g, name) for name, g in prog.graphs.items()]
    if prog.state:
        sections.append("\n".join(format_state(k, w) for k, w in prog.state.items()))
    if prog.class_labels:
        sections.append("\n".join(format_labels(k, v) for k, v in prog.class_labels.items()))
    main = [f"program({format_params(prog.main.inputs)}) {{"]
    main += format_block_body(prog.main, 1) + ["}"]
    sections.append("\n".join(main))
    return "\n\n".join(sections) + "\n"


# The data model does not import its printer (the printer imports it): str() of a TDAG or a
# Program is installed here, and tdag.ir imports this module, so it is there once any of
# tdag.ir is imported.
TDAG.__str__ = lambda self: format_tdag(self, "main")
Program.__str__ = format_program
