"""Linear layers on oneDNN's packed weights: what inference runtimes do once per weight.

``F.linear`` hands MKL's sgemm the weight as it is stored, to be packed again on every
call; oneDNN's matmul on the weight laid out once in its blocked format
(``torch.ops.mkldnn._reorder_linear_weight``) runs the transformer shapes of
benchmarks/reify_speed.py 6-13% faster on one thread (CPU time, 260 rows of 256 -> 1024:
1.39 vs 1.61 ms; 128 rows of 256 -> 256: 177 vs 188 us). So the reified module keeps, per
call site, the packed copy of its weight (``PackedWeights``, one per module: the weights'
memory once more) and calls ``linear``, which repacks a weight written since
(``load_state_dict``, an optimizer step: torch bumps the tensor's version) and falls back
to ``F.linear`` wherever the packed kernel would be wrong or unsupported: autograd
recording (it has no derivative), another device or dtype, oneDNN switched off, functorch
or fake tensors (vmap, torch.export and torch.compile tracing).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tdag.ir.symbols import shape_is_static
from tdag.ir.types import DType

# weights below this many elements (the tagger's 128 x 9 classifier: 21 vs 26 us) run
# faster unpacked
PACK_MIN = 1 << 16


def packable(shape: tuple, dtype: DType) -> bool:
    """Whether the code generator routes a linear layer on a weight of ``shape`` here."""
    return dtype is DType.f32 and len(shape) == 2 and shape_is_static(shape) and \
        int(shape[0]) * int(shape[1]) >= PACK_MIN


class PackedWeights:
    """A module's packed weights, one slot per linear call site of its code: the site's
    weight as (address, shape, strides, version), the weight itself (so no other tensor
    takes its address while the slot holds it) and its packed copy. A site keeps one copy,
    so a weight replaced by a new tensor does not leave its old copy behind. Copies of the
    module (deepcopy, pickle) start empty: the packed tensors are opaque to both."""

    def __init__(self):
        self.slots: dict[str, tuple] = {}

    def __deepcopy__(self, memo) -> PackedWeights:
        return PackedWeights()

    def __reduce__(self):
        return PackedWeights, ()

    def get(self, site: str, w: torch.Tensor) -> torch.Tensor:
        key = (w.data_ptr(), tuple(w.shape), w.stride(), w._version)
        slot = self.slots.get(site)
        if slot is None or slot[0] != key:
            packed = torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), None)
            slot = self.slots[site] = (key, w, packed)
        return slot[2]


def _dense(t: torch.Tensor) -> bool:
    """A dense float32 CPU tensor, not a functorch wrapper (vmap, grad) nor a fake tensor."""
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu" and \
        t.dtype == torch.float32 and t.layout == torch.strided and \
        not torch._C._functorch.is_functorch_wrapped_tensor(t)


def _packs(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> bool:
    """Whether ``linear`` may run on the packed copy: nothing records autograd, no compiler
    traces, and the weight is not an inference tensor (whose version torch does not count,
    so a write to it would go unseen)."""
    tensors = (x, w) if b is None else (x, w, b)
    if torch.compiler.is_compiling() or x.dim() < 2 or not torch.backends.mkldnn.is_available() \
            or not torch.backends.mkldnn.enabled:  # off by the user's torch.backends flags
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    return all(_dense(t) for t in tensors) and not w.is_inference()


def linear(packed: PackedWeights, site: str, x: torch.Tensor, w: torch.Tensor,
           b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)``, on ``w``'s packed copy where that is safe."""
    if not _packs(x, w, b):
        return F.linear(x, w, b)
    return torch.ops.mkldnn._linear_pointwise(x, packed.get(site, w), b, "none", [], "")
