"""A real signal's full spectrum -> one ``torch.fft.fft`` of the real tensor.

    concat(h, conj(gather(h, [m .. 1], a)), a), h = fft[r2c](x, a, n)  -> fft_of_real(x, a, n)

The composition is ``tdag.ops.full_spectrum`` (ATen's ``_fft_r2c`` with onesided=False),
checked node for node against the kernel's decomposition as the rule meets it: its concat
and broadcast already the movement pass's kernels (that pass runs in an earlier round).
"""
from __future__ import annotations

from functools import lru_cache

from tdag.deinops.fft import FftKind
from tdag.ir.graph import TDAG, Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule, RuleSet, rewrite
from tdag.ir.symbols import is_static
from tdag.lower import movement
from tdag.lower.kernels.fft import FftOfReal
from tdag.lower.match import kernel_template, matches_kernel


def full_spectrum_rule(node: Node, ctx: Context):
    """concat(r2c half, its mirrored conjugates) -> fft_of_real(x)"""
    half = ctx.made(node.inputs[0], Op.fft) if len(node.inputs) == 2 else None
    if half is None or half.spec.kind is not FftKind.r2c or not is_static(half.spec.n):
        return NoMatch("not the concat of an r2c transform and its mirror")
    s = half.spec
    spec = FftOfReal(s.axis, int(s.n), s.norm)
    if not matches_kernel(ctx, node, Op.fft_of_real, spec, (half.inputs[0],), _template):
        return NoMatch("its second half is not the r2c half's mirrored conjugates")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.fft_of_real, spec, half.inputs[0]))


@lru_cache(maxsize=64)
def _template(op: Op, spec, types) -> TDAG:
    """The decomposition with its pads + add a concat and its broadcast an expand, as the
    movement pass leaves them before this rule sees the graph."""
    return rewrite(kernel_template(op, spec, types), RuleSet(movement.RULES))[0]


RULES = (
    Rule(Op.concat, full_spectrum_rule),  # concat(h, conj(mirror(h))) -> torch.fft.fft(x)
)
