"""``tdag.ops``: the functions a traced program is written with.

Primitives (``permute``, ``group``, ``reduce``, ``exp``, ...), array-API helpers with torch's
broadcasting and promotion (``add``, ``matmul``, ``reshape``, ``concat``, ...), neural-network
ops as compositions (``conv``, ``softmax``, ``layer_norm``, ``attention``, ...) and einops
patterns (``rearrange``, ``einops_reduce``, ``repeat``, ``einsum``). ``reduce`` takes the
primitive's call ``reduce(x, "sum", axes)`` and einops' ``reduce(x, "a b -> a", "sum")``.
"""
from tdag.deinops.arrays import *  # noqa: F401,F403
from tdag.deinops.core import *  # noqa: F401,F403
from tdag.deinops.core import abs, pow, round, slice, sum  # noqa: F401  (shadow builtins)
from tdag.deinops.einops import einsum, rearrange, repeat  # noqa: F401
from tdag.deinops.masking import *  # noqa: F401,F403
from tdag.deinops.einops import reduce as einops_reduce
from tdag.deinops.nn import *  # noqa: F401,F403
from tdag.deinops.trace import buffer, const, param  # noqa: F401
from tdag.deinops.einops import reduce_or_pattern as reduce  # noqa: F401  (last: both calls)
