"""What a fused program moves: a linear-time model of kernels over one TDAG.

The unfused figure (every primitive reads its inputs and writes its output) overstates the
traffic of a lowered program by the size of every broadcast product and view. This model
groups compute nodes into kernels the way a lowering or a fusing compiler would:

- views are free: ``Trait.VIEW`` nodes, and ``Trait.REMAP`` ones (pad: an index remap with a
  constant default: conv padding, concat), alias their source. Reading through a view reads its
  *extent*: the source once through a broadcast (repeat) or sliding windows (unfold), only
  the taken part through a slice or select;
- an elementwise node fuses into the kernel of one of its producers (its epilogue);
- a reduction fuses into the kernel of its producer when that kernel has no reduction yet,
  so multiply + reduce-sum (every contraction: matmul, conv, einsum) is one kernel, and an
  overlap-add (fold) is the epilogue of the contraction before it;
- fusion never goes through a broadcasting view (that would recompute the producer once per
  copy), and a kernel stops taking members once another kernel has read its output (so
  kernels form a DAG: no cycle of kernels waiting on each other).

A kernel reads each distinct (source, extent) from memory once and writes the outputs that
another kernel or the graph's caller reads. For a single matmul or convolution this is
exactly inputs + weights + output.
"""
from __future__ import annotations

from dataclasses import dataclass

from tdag.deinops.reduce import ReduceKind
from tdag.ir.graph import TDAG
from tdag.ir.op import Op
from tdag.ir.record import Trait, has, ops_with
from tdag.ir.symbols import Dim, as_dim


def _free_views() -> frozenset:
    """Ops that alias their source inside a fused kernel."""
    return ops_with(Trait.VIEW | Trait.REMAP)


class Sizes(dict):
    """TensorType -> bytes, computed once per distinct type (symbolic products are slow)."""

    def __missing__(self, t):
        self[t] = t.nbytes
        return self[t]


@dataclass(frozen=True, slots=True)
class Access:
    """How a name is read through its chain of views."""

    source: str          # the nearest non-view definition (input, weight or compute node)
    extent: Dim          # bytes of the source a reader touches
    expanded: bool       # some view in the chain duplicates elements (repeat, unfold)
    inserted: bool       # some view in the chain adds an axis (unsqueeze, repeat, unfold)


def view_accesses(graph: TDAG, sizes: Sizes) -> dict[str, Access]:
    """The access of every name in ``graph``, following views back to their sources."""
    access: dict[str, Access] = {}
    for value in graph.inputs:
        access[value.name] = Access(value.name, sizes[value.type], False, False)
    for name, weight in graph.weights.items():
        access[name] = Access(name, sizes[weight.type], False, False)
    free_views = _free_views()
    for node in graph.nodes:
        if node.op not in free_views:
            access[node.name] = Access(node.name, sizes[node.type], False, False)
            continue
        base = access[node.inputs[0]]
        extent = base.extent
        if has(node.op, Trait.PICKS) and not base.expanded:
            extent = sizes[node.type]  # only the taken part is read
        # an expanding view reads source elements more than once: fusing through it would
        # recompute; an inserting one gives the tensor an axis its source does not index
        access[node.name] = Access(base.source, extent,
                                   base.expanded or has(node.op, Trait.EXPANDING),
                                   base.inserted or has(node.op, Trait.INSERTING))
    return access


@dataclass
class _Kernel:
    has_reduce: bool = False  # holds a reduction (or another op that is not pointwise)
    open: bool = True        # no other kernel has read its output yet


def fused_traffic(graph: TDAG, access: dict[str, Access], sizes: Sizes) -> tuple[dict, dict]:
    """Per node: the bytes its kernel reads on its behalf and the bytes it writes."""
    free_views = _free_views()
    producer = {n.name: n for n in graph.nodes if n.op not in free_views}
    kernel_of: dict[str, int] = {}
    kernels: list[_Kernel] = []
    seen: set = set()
    reads: dict[str, Dim] = {}
    written: set[str] = set()
    for node in graph.nodes:
        if node.op in free_views:
            continue
        k = _join(node, access, producer, kernel_of, kernels)
        if k is None:
            k = len(kernels)
            kernels.append(_Kernel())
        kernel_of[node.name] = k
        kernels[k].has_reduce |= not has(node.op, Trait.POINTWISE)
        for name in node.inputs:
            acc = access[name]
            if kernel_of.get(acc.source) == k:
                continue  # produced inside this kernel: stays in registers
            if acc.source in producer:
                kernels[kernel_of[acc.source]].open = False
                written.add(acc.source)
            extent = sizes[node.type] if has(node.op, Trait.PICKS) and name == node.inputs[0] \
                else acc.extent  # a gather reads only the rows it picks
            if (k, acc.source, extent) not in seen:
                seen.add((k, acc.source, extent))
                reads[node.name] = reads.get(node.name, 0) + extent
    for name in graph.outputs:
        if access[name].source in producer:
            written.add(access[name].source)
    writes = {name: sizes[producer[name].type] for name in written}
    return reads, writes


def _join(node, access, producer, kernel_of, kernels) -> int | None:
    """The kernel ``node`` fuses into, or None when it starts one."""
    if has(node.op, Trait.POINTWISE):  # an epilogue of one of its producers
        candidates = node.inputs
    elif has(node.op, Trait.ACCUMULATES):  # sums what its producer's kernel computes
        candidates = node.inputs[:1]
    else:
        return None
    for name in candidates:
        acc = access[name]
        if acc.expanded or acc.source not in producer:
            continue
        k = kernel_of[acc.source]
        if not kernels[k].open:
            continue
        if node.op is Op.reduce and kernels[k].has_reduce:
            continue
        return k
    return None


def contraction_flops(graph: TDAG, access: dict[str, Access]) -> dict[str, Dim]:
    """Per multiply node that is a contraction: 2 * (elements of the broadcast product).

    A contraction is a multiply whose operands both reach it through an axis-inserting view
    (each indexes an axis the other does not: matmul, conv windows, einsum), feeding a
    reduce-sum or an overlap-add (fold: a transposed convolution whose channels are not
    summed, the input gradient of a depthwise conv) directly or through views. This is
    torch.utils.flop_counter's 2*M*K*N. (``x * x`` summed, a variance, is not: neither
    operand gains an axis.)
    """
    summed = set()
    for node in graph.nodes:
        if node.op is Op.fold or node.op is Op.reduce and node.spec.kind is ReduceKind.sum:
            summed.add(access[node.inputs[0]].source)
    result = {}
    for node in graph.nodes:
        if node.op is not Op.multiply or node.name not in summed:
            continue
        operands = [access[name] for name in node.inputs]
        if all(a.inserted for a in operands):
            result[node.name] = as_dim(2 * node.type.numel)
    return result
