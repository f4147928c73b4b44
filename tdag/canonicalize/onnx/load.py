"""Reading an ONNX model safely, and ONNX's names and types in tdag's terms.

A model's external data may only come from files inside the model's own folder: a location
that is absolute, climbs out with ``..`` or resolves (through links) outside is refused before
any byte is read, whatever onnx's own checks allow in the version installed. Every string of
the model must be UTF-8 (protobuf hands over any other as bytes, which onnx's checker cannot
report on). Shape inference runs without data propagation, whose folded shape values can
grow exponentially with the graph (a Concat of a value with itself, repeated).

onnxruntime registers a few ops of its own in the default domain, which onnx's checker does not
know (``ORT_DEFAULT_OPS``, those tdag maps): the checker sees them, in its copy only, in a
private domain it does not validate; any other op of the default domain is still checked.
"""
from __future__ import annotations

import math
import os
import re

import numpy as np
import onnx
import torch
from onnx import TensorProto, external_data_helper, numpy_helper

from tdag.errors import FileFormatError, InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import IN_ONNX, DType, TensorType

ONNX_TO_DTYPE = {dtype.onnx: dtype for dtype in IN_ONNX}

# sub-byte types: ONNX packs two (four) elements a byte; torch has no arithmetic on them
_PACKED = {"INT4", "UINT4", "INT2", "UINT2", "FLOAT4E2M1", "FLOAT6E2M3", "FLOAT6E3M2"}


def dtype_of(elem_type: int, what: str = "") -> DType:
    if elem_type not in ONNX_TO_DTYPE:
        name = _type_name(elem_type)
        why = (": a packed sub-byte type, which torch cannot compute in" if name in _PACKED
               else "")
        raise UnsupportedOpError(f"element type {name}"
                                 f"{' of ' + what if what else ''} has no tdag dtype{why}")
    return ONNX_TO_DTYPE[elem_type]


def _type_name(elem_type: int) -> str:
    """tdag's name for an ONNX element type where it has one, else ONNX's."""
    if elem_type in ONNX_TO_DTYPE:
        return ONNX_TO_DTYPE[elem_type].value
    return TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() \
        else str(elem_type)


# 4-bit integer weights (blockwise-quantized files: DequantizeLinear, GatherBlockQuantized)
# are read one element a byte, as i8 (uint4's 0..15 fit): their values are what the ops
# that read them compute with, and no op reads an i8 constant as packed nibbles
WIDENED = {TensorProto.INT4: DType.i8, TensorProto.UINT4: DType.i8}


def initializer_dtype(elem_type: int, what: str = "") -> DType:
    """The dtype of a constant of ``elem_type``: a 4-bit integer widened to a byte."""
    return WIDENED.get(elem_type) or dtype_of(elem_type, what)


def tensor_of(array: np.ndarray) -> torch.Tensor:
    """A torch tensor (a copy) of an array from onnx's numpy_helper; bfloat16 and the float8
    kinds arrive as ml_dtypes' types, which torch cannot take, so their bits are
    reinterpreted; int4 and uint4 are widened to i8 (``WIDENED``)."""
    if array.dtype.name in ("int4", "uint4"):
        return torch.from_numpy(array.astype(np.int8))
    special = _ML_DTYPES.get(array.dtype.name)
    if special is not None:
        bits = np.ascontiguousarray(array).view(f"u{array.dtype.itemsize}").copy()
        return torch.from_numpy(bits).view(special.torch)
    return torch.from_numpy(np.array(array, copy=True))


# ml_dtypes' names of the types numpy lacks, as onnx's numpy_helper hands them over
_ML_DTYPES = {"bfloat16": DType.bf16, "float8_e4m3fn": DType.f8e4m3fn,
              "float8_e4m3fnuz": DType.f8e4m3fnuz, "float8_e5m2": DType.f8e5m2,
              "float8_e5m2fnuz": DType.f8e5m2fnuz, "float8_e8m0fnu": DType.f8e8m0fnu}


def declared_clash(declared: onnx.TypeProto.Tensor, computed: TensorType) -> str | None:
    """The declared type as text where it contradicts the computed one (another element
    type, rank or static size; symbolic sizes are not compared), else None."""
    clash = bool(declared.elem_type) and ONNX_TO_DTYPE.get(declared.elem_type) is not \
        computed.dtype
    dims = list(declared.shape.dim) if declared.HasField("shape") else None
    if dims is not None:
        clash = clash or len(dims) != len(computed.shape) or any(
            d.HasField("dim_value") and is_static(c) and d.dim_value != c
            for d, c in zip(dims, computed.shape))
    if not clash:
        return None
    if dims is None:
        return f"{_type_name(declared.elem_type)}[...]"
    shown = [str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?" for d in dims]
    return f"{_type_name(declared.elem_type)}[{','.join(shown)}]"


def load_model(source) -> onnx.ModelProto:
    """A checked, shape-inferred ModelProto from a path or a ModelProto."""
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)  # loading external data and inference must not touch the caller's
        check_text(model)
        _refuse_unloaded(model)
    elif isinstance(source, (str, os.PathLike)):
        model = _read(os.fspath(source))
    else:
        raise InvalidModelError(f"from_onnx takes a path or an onnx.ModelProto, "
                                f"got {type(source).__name__}")
    return _checked(model)


# onnxruntime's own ops of the default domain that tdag maps (canonicalize/onnx/ops/contrib.py):
# the RMS norm that onnxruntime-genai's model builder writes. Not in onnx, so its checker refuses
# them; its copy of the model holds them in _CHECKER_DOMAIN instead, whose nodes it skips.
ORT_DEFAULT_OPS = frozenset({"SimplifiedLayerNormalization"})
_CHECKER_DOMAIN = "ai.tdag.onnxruntime_default"


# onnx's C++ checker and shape inference take the model serialized, and protobuf serializes
# at most 2 GiB: a larger model (its weights were external data) is checked as a skeleton
PROTO_LIMIT = 2**31 - 2**24


def _checked(model: onnx.ModelProto) -> onnx.ModelProto:
    step = "inlining its local functions"
    try:
        if model.functions:  # model-local functions become plain nodes
            model = onnx.inliner.inline_local_functions(model)
        if _past_limit(model):
            return _checked_skeleton(model)
        # inference first: it fills in the output types the checker insists on (tdag computes
        # shapes itself: data propagation would only risk exponential memory, see above)
        step = "shape inference"
        model = onnx.shape_inference.infer_shapes(model, data_prop=False)
        step = "the ONNX checker"
        onnx.checker.check_model(_for_checker(model))
        return model
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise InvalidModelError(f"malformed ONNX model: {str(exc).strip()[:500]}") from None
    except Exception as exc:  # onnx's C++ core: RuntimeError, UnicodeDecodeError, ...
        raise InvalidModelError(f"malformed ONNX model: {step} failed with "
                                f"{type(exc).__name__}: {str(exc).strip()[:500]}") from exc


def _past_limit(model: onnx.ModelProto) -> bool:
    try:
        return model.ByteSize() > PROTO_LIMIT
    except Exception:  # noqa: BLE001  (protobuf cannot even size it: past 2 GiB)
        return True


def _checked_skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """Check and shape-infer a model past protobuf's 2 GiB: the same graph with each large
    initializer of the main graph turned into a graph input of its type and dims (so its
    bytes stay out), whose inferred types then go back onto the model itself. Shape
    inference reads the values of small integer initializers only, which stay in."""
    skeleton = onnx.ModelProto()
    _copy_fields(model, skeleton, skip="graph")
    graph = skeleton.graph
    _copy_fields(model.graph, graph, skip="initializer")
    large = [t for t in model.graph.initializer if math.prod(t.dims) > 2**18]
    names = {t.name for t in large}
    graph.initializer.extend(t for t in model.graph.initializer if t.name not in names)
    listed = {i.name for i in graph.input}
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in large if t.name not in listed)
    skeleton = onnx.shape_inference.infer_shapes(skeleton, data_prop=False)
    onnx.checker.check_model(_for_checker(skeleton))
    del model.graph.value_info[:]
    model.graph.value_info.extend(skeleton.graph.value_info)
    for out, inferred in zip(model.graph.output, skeleton.graph.output):
        out.CopyFrom(inferred)
    return model


def _copy_fields(source, target, skip: str) -> None:
    """Copy every set field of one protobuf message to another but ``skip`` (copying the
    whole of a model past 2 GiB would copy its weights)."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _for_checker(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model as the checker sees it: every graph output with a shape, a rule tdag does
    not need (it computes shapes itself) and that inference cannot always meet (NonZero, old
    opsets); the ops of ``ORT_DEFAULT_OPS`` in ``_CHECKER_DOMAIN``. A copy where that changes
    anything: the model itself is untouched."""
    shapeless = [o for o in model.graph.output
                 if o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape")]
    if not shapeless and not any(_ort_default_nodes(model.graph)):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for output in copy.graph.output:
        if output.type.HasField("tensor_type"):
            output.type.tensor_type.shape.SetInParent()
    moved = False
    for node in _ort_default_nodes(copy.graph):
        node.domain = _CHECKER_DOMAIN
        moved = True
    if moved:
        copy.opset_import.append(onnx.helper.make_opsetid(_CHECKER_DOMAIN, 1))
    return copy


def _ort_default_nodes(graph: onnx.GraphProto):
    """The nodes of ``ORT_DEFAULT_OPS`` in the default domain, in ``graph`` and its subgraphs."""
    for node in graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type in ORT_DEFAULT_OPS:
            yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _ort_default_nodes(attr.g)
            for sub in attr.graphs:
                yield from _ort_default_nodes(sub)


def _read(path: str) -> onnx.ModelProto:
    if not os.path.isfile(path):
        raise FileFormatError(f"no such ONNX file: {path!r}")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError, RuntimeWarning and others
        raise FileFormatError(f"{path!r} is not a readable ONNX model: {exc}") from None
    if not model.HasField("graph"):
        raise FileFormatError(f"{path!r} is not an ONNX model: it holds no graph")
    check_text(model)
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
    """Refuse a data file that is not a plain file inside the model's folder."""
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    if "\0" in location:  # the OS would refuse the path with a ValueError
        raise FileFormatError(f"initializer {tensor.name!r} reads external data from "
                              f"{location!r}: a NUL byte in a file name")
    parts = re.split(r"[\\/]", location)
    escapes = (not location or os.path.isabs(location) or location.startswith(("/", "\\"))
               or ".." in parts or re.match(r"[A-Za-z]:", location))
    real = os.path.realpath(os.path.join(base, location))
    if escapes or os.path.commonpath([real, os.path.realpath(base)]) != os.path.realpath(base):
        raise InvalidModelError(f"initializer {tensor.name!r} reads external data from "
                                f"{location!r}, outside the model's folder: refused")
    if not os.path.isfile(real):  # a folder, a FIFO (reading would block) or nothing
        raise FileFormatError(f"initializer {tensor.name!r} reads external data from "
                              f"{location!r}, which is not a file")


def _refuse_unloaded(model: onnx.ModelProto) -> None:
    names = [t.name for t in _external_tensors(model)]
    if names:
        raise InvalidModelError(f"the model's tensors {names[:5]} live in external files: "
                                "pass the model's path so they can be read from its folder")


# -- text and sparse tensors ------------------------------------------------------------------

def check_text(model: onnx.ModelProto) -> None:
    """Refuse a string field that is not UTF-8 (protobuf hands it over as bytes, which
    neither onnx's checker nor tdag's name rules expect), naming where it is."""
    try:
        _check_text(model, [])
    except RecursionError:
        raise InvalidModelError("the ONNX model is nested too deeply to read") from None


def _check_text(message, path: list) -> None:
    for field in message.DESCRIPTOR.fields:
        if field.type == field.TYPE_STRING:
            values = getattr(message, field.name)
            for i, value in enumerate(values if field.is_repeated else [values]):
                if isinstance(value, bytes):
                    place = f"{field.name}[{i}]" if field.is_repeated else field.name
                    raise FileFormatError(f"{_where(message, path + [place])} is not UTF-8 "
                                          f"text: {value!r}")
        elif field.type == field.TYPE_MESSAGE:
            if field.is_repeated:
                for i, sub in enumerate(getattr(message, field.name)):
                    _check_text(sub, path + [(f"{field.name}[{i}]", sub)])
            elif message.HasField(field.name):
                sub = getattr(message, field.name)
                _check_text(sub, path + [(field.name, sub)])


def _where(message, path: list) -> str:
    """``graph.node[3].name (in node #3 'conv' of type Conv)``: the field's place in the file,
    and the innermost node it belongs to."""
    place = ".".join(p if isinstance(p, str) else p[0] for p in path)
    nodes = [(p[0], p[1]) for p in path if not isinstance(p, str) and
             isinstance(p[1], onnx.NodeProto)]
    if not nodes:
        return place
    label, node = nodes[-1]
    return f"{place} (in {label}, name {_text(node.name)!r}, op {_text(node.op_type)!r})"


def _text(value) -> str:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def describe_node(node: onnx.NodeProto, index: int | None = None, graph: str = "") -> str:
    """How errors name an ONNX node: name, op type and place (index in its graph)."""
    place = f"#{index}" if index is not None else ""
    if graph:
        place += f" of graph {graph!r}" if place else f"in graph {graph!r}"
    name = f"{node.name!r}" if node.name else "<unnamed>"
    return f"ONNX node {name} ({node.op_type}{', ' + place if place else ''})"


MAX_DENSE = 2 ** 28  # elements of a densified sparse tensor (1 GiB of float32)


def dense_of_sparse(sparse: onnx.SparseTensorProto) -> np.ndarray:
    """The dense array of a SparseTensorProto (tdag keeps every weight dense), checked
    against the format: values 1-D, indices linear ([NNZ]) or coordinates ([NNZ, rank]),
    in range, ascending and without repeats."""
    name = sparse.values.name or "<unnamed sparse tensor>"
    dims = [int(d) for d in sparse.dims]
    size = math.prod(dims) if all(d >= 0 for d in dims) else -1
    if size < 0 or size > MAX_DENSE:
        raise UnsupportedOpError(f"sparse tensor {name!r} of shape {dims}: tdag holds weights "
                                 f"dense, at most {MAX_DENSE} elements")
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    if indices.ndim == 2 and indices.shape[1] == len(dims):
        if indices.size and ((indices < 0).any() or (indices >= dims).any()):
            raise InvalidModelError(f"sparse tensor {name!r}: an index is out of range")
        indices = np.ravel_multi_index(tuple(indices.T), dims) if indices.size \
            else np.zeros(0, np.int64)
    if values.ndim != 1 or indices.shape != values.shape:
        raise InvalidModelError(f"sparse tensor {name!r}: {values.shape} values do not fit "
                                f"{indices.shape} indices of shape {dims}")
    if indices.size and (indices[0] < 0 or indices[-1] >= size or (np.diff(indices) <= 0).any()):
        raise InvalidModelError(f"sparse tensor {name!r}: indices must ascend within "
                                f"[0, {size})")
    dense = np.zeros(size, dtype=values.dtype)
    dense[indices] = values
    return dense.reshape(dims)


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
