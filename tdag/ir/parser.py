"""Parse the text form (see ``tdag.ir.printer``) back into a Program.

A file may come from anywhere, so nothing here evaluates code: a regex tokenizer per line
(``tdag.ir.lexer``) and a recursive-descent parser over lines. Dims go through
``symbols.parse_dim`` (itself a small parser); specs are rebuilt as their exact dataclass
types from the field annotations.

>>> import tdag
>>> from tdag import ops
>>> prog = tdag.trace(lambda x: ops.sum(x * x, axis=1), tdag.TensorSpec(("b", 8)))
>>> parse(str(prog)) == prog
True
"""
from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from functools import lru_cache

import sympy
import torch

from tdag.errors import FileFormatError
from tdag.ir.graph import TDAG, Node, Weight
from tdag.ir.lexer import Expr, Ident, Line, Ref, to_dim, to_float
from tdag.ir.op import Op
from tdag.ir.printer import parse_plain_origin
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.record import REGISTRY
from tdag.ir.symbols import Dim, parse_dim, product, shape_is_static
from tdag.ir.types import Origin, TensorKind
from tdag.ir.verify import verify

_KINDS = {k.value: k for k in TensorKind}
MAX_BLOCK_DEPTH = 64  # nested if / loop blocks: deeper is a hostile file, not a model


# -- converting parsed values to typed ones ---------------------------------------------------

def _literal(v):
    """A const's values: (nested lists of) numbers and bools."""
    if isinstance(v, list):
        return [_literal(x) for x in v]
    if v is None:
        raise ValueError("None is not a tensor value")
    return v if isinstance(v, bool) else to_float(v)


def _generic(v):
    """A value with no usable annotation: words are dim symbols, except inf and nan."""
    if isinstance(v, tuple):
        return tuple(_generic(x) for x in v)
    if isinstance(v, list):
        return [_generic(x) for x in v]
    if isinstance(v, (Ident, Expr)):
        return float(v.text) if v.text.lstrip("-") in ("inf", "nan") else parse_dim(v.text)
    if isinstance(v, Ref):
        raise ValueError(f"a %name is not a spec value: %{v.name}")
    return v


def _convert(v, hint):
    """Convert a parsed value to the Python type the spec field is annotated with."""
    if hint is None or hint is typing.Any:
        return _generic(v)
    if hint == Dim:
        return to_dim(v)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _convert_union(v, args)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(v.text if isinstance(v, Ident) else v)
    if hint is bool or hint is str:
        if not isinstance(v, hint):
            raise ValueError(f"expected a {hint.__name__}, got {v!r}")
        return v
    if hint is int:
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"expected an int, got {v!r}")
        return v
    if hint is float:
        return to_float(v)
    if hint is tuple or origin is tuple:
        return _convert_tuple(v, args)
    return _generic(v)


def _convert_union(v, args):
    if v is None and type(None) in args:
        return None
    rest = [a for a in args if a is not type(None)]
    if sympy.Expr in rest:
        return to_dim(v)
    for arg in rest:
        try:
            return _convert(v, arg)
        except (ValueError, TypeError):
            continue
    raise ValueError(f"{v!r} fits none of {rest}")


def _convert_tuple(v, args):
    if not isinstance(v, tuple):
        raise ValueError(f"expected a tuple, got {v!r}")
    if not args:
        return _generic(v)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_convert(x, args[0]) for x in v)
    if len(args) != len(v):
        raise ValueError(f"expected {len(args)} items, got {len(v)}")
    return tuple(_convert(x, a) for x, a in zip(v, args))


@lru_cache(maxsize=None)
def _field_hints(spec_type: type) -> dict:
    try:
        return typing.get_type_hints(spec_type)
    except Exception:  # an annotation that does not resolve: fall back to the defaults' types
        return {f.name: type(f.default) for f in dataclasses.fields(spec_type)
                if isinstance(f.default, enum.Enum)}


def _build_spec(op: Op, bracket, keywords: dict, line: Line):
    prim = REGISTRY.get(op)
    if prim is None:
        line.error(f"op {op.value!r} has no registered primitive")
    fields = dataclasses.fields(prim.spec_type)
    if bracket is not None:
        if not fields or fields[0].name in keywords:
            line.error(f"{op.value} takes no [{fields[0].name if fields else 'kind'}] here")
        keywords = {fields[0].name: bracket, **keywords}
    names = {f.name for f in fields}
    for key in keywords:
        if key not in names:
            line.error(f"{op.value} has no argument {key!r}")
    hints = _field_hints(prim.spec_type)
    return prim.spec_type(**{k: _convert(v, hints.get(k)) for k, v in keywords.items()})


def _origin(line: Line) -> Origin:
    text = (line.comment or "").strip()
    if not text.startswith('"'):
        return parse_plain_origin(text)
    quoted = Line(line.lineno, text)
    parts = []
    for sep in ("@", "(", ")"):
        tok = quoted.take("a quoted string")
        if tok.kind != "string":
            quoted.error("expected a quoted provenance string")
        parts.append(json.loads(tok.text))
        quoted.expect(sep)
    quoted.done()
    return Origin(*parts)


# -- statements -------------------------------------------------------------------------------

def _complex_values(line: Line, literal, ttype) -> torch.Tensor:
    pairs = torch.tensor(literal, dtype=ttype.dtype.real.torch)
    if pairs.ndim == 0 or pairs.shape[-1] != 2:
        line.error(f"the values of a {ttype.dtype.value} are (real, imaginary) pairs")
    return torch.view_as_complex(pairs)


def _weight(line: Line, kind: TensorKind) -> tuple[str, Weight]:
    """``%name: type [= values]`` after the kind word."""
    name = line.name()
    line.expect(":")
    ttype = line.type()
    value = None
    if line.at("="):
        line.take()
        literal = _literal(line.value())
        if not shape_is_static(ttype.shape):
            line.error("inline values need a static shape")
        if ttype.dtype.is_complex:  # printed as (real, imaginary) pairs
            value = _complex_values(line, literal, ttype)
        else:
            value = torch.tensor(literal, dtype=ttype.dtype.torch)
        if ttype.dtype.is_integer and value.tolist() != literal:  # torch wraps -1 into a u8
            line.error(f"the values do not fit {ttype.dtype.value}")
        if value.numel() != product(ttype.shape):
            line.error(f"{value.numel()} values for type {ttype}")
        value = value.reshape(ttype.shape)
    line.done()
    return name, Weight(kind, ttype, value)


def _labels(line: Line) -> tuple[str, tuple]:
    """``labels %name = [0, 1, 2]``: an output's class labels (Program.class_labels)."""
    line.expect("labels")
    name = line.name()
    line.expect("=")
    labels = line.value()
    if not isinstance(labels, list) or any(type(k) is not int for k in labels):
        line.error("class labels are a list of integers")
    line.done()
    return name, tuple(labels)


def _kind(line: Line, default: TensorKind | None) -> TensorKind:
    """An optional kind word (``param``, ``buffer``, ``const``) before a weight's name."""
    tok = line.peek()
    if tok is not None and tok.kind == "ident":
        if tok.text not in _KINDS:
            line.error(f"unknown tensor kind {tok.text!r}")
        line.take()
        return _KINDS[tok.text]
    if default is None:
        line.error("expected a tensor kind")
    return default


def _node(line: Line) -> Node:
    name = line.name()
    line.expect(":")
    ttype = line.type()
    line.expect("=")
    op_tok = line.take("an op")
    try:
        op = Op(op_tok.text)
    except ValueError:
        line.error(f"unknown op {op_tok.text!r}")
    bracket = None
    if line.at("["):
        line.take()
        bracket = line.value()
        line.expect("]")
    inputs, keywords = line.arguments()
    line.done()
    return Node(name, op, inputs, _build_spec(op, bracket, keywords, line), ttype, _origin(line))


class _Parser:
    """Recursive descent over lines: a TDAG or a block spans lines up to its ``}``."""

    def __init__(self, text: str):
        self.lines = []
        for i, raw in enumerate(text.split("\n")):
            line = Line(i + 1, raw.rstrip("\r"))
            if line.tokens:
                self.lines.append(line)
        self.pos = self.depth = 0

    def next(self, what: str) -> Line:
        if self.pos == len(self.lines):
            last = self.lines[-1].lineno if self.lines else 0
            raise FileFormatError(f"line {last}: text ends where {what} was expected")
        self.pos += 1
        return self.lines[self.pos - 1]

    def program(self) -> Program:
        graphs, state, class_labels, main = {}, {}, {}, None
        while self.pos < len(self.lines):
            line = self.next("a section")
            with line.guard():
                if line.at("tdag"):
                    name, graph = self.tdag(line)
                    if name in graphs:
                        line.error(f"tdag {name!r} is defined twice")
                    graphs[name] = graph
                elif line.at("state"):
                    line.take()
                    name, weight = _weight(line, _kind(line, TensorKind.buffer))
                    if name in state:
                        line.error(f"state %{name} is defined twice")
                    state[name] = weight
                elif line.at("labels"):
                    name, labels = _labels(line)
                    if name in class_labels:
                        line.error(f"labels of %{name} are given twice")
                    class_labels[name] = labels
                elif line.at("program"):
                    if main is not None:
                        line.error("a second program block")
                    line.take()
                    main = self.block(line.params(), line, "program")
                    self.close("}")
                else:
                    line.error("expected 'tdag', 'state', 'labels' or 'program'")
        return _assemble(graphs, state, main).replace(class_labels=class_labels)

    def close(self, text: str) -> None:
        line = self.next(repr(text))
        line.expect(text)
        line.done()

    def tdag(self, header: Line) -> tuple[str, TDAG]:
        header.expect("tdag")
        name = header.ident()
        inputs = header.params()
        header.expect("{")
        header.done()
        weights, nodes = {}, []
        while True:
            line = self.next(f"the end of tdag {name}")
            with line.guard():
                tok = line.peek()
                if tok.kind == "ident" and tok.text in _KINDS:
                    wname, weight = _weight(line, _kind(line, None))
                    if wname in weights:
                        line.error(f"weight %{wname} is defined twice")
                    weights[wname] = weight
                elif tok.kind == "name":
                    nodes.append(_node(line))
                elif line.at("return"):
                    line.take()
                    outputs = line.names()
                    self.close("}")
                    return name, TDAG(inputs, weights, nodes, outputs)
                else:
                    line.error("expected a weight, a node or 'return'")

    def block(self, inputs: tuple, header: Line, what: str) -> Block:
        """Steps up to ``return``; the caller reads the closing line."""
        header.expect("{")
        header.done()
        if self.depth == MAX_BLOCK_DEPTH:
            header.error(f"blocks nested deeper than {MAX_BLOCK_DEPTH}")
        self.depth += 1
        steps = []
        while True:
            line = self.next(f"'return' of the {what} block")
            with line.guard():
                if line.at("return"):
                    line.take()
                    self.depth -= 1
                    return Block(inputs, tuple(steps), line.names())
                steps.append(self.step(line))

    def step(self, line: Line):
        outputs = []
        while (tok := line.peek()) is not None and tok.kind == "name":
            outputs.append(line.name())
            if not line.at("="):
                line.expect(",")
        if outputs:
            line.expect("=")
        if line.at("call"):
            line.take()
            graph = line.ident()
            inputs, keywords = line.arguments()
            if keywords:
                line.error("call takes no keyword arguments")
            line.done()
            return Call(graph, inputs, tuple(outputs))
        if line.at("if"):
            return self.if_(line, tuple(outputs))
        if line.at("loop"):
            return self.loop(line, tuple(outputs))
        line.error("expected 'call', 'if', 'loop' or 'return'")

    def if_(self, line: Line, outputs: tuple) -> If:
        line.take()
        inputs, keywords = line.arguments()
        cond = _keywords(line, keywords, {"cond"}).get("cond")
        if not isinstance(cond, Ref):
            line.error("if needs cond=%name")
        line.expect("then")
        then_branch = self.block(line.params(), line, "then")
        middle = self.next("'} else(...) {'")
        with middle.guard():
            middle.expect("}")
            middle.expect("else")
            else_branch = self.block(middle.params(), middle, "else")
        self.close("}")
        return If(cond.name, inputs, then_branch, else_branch, outputs)

    def loop(self, line: Line, outputs: tuple) -> Loop:
        line.take()
        inputs, keywords = line.arguments()
        keywords = _keywords(line, keywords, {"count", "cond", "scanned"})
        cond = keywords.get("cond")
        if cond is not None and not isinstance(cond, Ref):
            line.error("loop cond must be a %name")
        scanned = keywords.get("scanned", 0)
        if not isinstance(scanned, int) or isinstance(scanned, bool):
            line.error("loop scanned must be an int")
        count = keywords.get("count")
        count = None if count is None else to_dim(count)
        line.expect("body")
        body = self.block(line.params(), line, "loop body")
        self.close("}")
        return Loop(inputs, body, outputs, count, cond.name if cond else None, scanned)


def _keywords(line: Line, keywords: dict, allowed: set) -> dict:
    for key in keywords:
        if key not in allowed:
            line.error(f"unknown argument {key!r}")
    return keywords


def _assemble(graphs: dict, state: dict, main: Block | None) -> Program:
    if main is not None:
        return Program(graphs, main, state)
    if not graphs:
        raise FileFormatError("the text holds no tdag and no program")
    if len(graphs) > 1:
        raise FileFormatError(f"the text holds {len(graphs)} tdags but no 'program' block "
                              "to say how they are called")
    name, graph = next(iter(graphs.items()))
    return Program.from_tdag(graph, name).replace(state=state)


def parse(text: str) -> Program:
    """Parse a Program (or a single ``tdag`` section) from its text form.

    The text is a file like any other: what it describes must verify (a dangling name, a
    node whose declared type is not the one its op gives, a call of a missing TDAG raise
    ``InvalidModelError``), so every Program handed on is one the passes can trust."""
    if not isinstance(text, str):
        raise FileFormatError(f"parse() takes text (str), got {type(text).__name__}")
    prog = _Parser(text).program()
    verify(prog)
    return prog
