"""Reading an ONNX model safely, and ONNX's names and types in tdag's terms.

A model's external data may only come from files inside the model's own folder: a location
that is absolute, climbs out with ``..`` or resolves (through links) outside is refused before
any byte is read, whatever onnx's own checks allow in the version installed.
"""
from __future__ import annotations

import os
import re

import onnx
from onnx import TensorProto, external_data_helper

from tdag.errors import FileFormatError, InvalidModelError, UnsupportedOpError
from tdag.ir.types import DType

ONNX_TO_DTYPE = {
    TensorProto.FLOAT: DType.f32, TensorProto.DOUBLE: DType.f64, TensorProto.FLOAT16: DType.f16,
    TensorProto.BFLOAT16: DType.bf16, TensorProto.INT64: DType.i64, TensorProto.INT32: DType.i32,
    TensorProto.INT16: DType.i16, TensorProto.INT8: DType.i8, TensorProto.UINT8: DType.u8,
    TensorProto.BOOL: DType.bool,
}


def dtype_of(elem_type: int, what: str = "") -> DType:
    if elem_type not in ONNX_TO_DTYPE:
        name = TensorProto.DataType.Name(elem_type) if elem_type in \
            TensorProto.DataType.values() else str(elem_type)
        raise UnsupportedOpError(f"element type {name}{' of ' + what if what else ''} "
                                 "has no tdag dtype")
    return ONNX_TO_DTYPE[elem_type]


def load_model(source) -> onnx.ModelProto:
    """A checked, shape-inferred ModelProto from a path or a ModelProto."""
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)  # loading external data and inference must not touch the caller's
        _refuse_unloaded(model)
    elif isinstance(source, (str, os.PathLike)):
        model = _read(os.fspath(source))
    else:
        raise InvalidModelError(f"from_onnx takes a path or an onnx.ModelProto, "
                                f"got {type(source).__name__}")
    try:
        if model.functions:  # model-local functions become plain nodes
            model = onnx.inliner.inline_local_functions(model)
        # inference first: it fills in the output types the checker insists on
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
        onnx.checker.check_model(_with_output_shapes(model))
        return model
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise InvalidModelError(f"malformed ONNX model: {str(exc).strip()[:500]}") from None


def _with_output_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for the checker, whose rule that every graph output has a shape is not one
    tdag needs (it computes shapes itself) and that inference cannot always meet (NonZero,
    old opsets)."""
    if all(o.type.tensor_type.HasField("shape") for o in model.graph.output
           if o.type.HasField("tensor_type")):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for output in copy.graph.output:
        if output.type.HasField("tensor_type"):
            output.type.tensor_type.shape.SetInParent()
    return copy


def _read(path: str) -> onnx.ModelProto:
    if not os.path.isfile(path):
        raise FileFormatError(f"no such ONNX file: {path!r}")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError, RuntimeWarning and others
        raise FileFormatError(f"{path!r} is not a readable ONNX model: {exc}") from None
    if not model.HasField("graph"):
        raise FileFormatError(f"{path!r} is not an ONNX model: it holds no graph")
    base = os.path.dirname(os.path.abspath(path))
    for tensor in _external_tensors(model):
        _check_location(tensor, base)
    try:
        external_data_helper.load_external_data_for_model(model, base)
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:
        raise FileFormatError(f"cannot read the external data of {path!r}: {exc}") from None
    return model


def _external_tensors(model: onnx.ModelProto):
    return [t for t in external_data_helper._get_all_tensors(model)
            if external_data_helper.uses_external_data(t)]


def _check_location(tensor: TensorProto, base: str) -> None:
    """Refuse a data file that is not inside the model's folder."""
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    parts = re.split(r"[\\/]", location)
    escapes = (not location or os.path.isabs(location) or location.startswith(("/", "\\"))
               or ".." in parts or re.match(r"[A-Za-z]:", location))
    real = os.path.realpath(os.path.join(base, location))
    if escapes or os.path.commonpath([real, os.path.realpath(base)]) != os.path.realpath(base):
        raise InvalidModelError(f"initializer {tensor.name!r} reads external data from "
                                f"{location!r}, outside the model's folder: refused")


def _refuse_unloaded(model: onnx.ModelProto) -> None:
    names = [t.name for t in _external_tensors(model)]
    if names:
        raise InvalidModelError(f"the model's tensors {names[:5]} live in external files: "
                                "pass the model's path so they can be read from its folder")


# -- names ------------------------------------------------------------------------------------

_BAD_NAME = re.compile(r"[^A-Za-z0-9_.:]")
_BAD_SYMBOL = re.compile(r"[^A-Za-z0-9_]")


def tdag_name(onnx_name: str) -> str:
    """An ONNX name under tdag's naming rules ([A-Za-z0-9_.:], starting alphanumeric or _)."""
    base = _BAD_NAME.sub("_", onnx_name).strip("_") or "t"
    return base if base[0].isalnum() or base[0] == "_" else "_" + base


def symbol_name(dim_param: str) -> str:
    """A dim_param (``batch size``, ``s0``, ``2*n``) as a valid symbol name."""
    name = _BAD_SYMBOL.sub("_", dim_param).strip("_") or "dim"
    return name if not name[0].isdigit() else "d" + name


def scope_of(node_name: str) -> str:
    """The module path in a torch-exported node name:
    ``/blocks.0/attn/MatMul`` -> ``blocks.0.attn``."""
    parts = [p for p in node_name.split("/") if p]
    return ".".join(parts[:-1]) if len(parts) > 1 else ""
