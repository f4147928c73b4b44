"""The AdamW update as one kernel: the composition ``tdag.optim.AdamW`` writes is some
sixteen elementwise passes per parameter (each subtraction a negation and an add, each
scalar broadcast); torch's own single-tensor AdamW makes about eight, in place.

The kernel's one output stacks the new parameter, first and second moments on a new
leading axis (``ops.adamw_update``); the update reads them back with selects, which the
torch emitter turns into views, so torch writes each result once into its slice of the
stack with ``lerp``, ``addcmul`` and ``addcdiv``. ONNX and JAX run the composition,
joined by one Concat / stack.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tdag import ops
from tdag.deinops.codegen import literal
from tdag.deinops.primitive import Cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.batching import Refuse
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import Dim
from tdag.ir.types import DType, TensorType
from tdag.lower.kernels.common import same_shape

FLOPS_PER_ELEMENT = 13  # what the composition costs per element, the scalar work aside


@dataclass(frozen=True, slots=True)
class AdamWUpdate:
    """torch.optim.AdamW's hyperparameters (decoupled weight decay)."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float


def _shape(spec: AdamWUpdate, ins) -> TensorType:
    param, step = ins[0], ins[4]
    if not param.dtype.is_float:
        raise ShapeError(f"adamw_update: needs a float parameter, got {param}")
    for t in ins[1:4]:
        same_shape("adamw_update", t, param.shape, param.dtype)
    if step.rank != 0 or step.dtype is not DType.f32:
        raise ShapeError(f"adamw_update: the step count should be f32[], got {step}")
    return param.with_shape((3,) + tuple(param.shape))


def adamw_step(param, grad, exp_avg, exp_avg_sq, step, lr: float, beta1: float,
               beta2: float, eps: float, weight_decay: float) -> torch.Tensor:
    """[new parameter, exp_avg, exp_avg_sq] stacked, each written once into its slice as
    torch.optim.AdamW's single-tensor loop writes it, the bias corrections in Python floats
    as torch's are (the composition's float32 scalars differ from them in the last bits)."""
    out = param.new_empty((3,) + param.shape)
    new_param, new_avg, new_sq = out.unbind(0)
    _update(param, grad, exp_avg, exp_avg_sq, step, (lr, beta1, beta2, eps, weight_decay),
            (new_param, new_avg, new_sq))
    return out


def adamw_step_(param, grad, exp_avg, exp_avg_sq, step, lr: float, beta1: float,
                beta2: float, eps: float, weight_decay: float) -> "Updated":
    """``adamw_step`` writing over the parameter and its moments, as torch's AdamW updates
    its tensors: the generated code calls it where nothing reads the three after it, so a
    step holds no second copy of them."""
    _update(param, grad, exp_avg, exp_avg_sq, step, (lr, beta1, beta2, eps, weight_decay),
            (param, exp_avg, exp_avg_sq))
    return Updated((param, exp_avg, exp_avg_sq))


class Updated(tuple):
    """The three tensors an in-place update wrote, read by the selects the update's lowering
    puts after the kernel (``select(0, k)`` of the stack it stands for)."""

    def select(self, axis: int, index: int) -> torch.Tensor:
        return self[index]


def _update(param, grad, exp_avg, exp_avg_sq, step, hyper, into) -> None:
    """One AdamW step written into ``into`` (new parameter, exp_avg, exp_avg_sq), which may
    be the inputs themselves: each input is read before its own result is written."""
    lr, beta1, beta2, eps, weight_decay = hyper
    new_param, new_avg, new_sq = into
    count = float(step) + 1.0
    correction1, correction2 = 1.0 - beta1 ** count, 1.0 - beta2 ** count
    torch.mul(param, 1.0 - lr * weight_decay, out=new_param)
    torch.lerp(exp_avg, grad, 1.0 - beta1, out=new_avg)
    torch.mul(exp_avg_sq, beta2, out=new_sq).addcmul_(grad, grad, value=1.0 - beta2)
    denom = new_sq.sqrt().div_(correction2 ** 0.5).add_(eps)
    new_param.addcdiv_(new_avg, denom, value=-lr / correction1)


def _evaluate(spec: AdamWUpdate, xs, resolve):
    return adamw_step(*xs, spec.lr, spec.beta1, spec.beta2, spec.eps, spec.weight_decay)


def _cost(spec: AdamWUpdate, ins, out: TensorType) -> Cost:
    return traffic(ins, out, FLOPS_PER_ELEMENT * ins[0].numel)


def _torch(node, a, code):
    s = node.spec
    hyper = ", ".join(literal(float(v)) for v in (s.lr, s.beta1, s.beta2, s.eps,
                                                 s.weight_decay))
    in_place = code.written_over(node)
    return f"_rt.adamw_step{'_' if in_place else ''}({', '.join(a)}, {hyper})"


def overwritten(node, code) -> tuple[str, ...]:
    """The parameter and moments an update node writes over in the generated torch code
    (``adamw_step_``), in the order of the stack it stands for; () where it writes a new
    stack: the code may not write over one of them (``code.may_overwrite``: a later node
    reads it, or it is not the step's own state), or the result is read as more than its
    slices (an output, another op)."""
    state = (node.inputs[0], node.inputs[2], node.inputs[3])
    readers = code.ctx.readers(node.name)
    if len(set(state)) == 3 and all(code.may_overwrite(node, x) for x in state) and \
            readers and node.name not in code.ctx.graph.outputs and \
            all(r.op is Op.select and r.spec.axis == 0 for r in readers):
        return state
    return ()


def _onnx(node, ins, g, cx):
    """The composition with ONNX's Sub and Sqrt (exact as tdag's neg + add and pow 0.5
    are), the three results joined by one Concat."""
    s, (param, grad, exp_avg, exp_avg_sq, step) = node.spec, ins

    def op(kind, *xs):
        return g.node(kind, [g.const(x, DType.f32) if isinstance(x, float) else x for x in xs])
    count = op("Add", step, 1.0)
    param = op("Mul", param, 1.0 - s.lr * s.weight_decay)
    exp_avg = op("Add", exp_avg, op("Mul", op("Sub", grad, exp_avg), 1.0 - s.beta1))
    exp_avg_sq = op("Add", op("Mul", exp_avg_sq, s.beta2),
                    op("Mul", op("Mul", grad, grad), 1.0 - s.beta2))
    correction1 = op("Sub", 1.0, op("Pow", float(s.beta1), count))
    correction2 = op("Sub", 1.0, op("Pow", float(s.beta2), count))
    denom = op("Add", op("Div", op("Sqrt", exp_avg_sq), op("Sqrt", correction2)), float(s.eps))
    param = op("Add", param, op("Mul", op("Div", exp_avg, denom),
                                op("Div", float(-s.lr), correction1)))
    return g.node("Concat", [g.node("Unsqueeze", [t, g.const([0])])
                             for t in (param, exp_avg, exp_avg_sq)], axis=0)


def _jax(node, a, cx):
    """The composition, operation for operation."""
    s, (param, grad, exp_avg, exp_avg_sq, step) = node.spec, a
    jnp = cx.jnp
    count = step + 1.0
    param = param * (1.0 - s.lr * s.weight_decay)
    exp_avg = exp_avg + (grad - exp_avg) * (1.0 - s.beta1)
    exp_avg_sq = exp_avg_sq * s.beta2 + grad * grad * (1.0 - s.beta2)
    correction1 = 1.0 - jnp.power(jnp.asarray(s.beta1, step.dtype), count)
    correction2 = 1.0 - jnp.power(jnp.asarray(s.beta2, step.dtype), count)
    denom = jnp.sqrt(exp_avg_sq) / jnp.sqrt(correction2) + s.eps
    param = param + exp_avg / denom * (-s.lr / correction1)
    return jnp.stack([param, exp_avg, exp_avg_sq])


def _workspace(spec: AdamWUpdate, ins, out: TensorType, contiguous) -> Dim:
    """``_rt.adamw_step``: ``denom = new_sq.sqrt()``, one parameter's size, freed at return."""
    return ins[0].nbytes


primitive(Op.adamw_update, AdamWUpdate, 5, _shape, _evaluate, _cost,
          "the composition makes about sixteen elementwise passes over each parameter (a "
          "subtraction is a negation and an add, a scalar is broadcast first); torch's "
          "lerp/addcmul/addcdiv make about eight",
          traits=Trait.KERNEL,
          batch=Refuse("updates one parameter with a step count shared by all of them"),
          torch=_torch, onnx=_onnx, jax=_jax, workspace=_workspace, in_place=overwritten,
          decompose=lambda s, p, g, m, v, step: ops.adamw_update(
              p, g, m, v, step, s.lr, s.beta1, s.beta2, s.eps, s.weight_decay))
