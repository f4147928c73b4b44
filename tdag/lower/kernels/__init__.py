"""Kernels: placeholder ops that ``tdag.lower`` puts in place of primitive patterns.

Each kernel stands for one fast framework call (``torch.matmul``, ``F.conv2d``, ``Softmax``)
and has, like a primitive, one record: spec, shape rule, reference evaluator, cost, reason,
traits, batch rule and emitters. Costs follow the primitives' convention
(``tdag/refine/cost/report.py``): a contraction costs ``2*M*K*N`` flops as
``torch.utils.flop_counter``; a fused elementwise chain costs what its decomposition costs
per element; bytes are unfused traffic (inputs read, output written once).

Kernel records register in the one registry beside the primitives when ``tdag.lower`` is
imported (``import tdag`` does), so that ``tdag.verify``, ``tdag.run`` and ``tdag.cost``
understand lowered programs.
"""
from tdag.lower.kernels import (  # noqa: F401
    activations,
    backward,
    cnn_backward,
    contraction,
    conv_grad,
    experts,
    fft,
    layout,
    linalg,
    ml,
    ml_classifiers,
    norms,
    optim,
    qlinear,
    quant,
    scans,
    sequence,
    sorting,
    windows,
    writes,
)
