"""The operators and methods of a traced Tensor: ``x + y``, ``x == y``, ``x[i]``, ``x @ w``,
``x.reshape(...)``, ``x.sum(axis)``, ``x.T``, each the ``tdag.ops`` function of that name.

``tdag.ops.tensor.Tensor`` holds the data only; ``tdag.ops`` (its ``__init__``) calls
``install`` once, so the class never imports the compositions that import it.
"""
from __future__ import annotations

from tdag.ops import arrays, core
from tdag.ops.tensor import Tensor

# x <op> y -> fn(x, y); == and != compare elementwise (as torch): a mask, never a bool
_BINARY = {
    "__add__": core.add, "__sub__": core.sub, "__mul__": core.mul, "__truediv__": core.div,
    "__floordiv__": core.floor_divide, "__pow__": core.pow, "__matmul__": arrays.matmul,
    "__eq__": core.eq, "__ne__": core.ne, "__lt__": core.lt, "__le__": core.le,
    "__gt__": core.gt, "__ge__": core.ge, "__getitem__": arrays.index,
}
# y <op> x where y is not a Tensor (a Python scalar): fn(y, x)
_REFLECTED = {
    "__radd__": core.add, "__rsub__": core.sub, "__rmul__": core.mul,
    "__rtruediv__": core.div, "__rpow__": core.pow, "__rmatmul__": arrays.matmul,
}
_UNARY = {"__neg__": core.neg, "__abs__": core.abs, "exp": core.exp, "log": core.log}


def _binary(fn):
    return lambda self, other: fn(self, other)


def _reflected(fn):
    return lambda self, other: fn(other, self)


def _unary(fn):
    return lambda self: fn(self)


def reshape(self, *shape): return core.reshape(self, *shape)
def permute(self, *perm): return core.permute(self, *perm)
def transpose(self, a, b): return core.transpose(self, a, b)
def sum(self, axis=None, keepdim=False): return core.sum(self, axis, keepdim)
def mean(self, axis=None, keepdim=False): return arrays.mean(self, axis, keepdim)
def max(self, axis=None, keepdim=False): return core.amax(self, axis, keepdim)
def min(self, axis=None, keepdim=False): return core.amin(self, axis, keepdim)
def astype(self, dtype): return core.cast(self, dtype)


def T(self):
    """All axes reversed (numpy's ``.T``)."""
    return core.permute(self, *reversed(range(self.ndim)))


_METHODS = {"reshape": reshape, "permute": permute, "transpose": transpose, "sum": sum,
            "mean": mean, "max": max, "min": min, "astype": astype, "T": property(T)}


def install(cls: type = Tensor) -> None:
    """Set the operators and methods on ``cls`` (tdag.ops.tensor.Tensor)."""
    methods = {**{name: _binary(fn) for name, fn in _BINARY.items()},
               **{name: _reflected(fn) for name, fn in _REFLECTED.items()},
               **{name: _unary(fn) for name, fn in _UNARY.items()}, **_METHODS}
    for name, method in methods.items():
        if callable(method):  # named as a method of the class in tracebacks and help()
            method.__name__, method.__qualname__ = name, f"{cls.__name__}.{name}"
        setattr(cls, name, method)
