"""Tensor types: dtype, (symbolic) shape, tensor kinds and provenance."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from onnx import TensorProto

from tdag.errors import ShapeError, UnsupportedOpError
from tdag.ir.symbols import Dim, as_dim, format_dim, product, shapes_equal


class DType(enum.Enum):
    """Element types; the value is the short name the printer uses."""

    f64 = "f64"
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    i64 = "i64"
    i32 = "i32"
    i16 = "i16"
    i8 = "i8"
    u64 = "u64"
    u32 = "u32"
    u16 = "u16"
    u8 = "u8"
    bool = "bool"
    # the 8-bit floats torch has (ONNX FLOAT8E4M3FN .. FLOAT8E8M0); e4m3 and e5m2 hold
    # exponent and mantissa bits, "fn" has no infinities, "uz" no negative zero, e8m0 is a
    # power-of-two scale
    f8e4m3fn = "f8e4m3fn"
    f8e4m3fnuz = "f8e4m3fnuz"
    f8e5m2 = "f8e5m2"
    f8e5m2fnuz = "f8e5m2fnuz"
    f8e8m0fnu = "f8e8m0fnu"
    # complex: a (real, imaginary) pair of f16 / f32 / f64; ONNX carries one as a trailing
    # axis of 2. c32 is torch.complex32 (chalf), whose CPU kernels are few: the records that
    # take it say so (``complex_half`` in tdag/deinops/primitive.py); ONNX and JAX have no
    # complex32 element type
    c32 = "c32"
    c64 = "c64"
    c128 = "c128"

    @property
    def torch(self) -> torch.dtype:
        return _TO_TORCH[self]

    @property
    def onnx(self) -> int:
        """The ONNX element type (``TensorProto.FLOAT`` ...): the one table both the ONNX
        importer and the ONNX writer read; c32 has none (``IN_ONNX``)."""
        if self not in _TO_ONNX:
            raise UnsupportedOpError(f"ONNX has no element type for {self.value}: to_onnx "
                                     "holds a complex value as its (real, imaginary) pair")
        return _TO_ONNX[self]

    @property
    def itemsize(self) -> int:
        return _TO_TORCH[self].itemsize

    @property
    def is_float(self) -> bool:
        return self in _FLOATS or self in FLOAT8

    @property
    def is_complex(self) -> bool:
        return self in COMPLEX

    @property
    def real(self) -> "DType":
        """The type of a complex type's parts (c64 -> f32); a real type is its own."""
        return COMPLEX.get(self, self)

    @property
    def is_float8(self) -> bool:
        return self in FLOAT8

    @property
    def is_integer(self) -> bool:
        """A signed or unsigned integer type; bool is neither integer nor float."""
        return self in _SIGNED or self in UNSIGNED

    @property
    def is_unsigned(self) -> bool:
        return self in UNSIGNED

    @staticmethod
    def of(value) -> "DType":
        """Accept a DType, a torch dtype, or a name: 'float32', 'f32', 'int64', 'bool'."""
        if isinstance(value, DType):
            return value
        if isinstance(value, torch.dtype):
            if value not in _FROM_TORCH:
                raise ShapeError(f"unsupported dtype {value}")
            return _FROM_TORCH[value]
        if isinstance(value, str):
            if value in DType.__members__:
                return DType[value]
            name = getattr(torch, value, None)
            if isinstance(name, torch.dtype) and name in _FROM_TORCH:
                return _FROM_TORCH[name]
        raise ShapeError(f"unknown dtype {value!r}")


_TO_TORCH = {
    DType.f64: torch.float64, DType.f32: torch.float32, DType.f16: torch.float16,
    DType.bf16: torch.bfloat16, DType.i64: torch.int64, DType.i32: torch.int32,
    DType.i16: torch.int16, DType.i8: torch.int8, DType.u64: torch.uint64,
    DType.u32: torch.uint32, DType.u16: torch.uint16, DType.u8: torch.uint8,
    DType.bool: torch.bool, DType.f8e4m3fn: torch.float8_e4m3fn,
    DType.f8e4m3fnuz: torch.float8_e4m3fnuz, DType.f8e5m2: torch.float8_e5m2,
    DType.f8e5m2fnuz: torch.float8_e5m2fnuz, DType.f8e8m0fnu: torch.float8_e8m0fnu,
    DType.c32: torch.complex32, DType.c64: torch.complex64, DType.c128: torch.complex128,
}
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}
_TO_ONNX = {
    DType.f64: TensorProto.DOUBLE, DType.f32: TensorProto.FLOAT, DType.f16: TensorProto.FLOAT16,
    DType.bf16: TensorProto.BFLOAT16, DType.i64: TensorProto.INT64, DType.i32: TensorProto.INT32,
    DType.i16: TensorProto.INT16, DType.i8: TensorProto.INT8, DType.u64: TensorProto.UINT64,
    DType.u32: TensorProto.UINT32, DType.u16: TensorProto.UINT16, DType.u8: TensorProto.UINT8,
    DType.bool: TensorProto.BOOL, DType.f8e4m3fn: TensorProto.FLOAT8E4M3FN,
    DType.f8e4m3fnuz: TensorProto.FLOAT8E4M3FNUZ, DType.f8e5m2: TensorProto.FLOAT8E5M2,
    DType.f8e5m2fnuz: TensorProto.FLOAT8E5M2FNUZ, DType.f8e8m0fnu: TensorProto.FLOAT8E8M0,
    DType.c64: TensorProto.COMPLEX64, DType.c128: TensorProto.COMPLEX128,
}
IN_ONNX = frozenset(_TO_ONNX)  # the types with an ONNX element type: all but c32
_FLOATS = frozenset({DType.f64, DType.f32, DType.f16, DType.bf16})
_SIGNED = frozenset({DType.i64, DType.i32, DType.i16, DType.i8})
UNSIGNED = frozenset({DType.u64, DType.u32, DType.u16, DType.u8})
FLOAT8 = frozenset({DType.f8e4m3fn, DType.f8e4m3fnuz, DType.f8e5m2, DType.f8e5m2fnuz,
                    DType.f8e8m0fnu})
# each complex type to its parts' type
COMPLEX = {DType.c32: DType.f16, DType.c64: DType.f32, DType.c128: DType.f64}


class TensorKind(enum.Enum):
    """Where a tensor's value comes from."""

    input = "input"          # given at run time
    parameter = "param"      # learnable weight
    buffer = "buffer"        # non-learnable state that may change at run time (running stats)
    const = "const"          # never changes


@dataclass(frozen=True, slots=True)
class TensorType:
    shape: tuple  # tuple[Dim, ...]
    dtype: DType

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(as_dim(d) for d in self.shape))
        object.__setattr__(self, "dtype", DType.of(self.dtype))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> Dim:
        return product(self.shape)

    @property
    def nbytes(self) -> Dim:
        return as_dim(self.numel * self.dtype.itemsize)

    def with_shape(self, shape) -> "TensorType":
        return TensorType(tuple(shape), self.dtype)

    def with_dtype(self, dtype) -> "TensorType":
        return TensorType(self.shape, dtype)

    def same_as(self, other: "TensorType") -> bool:
        """Equal up to symbolic algebra (``2*b`` equals ``b+b``)."""
        return self.dtype == other.dtype and shapes_equal(self.shape, other.shape)

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(format_dim(d) for d in self.shape)}]"


BACKWARD = "vjp:"         # an origin op so prefixed: a node of a backward pass (tdag.grad)
OPTIMIZER = "optimizer:"  # ... of an optimizer's update (tdag.train_step)
RECOMPUTE = "recompute:"  # ... of a forward value a backward step computes again for itself
REMAT = RECOMPUTE + "remat:"  # ... a copy tdag.remat made: CSE keeps it apart from its original


@dataclass(frozen=True, slots=True)
class Origin:
    """Provenance of a node: the source op, its module path and the source location."""

    op: str = ""
    scope: str = ""
    location: str = ""

    def __str__(self) -> str:
        text = self.op
        if self.scope:
            text += f" @ {self.scope}"
        if self.location:
            text += f" ({self.location})"
        return text

    @property
    def phase(self) -> str:
        """"forward", "recompute", "backward" or "optimizer": the part of a training step
        the node is ("recompute": a forward node that a backward step of a program with
        control flow runs again, since only the values between its steps are kept)."""
        for prefix, phase in _PHASES:
            if self.op.startswith(prefix):
                return phase
        return "forward"


_PHASES = ((BACKWARD, "backward"), (OPTIMIZER, "optimizer"), (RECOMPUTE, "recompute"))


def spec_of(value) -> TensorType:
    """The TensorType of a torch tensor."""
    return TensorType(tuple(value.shape), DType.of(value.dtype))


def fill_of(value) -> "torch.Tensor | None":
    """The single value of a tensor that is one element broadcast to its shape (every stride
    0: what ``torch.full(()).expand(shape)`` gives, as ONNX's ConstantOfShape fills a
    weight), else None. Such a weight costs one element of memory until written out."""
    if value is None or value.numel() <= 1 or any(s != 0 for s in value.stride()):
        return None
    return value.reshape(-1)[0]


def check_dim(value: Dim, what: str) -> Dim:
    dim = as_dim(value)
    if isinstance(dim, int) and dim < 0:
        raise ShapeError(f"{what} must be non-negative, got {format_dim(dim)}")
    return dim
