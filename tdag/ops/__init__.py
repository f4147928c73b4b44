"""``tdag.ops``: the functions a traced program is written with.

Primitives (``permute``, ``group``, ``reduce``, ``exp``, ...), array-API helpers with torch's
broadcasting and promotion (``add``, ``matmul``, ``reshape``, ``concat``, ...), neural-network
ops as compositions (``conv``, ``softmax``, ``layer_norm``, ``attention``, ...) and einops
patterns (``rearrange``, ``einops_reduce``, ``repeat``, ``einsum``). ``reduce`` takes the
primitive's call ``reduce(x, "sum", axes)`` and einops' ``reduce(x, "a b -> a", "sum")``.
"""
from tdag.ops.arrays import *  # noqa: F401,F403
from tdag.ops.core import *  # noqa: F401,F403
from tdag.ops.core import abs, pow, round, slice, sum  # noqa: F401  (shadow builtins)
from tdag.ops.einops import einsum, rearrange, repeat  # noqa: F401
from tdag.ops.masking import *  # noqa: F401,F403
from tdag.ops.einops import reduce as einops_reduce
from tdag.ops.nn.functional import *  # noqa: F401,F403
from tdag.ops.trace import buffer, const, param  # noqa: F401
from tdag.ops.einops import reduce_or_pattern as reduce  # noqa: F401  (last: both calls)
