"""Matrix functions: the exponential by scaling and squaring (Higham's scheme, which torch
and SciPy use) with a Taylor polynomial of degree 18 evaluated by Paterson-Stockmeyer (8
products); A is scaled by 2^-s until ||A||_1 <= 1/2, where the truncation error is under
0.5^19 / 19! ~ 1e-23, then squared s times. s is read from the data, so the graph holds
MAX_SQUARINGS guarded squarings: a norm past 2^MAX_SQUARINGS overflows float32 anyway."""
from __future__ import annotations

import math

from tdag.ops import core
from tdag.ops.arrays import matmul
from tdag.ops.linalg.common import batch_eye, static_size
from tdag.ops.tensor import Tensor

DEGREE = 18
MAX_SQUARINGS = 40  # ||A||_1 up to 2^40: exp of that overflows float32


def matrix_exp(a: Tensor) -> Tensor:
    n = static_size(a, "matrix_exp")
    if n == 0:
        return a
    norm = core.amax(core.sum(core.abs(a), -2), -1)  # ||A||_1, the largest column sum
    s = core.clamp(core.ceil(core.div(core.log(core.maximum(norm, 1e-30)), math.log(2.0))),
                   0.0, float(MAX_SQUARINGS))
    s = core.add(s, 1.0)  # ||A / 2^s|| <= 1/2
    scaled = core.mul(a, core.unsqueeze(core.unsqueeze(core.pow(2.0, core.neg(s)), -1), -1))
    x = _taylor(scaled, n)
    for i in range(MAX_SQUARINGS + 1):
        x = core.where(core.unsqueeze(core.unsqueeze(core.gt(s, float(i)), -1), -1),
                       matmul(x, x), x)
    return x


def _taylor(b: Tensor, n: int) -> Tensor:
    """sum_k b^k / k! for k <= DEGREE, Paterson-Stockmeyer with blocks of 4 powers."""
    eye = batch_eye(b, n)
    powers = [eye, b]
    for _ in range(3):
        powers.append(matmul(powers[-1], b))
    b4 = matmul(powers[2], powers[2])
    result = None
    for block in range(DEGREE // 4, -1, -1):
        terms = [core.mul(powers[i], 1.0 / math.factorial(4 * block + i))
                 for i in range(4) if 4 * block + i <= DEGREE]
        part = terms[0]
        for term in terms[1:]:
            part = core.add(part, term)
        result = part if result is None else core.add(part, matmul(result, b4))
    return result
