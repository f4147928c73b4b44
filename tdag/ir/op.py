"""The op enum. Each member is one primitive; its rules live in ``tdag/deinops``.

Ops are grouped into families so that one rule (shape, cost, a rewrite) covers a family.
"""
from __future__ import annotations

import enum


class Op(enum.Enum):
    # movement: the deconstructed einops and their mirrors
    permute = "permute"
    group = "group"
    ungroup = "ungroup"
    squeeze = "squeeze"
    unsqueeze = "unsqueeze"
    slice = "slice"
    pad = "pad"
    select = "select"
    repeat = "repeat"
    unfold = "unfold"
    fold = "fold"
    # reduction
    reduce = "reduce"
    # elementwise unary
    neg = "neg"
    reciprocal = "reciprocal"
    exp = "exp"
    log = "log"
    sin = "sin"
    cos = "cos"
    tan = "tan"
    asin = "asin"
    acos = "acos"
    atan = "atan"
    sinh = "sinh"
    cosh = "cosh"
    tanh = "tanh"
    asinh = "asinh"
    acosh = "acosh"
    atanh = "atanh"
    erf = "erf"
    erfinv = "erfinv"
    sign = "sign"
    # elementwise binary
    add = "add"
    multiply = "multiply"
    divide = "divide"
    pow = "pow"
    # elementwise, beyond exact compositions
    where = "where"
    compare = "compare"
    cast = "cast"
    # indexing and generators
    gather = "gather"
    iota = "iota"
    # kernels (placeholders made by tdag.lower): one fast framework call each; their rules
    # live in tdag/lower/kernels.py and register when tdag.lower is imported
    einsum = "einsum"
    conv = "conv"
    conv_transpose = "conv_transpose"
    max_pool = "max_pool"
    avg_pool = "avg_pool"
    resize = "resize"
    softmax = "softmax"
    log_softmax = "log_softmax"
    layer_norm = "layer_norm"
    group_norm = "group_norm"
    batch_norm = "batch_norm"
    rms_norm = "rms_norm"
    attention = "attention"
    lstm = "lstm"
    gelu = "gelu"
    silu = "silu"
    sigmoid = "sigmoid"
    relu = "relu"
    clamp = "clamp"
    hardswish = "hardswish"
    reshape = "reshape"
    expand = "expand"
    concat = "concat"


class Family:
    """Op families: a rule written for a family covers every member."""

    MOVEMENT = frozenset({Op.permute, Op.group, Op.ungroup, Op.squeeze, Op.unsqueeze, Op.slice,
                          Op.pad, Op.select, Op.repeat, Op.unfold, Op.fold})
    # views: no data moves when a framework runs them (strided views)
    VIEW = frozenset({Op.permute, Op.group, Op.ungroup, Op.squeeze, Op.unsqueeze, Op.slice,
                      Op.select, Op.repeat, Op.unfold})
    UNARY = frozenset({Op.neg, Op.reciprocal, Op.exp, Op.log, Op.sin, Op.cos, Op.tan, Op.asin,
                       Op.acos, Op.atan, Op.sinh, Op.cosh, Op.tanh, Op.asinh, Op.acosh,
                       Op.atanh, Op.erf, Op.erfinv, Op.sign})
    BINARY = frozenset({Op.add, Op.multiply, Op.divide, Op.pow})
    ELEMENTWISE = UNARY | BINARY | frozenset({Op.where, Op.compare, Op.cast})
    # placeholders for fused framework kernels (tdag.lower); not primitives
    KERNEL = frozenset({Op.einsum, Op.conv, Op.conv_transpose, Op.max_pool, Op.avg_pool,
                        Op.resize,
                        Op.softmax, Op.log_softmax, Op.layer_norm, Op.group_norm,
                        Op.batch_norm, Op.rms_norm, Op.attention, Op.lstm, Op.gelu, Op.silu,
                        Op.sigmoid, Op.relu, Op.clamp, Op.hardswish, Op.reshape, Op.expand,
                        Op.concat})
