"""What a JAX emitter is given (``JaxContext``) and the one table from tdag's dtypes to JAX's.

The records' JAX emitters (``jax=`` in ``tdag/deinops``) never import jax: they take its
namespaces from the context, so ``import tdag`` works without jax installed. This module and
the ``to_jax`` modules are the only ones that import it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tdag.errors import ShapeError, UnsupportedOpError
from tdag.ir.symbols import Dim
from tdag.ir.types import DType

# every DType by the name of its jnp type (float8s included: JAX has them all through
# ml_dtypes) but those of NO_JAX; tests/reify/test_to_jax.py checks that the two cover
# every member
_JNP_NAMES = {
    DType.f64: "float64", DType.f32: "float32", DType.f16: "float16", DType.bf16: "bfloat16",
    DType.i64: "int64", DType.i32: "int32", DType.i16: "int16", DType.i8: "int8",
    DType.u64: "uint64", DType.u32: "uint32", DType.u16: "uint16", DType.u8: "uint8",
    DType.bool: "bool_", DType.f8e4m3fn: "float8_e4m3fn", DType.f8e4m3fnuz: "float8_e4m3fnuz",
    DType.f8e5m2: "float8_e5m2", DType.f8e5m2fnuz: "float8_e5m2fnuz",
    DType.f8e8m0fnu: "float8_e8m0fnu", DType.c64: "complex64", DType.c128: "complex128",
}


# the DTypes JAX has no type for, and why
NO_JAX = {DType.c32: "JAX has no complex32 (jax.numpy refuses ml_dtypes' complex32)"}


def jax_dtype(dtype: DType) -> np.dtype:
    """The numpy dtype JAX uses for ``dtype``."""
    if dtype in NO_JAX:
        raise UnsupportedOpError(f"to_jax: dtype {dtype.value} has no JAX type: {NO_JAX[dtype]}")
    name = _JNP_NAMES.get(dtype)
    if name is None or not hasattr(jnp, name):
        raise UnsupportedOpError(f"to_jax: dtype {dtype.value} has no JAX type "
                                 f"(tdag/reify/jax/context.py maps each DType)")
    return np.dtype(getattr(jnp, name))


def tdag_dtype(dtype, what: str) -> DType:
    """The DType of a numpy/JAX dtype, or a ShapeError naming ``what`` carries it."""
    found = _FROM_NUMPY.get(np.dtype(dtype))
    if found is None:
        raise ShapeError(f"{what} has dtype {dtype}, which tdag has no type for")
    return found


_FROM_NUMPY = {np.dtype(getattr(jnp, name)): d for d, name in _JNP_NAMES.items()
               if hasattr(jnp, name)}


def needs_x64(dtypes) -> bool:
    """Whether any of ``dtypes`` is 64-bit: JAX then must run with ``jax_enable_x64``, or it
    silently computes in 32 bits."""
    return any(d.itemsize == 8 for d in dtypes)


@dataclass(frozen=True)
class JaxContext:
    """What an emitter sees at trace time: jax's namespaces, and the symbol bindings of the
    run (each symbolic size is a Python int under jit: jit specialises on shapes)."""

    resolve: Callable[[Dim], int]
    jnp = jnp
    lax = lax
    nn = jax.nn
    vjp = staticmethod(jax.vjp)  # a kernel whose closed form is a JAX primitive's transpose

    def shape(self, dims) -> tuple[int, ...]:
        return tuple(self.resolve(d) for d in dims)

    @staticmethod
    def dtype(dtype: DType) -> np.dtype:
        return jax_dtype(dtype)
