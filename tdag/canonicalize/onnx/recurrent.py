"""ONNX RNN, GRU and LSTM as tdag Loop controllers.

The layer becomes three steps. Before the loop (in the current segment): the input
projection of every time step at once, ``X W^T + Wb`` (one matmul, as torch runs it), the
recurrent weights transposed, the initial states. The loop runs a cell TDAG once per time
step, its trip count the sequence length (a dim of X, symbolic where X's is), so a
Program reads any length and does not grow with it. Both directions of a bidirectional
layer step in the same iteration: the forward one at time ``i``, the reverse one at
``seq-1-i``, read by a gather with the index ``-1-i`` (wrapped like numpy's take), never a
reversed copy of the input. After the loop: the reverse direction's stacked outputs are put
back in time order, and the directions joined into ONNX's ``Y [seq, dirs, batch, hidden]``
(``[batch, seq, dirs, hidden]`` with layout=1).

``sequence_lens`` masks as ONNX specifies: past its length a batch row keeps its state and
outputs zeros (the reverse direction starts from its initial state at the row's last valid
step). Gate orders are ONNX's: GRU z, r, h; LSTM i, o, f, c; peepholes i, o, f.
"""
from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import helper

from tdag import ops
from tdag.canonicalize.onnx.load import scope_of
from tdag.canonicalize.common.segments import Boundary
from tdag.ops.builder import Builder
from tdag.ops.tensor import Tensor
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.graph import Value
from tdag.ir.program import Block, Call, Loop
from tdag.ir.types import DType, Origin, TensorType
from tdag.refine.dataflow import prune

RECURRENT_OPS = ("RNN", "GRU", "LSTM")


@dataclass(frozen=True)
class _Kind:
    gates: int  # blocks of `hidden` rows in W and R
    states: int  # 1 (h) or 2 (h, c)
    activations: tuple  # the defaults, one direction's worth


_KINDS = {"RNN": _Kind(1, 1, ("Tanh",)), "GRU": _Kind(3, 1, ("Sigmoid", "Tanh")),
          "LSTM": _Kind(4, 2, ("Sigmoid", "Tanh", "Tanh"))}

# name -> (function of (x, alpha, beta), default alpha, default beta); None: not read
_ACTIVATIONS = {
    "relu": (lambda x, a, b: ops.relu(x), None, None),
    "tanh": (lambda x, a, b: ops.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: ops.sigmoid(x), None, None),
    "affine": (lambda x, a, b: ops.add(ops.mul(x, a), b), 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: ops.leaky_relu(x, a), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: ops.where(ops.gt(x, a), x, 0.0), 1.0, None),
    "scaledtanh": (lambda x, a, b: ops.mul(ops.tanh(ops.mul(x, b)), a), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: ops.clamp(ops.add(ops.mul(x, a), b), 0.0, 1.0), 0.2, 0.5),
    "elu": (lambda x, a, b: ops.elu(x, a), 1.0, None),
    "softsign": (lambda x, a, b: ops.div(x, ops.add(ops.abs(x), 1.0)), None, None),
    "softplus": (lambda x, a, b: ops.softplus(x), None, None),
}


@dataclass(frozen=True)
class _Act:
    """One activation function with its alpha and beta."""

    name: str
    alpha: float | None
    beta: float | None

    def __call__(self, x: Tensor, clip: float | None) -> Tensor:
        if clip is not None:  # ONNX clips the input of the activations
            x = ops.clamp(x, -clip, clip)
        return _ACTIVATIONS[self.name][0](x, self.alpha, self.beta)


@dataclass(frozen=True)
class _Spec:
    """The node's attributes, checked."""

    op: str
    directions: tuple  # of bools: reverse?
    layout: int
    hidden: int | None
    clip: float | None
    acts: tuple  # per direction, a tuple of _Act
    linear_before_reset: bool
    input_forget: bool


def _spec(node: onnx.NodeProto, opset: int) -> _Spec:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if opset < 7:
        raise UnsupportedOpError(f"{node.op_type}: opset {opset} (tdag reads version 7 on)")
    direction = attrs.get("direction", b"forward").decode()
    directions = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}
    if direction not in directions:
        raise InvalidModelError(f"{node.op_type}: direction {direction!r}")
    layout = attrs.get("layout", 0)
    if layout not in (0, 1):
        raise InvalidModelError(f"{node.op_type}: layout {layout!r} (0 or 1)")
    kind, dirs = _KINDS[node.op_type], directions[direction]
    acts = _activations(node, attrs, kind, len(dirs))
    clip = attrs.get("clip")
    if clip is not None and not clip > 0:
        raise InvalidModelError(f"{node.op_type}: clip {clip} must be positive")
    flags = [attrs.get(k, 0) for k in ("linear_before_reset", "input_forget")]
    if any(f not in (0, 1) for f in flags):
        raise InvalidModelError(f"{node.op_type}: linear_before_reset and input_forget "
                                f"are 0 or 1, got {flags}")
    return _Spec(node.op_type, dirs, layout, attrs.get("hidden_size"), clip, acts,
                 bool(flags[0]), bool(flags[1]))


def _activations(node, attrs, kind: _Kind, n_dirs: int) -> tuple:
    """Per direction, the activation functions; alphas and betas are consumed in order by
    the functions that read them (as onnxruntime does), defaults where the list ends."""
    names = [n.decode() for n in attrs.get("activations", [])] or list(kind.activations) * n_dirs
    if len(names) != len(kind.activations) * n_dirs:
        raise InvalidModelError(f"{node.op_type}: {len(names)} activations for {n_dirs} "
                                f"direction(s) of {len(kind.activations)}")
    alphas, betas = list(attrs.get("activation_alpha", [])), list(attrs.get("activation_beta", []))
    acts = []
    for name in names:
        entry = _ACTIVATIONS.get(name.lower())
        if entry is None:
            raise UnsupportedOpError(f"{node.op_type}: the activation {name!r}")
        _, a, b = entry
        a = (alphas.pop(0) if alphas else a) if a is not None else None
        b = (betas.pop(0) if betas else b) if b is not None else None
        acts.append(_Act(name.lower(), a, b))
    k = len(kind.activations)
    return tuple(tuple(acts[d * k:(d + 1) * k]) for d in range(n_dirs))


# -- the importer's side ---------------------------------------------------------------------


def convert_recurrent(importer, node: onnx.NodeProto, index: int) -> None:
    """RNN / GRU / LSTM (X, W, R, [B], [sequence_lens], [initial_h], [initial_c], [P])
    -> (Y, Y_h[, Y_c]) as one Loop over the time steps."""
    spec, kind = _spec(node, importer.opset), _KINDS[node.op_type]
    origin = Origin(op=f"onnx.{node.op_type}", scope=scope_of(node.name), location=node.name)
    names = list(node.input) + [""] * (8 - len(node.input))
    with importer.builder.active(), importer.builder.scope(origin):
        args = [importer.as_tensor(importer.read(n)) if n else None for n in names]
        pre = _prepare(spec, kind, *args)
    base = next(o for o in node.output if o) if any(node.output) else node.name or "rnn"
    keys = {}
    for what, value in pre.items():
        keys[what] = f"{base}__{what}"
        importer.env[keys[what]] = value
    importer.close(importer.live_after(index, set(keys.values())))
    want_y = bool(node.output and node.output[0])
    loop = _loop(importer, spec, kind, keys, base, want_y, origin)
    importer.steps.append(loop)
    with importer.builder.active(), importer.builder.scope(origin):
        outs = _finish(importer, spec, kind, base, want_y)
    for name, value in zip(node.output, outs):
        if name:
            importer.env[name] = value
            importer.check_declared(name, value)


def _prepare(spec: _Spec, kind: _Kind, x, w, r, b, lens, h0, c0, p) -> dict:
    """The tensors the loop reads, per direction d: ``x{d}`` (every step's input projection,
    [seq, batch, gates*hidden]), ``r{d}`` (R^T), ``rb{d}`` (GRU's recurrent bias), ``p{d}``
    (peepholes), and the initial states ``h{d}`` / ``c{d}``; ``lens`` where given."""
    if spec.layout:  # [batch, seq, ...] -> [seq, batch, ...]
        x = ops.permute(x, 1, 0, 2)
        h0 = ops.permute(h0, 1, 0, 2) if h0 is not None else None
        c0 = ops.permute(c0, 1, 0, 2) if c0 is not None else None
    hidden = r.shape[-1]
    n_dirs, width = len(spec.directions), kind.gates * hidden
    if spec.hidden is not None and spec.hidden != hidden:
        raise InvalidModelError(f"{spec.op}: hidden_size {spec.hidden} but R is {r.type}")
    if w.ndim != 3 or w.shape[0] != n_dirs or w.shape[1] != width or x.ndim != 3:
        raise InvalidModelError(f"{spec.op}: W is {w.type} and X {x.type}, for {n_dirs} "
                                f"direction(s) of {kind.gates} gates of {hidden}")
    batch = x.shape[1]
    out = {}
    for d in range(n_dirs):
        proj = ops.matmul(x, ops.permute(ops.select(w, 0, d), 1, 0))
        if b is not None:
            bias = ops.select(b, 0, d)
            wb, rb = ops.slice(bias, 0, 0, width), ops.slice(bias, 0, width, 2 * width)
            if spec.op == "GRU":  # the h gate's recurrent bias sits inside the reset
                out[f"rb{d}"] = rb
                proj = ops.add(proj, wb)
            else:
                proj = ops.add(proj, ops.add(wb, rb))
        out[f"x{d}"] = proj
        out[f"r{d}"] = ops.permute(ops.select(r, 0, d), 1, 0)
        if p is not None:
            out[f"p{d}"] = ops.select(p, 0, d)
        for key, init in (("h", h0), ("c", c0))[:kind.states]:
            out[f"{key}{d}"] = ops.select(init, 0, d) if init is not None else \
                ops.zeros((batch, hidden), x.dtype)
    if lens is not None:
        out["lens"] = ops.cast(lens, DType.i64)
    return out


def _loop(importer, spec: _Spec, kind: _Kind, keys: dict, base: str, want_y: bool,
          origin: Origin) -> Loop:
    """The Loop over time: carried states first, then the values passed through."""
    n_dirs = len(spec.directions)
    states = [f"{k}{d}" for d in range(n_dirs) for k in "hc"[:kind.states]]
    passed = [k for k in keys if k not in states]
    env = importer.env
    seq = env[keys["x0"]].type.shape[0]
    builder = Builder()
    i_name = importer.names(f"{base}__step")
    inputs = [Value(i_name, TensorType((), DType.i64))] + \
        [Value(importer.names(f"{base}__in_{k}"), env[keys[k]].type) for k in states + passed]
    tensors = {k: builder.input(v.name, v.type) for k, v in zip(["i"] + states + passed, inputs)}
    with builder.active(), builder.scope(origin):
        new, ys = _cell_step(spec, kind, tensors)
    outs = [new[k] for k in states] + (ys if want_y else [])
    graph = prune(builder.build(outs))
    gname = importer.shared.graph_name(f"{importer.prefix}_{spec.op.lower()}")
    importer.shared.graphs[gname] = graph
    cell_outs = tuple(importer.names(f"{base}__next_{k}") for k in states) + \
        tuple(importer.names(f"{base}__y{d}") for d in range(n_dirs) if want_y)
    call = Call(gname, tuple(v.name for v in graph.inputs), cell_outs)
    body_outs = cell_outs[:len(states)] + tuple(v.name for v in inputs[1 + len(states):]) + \
        cell_outs[len(states):]
    body = Block(tuple(inputs), (call,), body_outs)
    loop_outs = tuple(importer.names(f"{base}__last_{k}") for k in states + passed) + \
        tuple(importer.names(f"{base}__ys{d}") for d in range(n_dirs) if want_y)
    loop = Loop(tuple(env[keys[k]].name for k in states + passed), body, loop_outs,
                count=seq, scanned=n_dirs if want_y else 0)
    types = [env[keys[k]].type for k in states + passed] + \
        [TensorType((seq, *t.shape), t.dtype) for t in graph.output_types[len(states):]]
    for k, name, t in zip(states + passed + [f"ys{d}" for d in range(n_dirs)], loop_outs,
                          types):
        env[f"{base}__out_{k}"] = Boundary(name, t)
    return loop


def _cell_step(spec: _Spec, kind: _Kind, t: dict):
    """One time step of every direction: the new states and the outputs y."""
    new, ys = {}, []
    lens = t.get("lens")
    for d, reverse in enumerate(spec.directions):
        i = t["i"]
        step = ops.sub(ops.neg(i), 1) if reverse else i  # -1-i wraps to seq-1-i
        x = ops.gather(t[f"x{d}"], step, 0, wrap=reverse)
        h, c = t[f"h{d}"], t.get(f"c{d}")
        acts = spec.acts[d]
        if spec.op == "RNN":
            h2, c2 = acts[0](ops.add(x, ops.matmul(h, t[f"r{d}"])), spec.clip), None
        elif spec.op == "GRU":
            h2, c2 = _gru(spec, acts, x, h, t[f"r{d}"], t.get(f"rb{d}")), None
        else:
            h2, c2 = _lstm(spec, acts, x, h, c, t[f"r{d}"], t.get(f"p{d}"))
        y = h2
        if lens is not None:  # past a row's length: hold the state, output zeros
            time = ops.sub(ops.sub(ops.dim_tensor(t[f"x{d}"].shape[0]), 1), i) if reverse \
                else i
            valid = ops.unsqueeze(ops.lt(time, lens), 1)
            h2, y = ops.where(valid, h2, h), ops.where(valid, h2, 0.0)
            c2 = ops.where(valid, c2, c) if c2 is not None else None
        new[f"h{d}"] = h2
        if c2 is not None:
            new[f"c{d}"] = c2
        ys.append(y)
    return new, ys


def _gates(x: Tensor, n: int) -> list:
    hidden = x.shape[-1] // n
    return [ops.slice(x, -1, k * hidden, (k + 1) * hidden) for k in range(n)]


def _gru(spec: _Spec, acts, x, h, r_t, rb) -> Tensor:
    f, g = acts
    xz, xr, xh = _gates(x, 3)
    hr = ops.matmul(h, r_t)
    if rb is not None:
        hr = ops.add(hr, rb)
    hz, hrr, hh = _gates(hr, 3)
    z = f(ops.add(xz, hz), spec.clip)
    r = f(ops.add(xr, hrr), spec.clip)
    if spec.linear_before_reset:
        cand = ops.add(xh, ops.mul(r, hh))
    else:  # (r * h) R_h^T + Rb_h
        rh = _gates(r_t, 3)[2]
        cand = ops.add(xh, ops.matmul(ops.mul(r, h), rh))
        if rb is not None:
            cand = ops.add(cand, _gates(rb, 3)[2])
    cand = g(cand, spec.clip)
    return ops.add(ops.mul(ops.sub(1.0, z), cand), ops.mul(z, h))


def _lstm(spec: _Spec, acts, x, h, c, r_t, p):
    f, g, hact = acts
    gi, go, gf, gc = _gates(ops.add(x, ops.matmul(h, r_t)), 4)
    pi, po, pf = _gates(p, 3) if p is not None else (None, None, None)
    i = f(ops.add(gi, ops.mul(pi, c)) if p is not None else gi, spec.clip)
    if spec.input_forget:  # coupled gates: forget what is let in
        fg = ops.sub(1.0, i)
    else:
        fg = f(ops.add(gf, ops.mul(pf, c)) if p is not None else gf, spec.clip)
    c2 = ops.add(ops.mul(fg, c), ops.mul(i, g(gc, spec.clip)))
    o = f(ops.add(go, ops.mul(po, c2)) if p is not None else go, spec.clip)
    return ops.mul(o, hact(c2, None)), c2


def _finish(importer, spec: _Spec, kind: _Kind, base: str, want_y: bool) -> list:
    """Y, Y_h (and Y_c) in ONNX's layout from the loop's outputs."""
    n_dirs = len(spec.directions)

    def out(k):
        return importer.read(f"{base}__out_{k}")

    results = [None]
    if want_y:
        ys = []
        for d, reverse in enumerate(spec.directions):
            y = out(f"ys{d}")
            if reverse:  # step i made time seq-1-i: back in time order
                seq = y.shape[0]
                y = ops.gather(y, ops.sub(-1, ops.iota(seq)), 0)
            ys.append(y)
        y = ops.stack(ys, 1)  # [seq, dirs, batch, hidden]
        results[0] = ops.permute(y, 2, 0, 1, 3) if spec.layout else y
    for k in "hc"[:kind.states]:
        last = ops.stack([out(f"{k}{d}") for d in range(n_dirs)], 0)
        results.append(ops.permute(last, 1, 0, 2) if spec.layout else last)
    return results
