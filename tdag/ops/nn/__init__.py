"""Neural-network compositions (torch.nn.functional's ops): activations, norms, softmax,
attention, convolutions, pooling and resampling, each emitting primitives."""
from tdag.ops.nn.conv import *  # noqa: F401,F403
from tdag.ops.nn.functional import *  # noqa: F401,F403
from tdag.ops.nn.pool import *  # noqa: F401,F403
