"""Reverse-mode differentiation as an IR -> IR transform: ``grad`` (Program level) over
``joint_graph`` (one TDAG, each node's ``vjp`` rule from its record), and the training step
built on it (``train_step`` with the optimizers of ``tdag.optim``)."""
from tdag.refine.grad import optim
from tdag.refine.grad.program import GRAD_PREFIX, GradProgram, grad
from tdag.refine.grad.reverse import BACKWARD, GradError, joint_graph
from tdag.refine.grad.train import OPTIMIZER, train_step

__all__ = ["BACKWARD", "GRAD_PREFIX", "GradError", "GradProgram", "OPTIMIZER", "grad",
           "joint_graph", "optim", "train_step"]
