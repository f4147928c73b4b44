"""Programs the refine tests share: torch models through from_torch (captured once per test
run) and small traced programs with module scopes."""
from __future__ import annotations

import functools

import torch

import tdag
from tdag import ops
from tdag.ops.builder import active_builder
from tdag.ir.types import Origin

from support import torch_models as M


def _models():
    g = torch.Generator().manual_seed(0)
    return {
        "mlp": (M.MLP, lambda b: (torch.randn(b, 16, generator=g),)),
        "cnn": (M.CNN, lambda b: (torch.randn(b, 3, 16, 16, generator=g),)),
        "encoder": (M.Encoder, lambda b: (torch.randn(b, 6, 32, generator=g),
                                          torch.arange(6).expand(b, 6)
                                          >= 6 - torch.arange(b)[:, None])),
        "decoder": (M.Decoder, lambda b: (torch.randint(0, 64, (b, 7), generator=g),
                                          (torch.arange(7).expand(b, 7)
                                           < 7 - torch.arange(b)[:, None]).long())),
        "tagger": (M.Tagger, lambda b: (torch.randint(0, 50, (b, 5), generator=g),)),
        "unet": (M.UNetBlock, lambda b: (torch.randn(b, 4, 8, 8, generator=g),)),
    }


MODELS = tuple(_models())


@functools.lru_cache(maxsize=None)
def model(name: str):
    """(torch module, a function batch -> example args)."""
    cls, args = _models()[name]
    torch.manual_seed(0)
    return cls().eval(), args


@functools.lru_cache(maxsize=None)
def from_torch(name: str, dynamic: bool = True) -> tdag.Program:
    from tdag.canonicalize import from_torch as convert
    module, args = model(name)
    return convert(module, args(2), dynamic_batch=dynamic)


def outputs(prog, *args) -> tuple:
    out = tdag.run(prog, *args)
    return out if isinstance(out, tuple) else (out,)


def close(a: tuple, b: tuple, atol: float = 1e-5) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.allclose(x, y, atol=atol)
                                    for x, y in zip(a, b))


def scoped_mlp(width: int = 16, depth: int = 3, batch="b", seed: int = 0) -> tdag.Program:
    """x + tanh(linear(x)) per layer, each layer (residual included) in scope
    ``encoder.layer.{i}``, then a softmax in scope ``head``."""
    g = torch.Generator().manual_seed(seed)
    weights = [(torch.randn(width, width, generator=g) / width ** 0.5,
                torch.randn(width, generator=g)) for _ in range(depth)]

    def fn(x):
        builder = active_builder()
        for i, (w, bias) in enumerate(weights):
            with builder.scope(Origin("aten.linear", f"encoder.layer.{i}")):
                h = ops.tanh(ops.linear(x, ops.param(f"encoder.layer.{i}.weight", w),
                                        ops.param(f"encoder.layer.{i}.bias", bias)))
                x = x + h
        with builder.scope(Origin("aten.sum", "head")):
            return ops.softmax(x, -1)

    return tdag.trace(fn, tdag.TensorSpec((batch, width)))
