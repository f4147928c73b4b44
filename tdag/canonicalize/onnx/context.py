"""``NodeContext``: what an ONNX op-table entry sees of its node, the API every entry in
onnx/ops/ is written against: attributes (``attr``, ``flag``, ``sizes``, ``choice``), the
opset, and helpers that read an input as a tensor (``tensor``), a shape value known at import
time (``known``, ``ints``, ``scalar``) or make a constant (``const_tensor``).
"""
from __future__ import annotations

import onnx
import torch
from onnx import helper

from tdag.canonicalize.onnx.load import dtype_of
from tdag.canonicalize.onnx.values import Known, known_of, materialize
from tdag.ops.tensor import Tensor
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType


class PinnedSize(Exception):
    """A size an input declares by name (``num_channels``) that a node fixes (a Conv's
    weight has 3 input channels): from_onnx imports again with the name bound to the value,
    so every input and value that shares the name has the number. Not a TdagError: it never
    leaves from_onnx."""

    def __init__(self, name: str, value: int, where: str):
        super().__init__(f"{name} = {value} ({where})")
        self.name, self.value, self.where = name, value, where


class NodeContext:
    """What an op-table entry sees of its node: attributes, opset and value helpers.

    ``importer`` is the GraphImporter walking the node's graph (onnx/importer.py): entries
    that read more of the walk (the names, the declared types, onnx/runtime.py's notes) reach
    it through ``ctx.importer``.
    """

    def __init__(self, importer, node: onnx.NodeProto):
        self.importer, self.node, self.opset = importer, node, importer.opset
        self.builder = importer.builder
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def attr(self, name: str, default=None):
        value = self.attrs.get(name, default)
        return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value

    def flag(self, name: str, default: int = 0) -> bool:
        """A 0/1 attribute (keepdims, transA, ...). ONNX defines no other value and
        runtimes read one differently (keepdims=2), so any other is a malformed model."""
        value = self.attrs.get(name, default)
        if type(value) is not int or value not in (0, 1):
            raise InvalidModelError(f"attribute {name} must be 0 or 1, got {value!r}")
        return bool(value)

    def sizes(self, name: str, count: int, default: int, least: int) -> list:
        """An ints attribute with one entry per spatial axis (strides, dilations, ...), each
        at least ``least``; ``count`` entries of ``default`` where it is absent or empty."""
        values = list(self.attrs.get(name) or [default] * count)
        if len(values) != count or any(type(v) is not int or v < least for v in values):
            raise InvalidModelError(f"attribute {name} must hold {count} integers of at "
                                    f"least {least}, got {values}")
        return values

    def choice(self, name: str, default: str, allowed) -> str:
        """A string attribute from the values the ONNX spec lists."""
        value = self.attr(name, default)
        if value not in allowed:
            raise InvalidModelError(f"attribute {name} must be one of {sorted(allowed)}, "
                                    f"got {value!r}")
        return value

    @property
    def num_outputs(self) -> int:
        return len(self.node.output)

    def tensor(self, value) -> Tensor:
        """Any value as a tensor of the graph (Knowns are materialised)."""
        if isinstance(value, Known):
            return materialize(self.builder, value)
        if not isinstance(value, Tensor):
            raise UnsupportedOpError(f"{self.node.op_type}: expected a tensor, got {value!r}")
        return value

    def known(self, value) -> Known | None:
        """The value as a Known when it is one, or a small integer const/initializer."""
        if isinstance(value, Known) or value is None:
            return value
        weight = self.builder.weights.get(value.name)
        if weight is not None and weight.value is not None:
            return known_of(weight.value)
        return None

    def ints(self, value, what: str = "") -> list | None:
        """The elements of an integer input known at import time (Dims); None if absent."""
        if value is None:
            return None
        known = self.known(value)
        if known is None:
            raise UnsupportedOpError(f"{self.node.op_type}: input {what or ''} must be known "
                                     "at import time (it is computed from data)")
        return known.dims()

    def scalar(self, value, what: str = ""):
        """A Python number for a scalar input known at import time."""
        if value is None:
            return None
        if isinstance(value, Known):
            return value.dims()[0]
        weight = self.builder.weights.get(value.name)
        if weight is None or weight.value is None or weight.value.numel() != 1:
            raise UnsupportedOpError(f"{self.node.op_type}: {what or 'a scalar input'} must be "
                                     "a constant")
        return weight.value.reshape(()).item()

    def pin(self, dim, value) -> None:
        """Where ``dim`` is a size a graph input declares by name and this node needs it to
        be the int ``value`` (a weight fixes it), bind the name (``PinnedSize``); any other
        mismatch is the op's to report."""
        if is_static(dim) or not is_static(value):
            return
        if getattr(dim, "name", None) in self.importer.shared.input_symbols:
            raise PinnedSize(dim.name, int(value), f"{self.node.op_type} node "
                             f"{self.node.name or '<unnamed>'!r}")

    def const_tensor(self, value: torch.Tensor) -> Tensor | Known:
        known = known_of(value)
        return known if known is not None else self.builder.const(value)

    def dtype(self, onnx_type: int) -> DType:
        return dtype_of(onnx_type)
