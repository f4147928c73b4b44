"""Tracing a JAX function into a flat list of equations, with tdag names for its values.

``jax.make_jaxpr`` gives a ClosedJaxpr whose equations may call other jaxprs (``jit``,
``custom_jvp_call``, ``remat``, ...). Those calls are inlined here (a custom derivative
keeps its primal function), so the walker sees one flat SSA list in which only control
flow (``cond``, ``while``, ``scan``) still holds sub-jaxprs. Every value becomes a Ref (a
fresh object per definition: one jaxpr inlined twice defines its values twice) or a Lit.

Arguments: an array is an input; any other pytree (a flax ``variables`` dict) is a tree of
weights named by their dotted tree path (``params.Dense_0.kernel``): in a flax variables
dict, parameters under ``params`` and buffers under any other collection (``batch_stats``);
in any other tree, parameters. Arrays the function closes over are consts.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

import numpy as np
import torch

from tdag.errors import CaptureError, UnsupportedOpError
from tdag.ir.symbols import as_dim, symbol
from tdag.ir.types import DType, TensorKind, TensorType

# call-like primitives whose body is inlined, and the param holding it
INLINED = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr",
           "core_call": "call_jaxpr", "custom_jvp_call": "call_jaxpr",
           "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
           "checkpoint": "jaxpr", "remat": "jaxpr", "remat2": "jaxpr"}
# the most elements an equation of constants may give and still be folded at import
FOLDED_ELEMENTS = 4096


class Ref:
    """One value of the flattened program (identity is the value)."""

    __slots__ = ("aval",)

    def __init__(self, aval):
        self.aval = aval

    def __repr__(self) -> str:
        return f"Ref({self.aval})"


@dataclass(frozen=True, eq=False)
class Lit:
    """A literal operand: a scalar (or small array) written into the equation."""

    value: np.ndarray


@dataclass(frozen=True, eq=False)
class Held:
    """A weight or const: a parameter, a buffer or an array the function closed over."""

    name: str
    kind: TensorKind
    value: torch.Tensor


@dataclass
class Eqn:
    """One equation of the flat list: the primitive, its params, operands and results."""

    prim: str
    params: dict
    ins: list
    outs: list
    where: str  # the source line (jax's summarize of source_info)
    scope: str = ""  # the name stack (flax module path)


@dataclass
class Traced:
    """The flat program: its inputs (Refs, with tdag names), weights, equations, outputs."""

    inputs: list  # [(name, Ref)]
    held: dict  # Ref -> Held
    eqns: list
    outs: list
    out_tree: object  # the pytree structure of the function's result


def dtype_of(aval) -> DType:
    try:
        return DType.of(np.dtype(aval.dtype).name)
    except Exception as exc:
        raise UnsupportedOpError(f"the dtype {aval.dtype} has no tdag equivalent") from exc


def type_of(aval) -> TensorType:
    return TensorType(tuple(dim_of(d) for d in aval.shape), dtype_of(aval))


def dim_of(d):
    """An int, or a jax symbolic dimension as a tdag Dim (its text is a polynomial)."""
    if isinstance(d, (int, np.integer)):
        return int(d)
    text = str(d)
    if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", text):
        return symbol(text)
    import sympy  # noqa: PLC0415  (only symbolic shapes need it)
    names = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text))
    return as_dim(sympy.sympify(text, locals={n: symbol(n) for n in names}))


def as_torch(value) -> torch.Tensor:
    array = np.asarray(value)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.array(array, copy=True))


def source_line(source_info) -> str:
    from jax._src import source_info_util  # noqa: PLC0415  (jax is optional: tdag imports without it)
    try:
        return source_info_util.summarize(source_info)
    except Exception:  # an equation jax made itself
        return ""


def scope_of(source_info, outer: str = "") -> str:
    """The module path of an equation: its name stack (flax pushes module names) under the
    scope of the call it was inlined from; entries that are not names (an einsum's
    equation) are left out."""
    stack = str(getattr(source_info, "name_stack", "") or "")
    parts = [p for p in outer.split(".") + stack.split("/")
             if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", p)]
    return ".".join(parts)


def trace(fn, example_args, dynamic_shapes) -> Traced:
    """Trace ``fn`` on the example arguments and flatten its jaxpr."""
    try:
        import jax  # noqa: PLC0415  (tdag imports without jax; from_jax needs it)
    except ImportError as exc:
        raise CaptureError("from_jax needs jax: pip install 'tdag[jax]'") from exc
    names = _arg_names(fn, len(example_args))
    inputs = [i for i, arg in enumerate(example_args) if _is_array(arg)]
    trees = [i for i in range(len(example_args)) if i not in inputs]
    abstract = [_abstract(example_args[i], (dynamic_shapes or {}).get(i), names[i])
                for i in inputs]

    # weight trees are traced as arguments (not consts) so that leaves keep their paths
    def split_call(weights, *arrays):
        full = list(example_args)
        for i, value in [*zip(trees, weights), *zip(inputs, arrays)]:
            full[i] = value
        return fn(*full)

    weights = [example_args[i] for i in trees]
    try:
        closed, out_shape = jax.make_jaxpr(split_call, return_shape=True)(weights, *abstract)
    except Exception as exc:
        raise CaptureError(f"jax.make_jaxpr failed on the function: {type(exc).__name__}: "
                           f"{exc}") from exc
    traced = Traced([], {}, [], [], jax.tree_util.tree_structure(out_shape))
    env = _bind_arguments(traced, closed.jaxpr, [(names[i], example_args[i]) for i in trees],
                          [names[i] for i in inputs])
    flattener = _Flattener(traced)
    flattener.bind_consts(env, closed.jaxpr.constvars, closed.consts)
    eqns = flattener.eqns(closed.jaxpr.eqns, env)
    traced.outs = [_operand(env, v) for v in closed.jaxpr.outvars]
    traced.eqns = live_eqns(eqns, traced.outs)
    return traced


def _bind_arguments(traced: Traced, jaxpr, trees: list, input_names: list) -> dict:
    """Refs for the jaxpr's inputs: a Held weight per leaf of each (name, tree), then the
    inputs, in order."""
    import jax  # noqa: PLC0415  (jax is optional: tdag imports without it)
    leaves = [(path, leaf, name, _is_flax_variables(tree)) for name, tree in trees
              for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]
    if len(jaxpr.invars) != len(leaves) + len(input_names):
        raise CaptureError("the traced function's arguments do not match its example "
                           "arguments")
    env: dict = {}
    for var, (path, leaf, name, flax) in zip(jaxpr.invars, leaves):
        ref = env[var] = Ref(var.aval)
        traced.held[ref] = Held(_weight_name(path, name), _kind_of(path, flax),
                                as_torch(np.asarray(leaf, dtype=var.aval.dtype)))
    for var, name in zip(jaxpr.invars[len(leaves):], input_names):
        env[var] = Ref(var.aval)
        traced.inputs.append((name, env[var]))
    return env


def _is_array(arg) -> bool:
    import jax  # noqa: PLC0415  (jax is optional: tdag imports without it)
    return isinstance(arg, (np.ndarray, jax.Array, jax.ShapeDtypeStruct, np.generic))


def _abstract(arg, axes: dict | None, name: str):
    """The argument as a ShapeDtypeStruct; ``axes`` ({axis: symbol}) makes sizes symbolic."""
    import jax  # noqa: PLC0415  (jax is optional: tdag imports without it)
    shape = list(np.shape(arg))
    if axes:
        from jax import export  # noqa: PLC0415  (jax is optional: tdag imports without it)
        for axis, sym in axes.items():
            shape[axis] = sym
        try:
            shape = export.symbolic_shape(", ".join(str(d) for d in shape))
        except Exception as exc:
            raise CaptureError(f"dynamic_shapes for input {name!r}: {exc}") from exc
    return jax.ShapeDtypeStruct(tuple(shape), np.asarray(arg).dtype if not isinstance(
        arg, jax.ShapeDtypeStruct) else arg.dtype)


def _arg_names(fn, count: int) -> list[str]:
    """The parameter names of ``fn`` where Python tells them, else ``arg{i}``."""
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = params[:count] + [f"arg{i}" for i in range(len(params), count)]
    return [n if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", n) else f"arg{i}"
            for i, n in enumerate(names)]


def _path_parts(path) -> list[str]:
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return [re.sub(r"[^A-Za-z0-9_:]", "_", p) for p in parts]


def _weight_name(path, arg_name: str) -> str:
    """The dotted tree path (``params.Dense_0.kernel``); under the argument's name where the
    tree is not keyed by name at its root (a list of arrays)."""
    parts = _path_parts(path)
    if not parts or not re.match(r"[A-Za-z_]", parts[0]):
        parts = [arg_name, *parts]
    return ".".join(parts)


def _is_flax_variables(tree) -> bool:
    """A flax ``variables`` dict: keyed by collections, ``params`` among them."""
    return hasattr(tree, "keys") and "params" in tree.keys()


def _kind_of(path, flax: bool) -> TensorKind:
    """Parameters, except the leaves of a flax collection other than ``params``
    (``batch_stats``, ``cache``: state the model reads, not learns)."""
    if flax and _path_parts(path)[:1] != ["params"]:
        return TensorKind.buffer
    return TensorKind.parameter


def _operand(env: dict, var):
    from jax._src import core  # noqa: PLC0415  (jax is optional: tdag imports without it)
    if isinstance(var, core.Literal):
        return Lit(np.asarray(var.val, dtype=var.aval.dtype))
    return env[var]


class _Flattener:
    """Inlines call-like equations into one list (renaming each inlined value afresh)."""

    def __init__(self, traced: Traced):
        self.traced = traced
        self.n_consts = 0

    def bind_consts(self, env: dict, constvars, consts) -> None:
        for var, value in zip(constvars, consts):
            array = np.asarray(value)
            if array.ndim == 0:
                env[var] = Lit(array)
                continue
            ref = env[var] = Ref(var.aval)
            self.traced.held[ref] = Held(f"const{self.n_consts}", TensorKind.const,
                                         as_torch(array))
            self.n_consts += 1

    def eqns(self, eqns, env: dict, outer: tuple[str, str] = ("", "")) -> list:
        """The flat equations; ``outer`` is the (source line, scope) of the call they were
        inlined from (an equation inside jax's own functions has no line of the user's)."""
        from jax._src import core  # noqa: PLC0415  (jax is optional: tdag imports without it)
        out = []
        for eqn in eqns:
            name = eqn.primitive.name
            where = source_line(eqn.source_info) or outer[0]
            scope = scope_of(eqn.source_info, outer[1])
            ins = [_operand(env, v) for v in eqn.invars]
            if name in INLINED and INLINED[name] in eqn.params:
                inner = eqn.params[INLINED[name]]
                jaxpr, consts = (inner.jaxpr, inner.consts) if hasattr(inner, "consts") \
                    else (inner, [])
                sub = {}
                self.bind_consts(sub, jaxpr.constvars, consts)
                sub.update(zip(jaxpr.invars, ins[:len(jaxpr.invars)]))
                out += self.eqns(jaxpr.eqns, sub, (where, scope))
                for var, inner_out in zip(eqn.outvars, jaxpr.outvars):
                    if not isinstance(var, core.DropVar):
                        env[var] = _operand(sub, inner_out)
                continue
            folded = self.folded(eqn, ins)
            if folded is not None:
                for var, value in zip(eqn.outvars, folded):
                    if not isinstance(var, core.DropVar):
                        self.bind_consts(env, [var], [value])
                continue
            outs = []
            for var in eqn.outvars:
                ref = Ref(var.aval)
                if not isinstance(var, core.DropVar):
                    env[var] = ref
                outs.append(ref)
            out.append(Eqn(name, dict(eqn.params), ins, outs, where, scope))
        return out


    def folded(self, eqn, ins: list) -> list | None:
        """The outputs of an equation whose operands are all constants, computed by jax at
        import, as XLA folds constants when it compiles; None to keep the equation. Only
        small results are folded (a weight-sized constant stays a computation), and never
        an equation holding a sub-jaxpr. This is where jnp.fft's ``norm="ortho"`` factor
        goes: jax writes it as the square root of a product of complex lengths, a
        reduction tdag's IR has no complex form of."""
        if any(_holds_jaxpr(v) for v in eqn.params.values()) or eqn.effects:
            return None
        avals = [v.aval for v in (*eqn.invars, *eqn.outvars)]
        if not all(isinstance(a.dtype, np.dtype)  # not a PRNG key
                   and all(isinstance(d, int) for d in a.shape) for a in avals):  # static
            return None
        if sum(int(np.prod(v.aval.shape)) for v in eqn.outvars) > FOLDED_ELEMENTS:
            return None
        values = [self.constant(x) for x in ins]
        if any(v is None for v in values):
            return None
        outs = eqn.primitive.bind(*values, **eqn.params)
        return [np.asarray(o) for o in (outs if eqn.primitive.multiple_results else [outs])]

    def constant(self, operand) -> np.ndarray | None:
        if isinstance(operand, Lit):
            return operand.value
        held = self.traced.held.get(operand)
        if held is None or held.kind is not TensorKind.const \
                or held.value.dtype == torch.bfloat16:  # numpy has no bfloat16
            return None
        return held.value.numpy()


def _holds_jaxpr(param) -> bool:
    if isinstance(param, (tuple, list)):
        return any(_holds_jaxpr(p) for p in param)
    return hasattr(param, "eqns") or hasattr(param, "jaxpr")


def flatten_closed(closed_jaxpr, ins: list, traced: Traced, outer: Eqn) -> tuple[list, list]:
    """A control-flow body (a ClosedJaxpr) on the operands ``ins``: (eqns, outs); ``outer``
    is the control-flow equation (its line and scope are the body's where it has none)."""
    flattener = _Flattener(traced)
    flattener.n_consts = sum(1 for h in traced.held.values() if h.kind is TensorKind.const)
    env: dict = {}
    jaxpr = closed_jaxpr.jaxpr
    flattener.bind_consts(env, jaxpr.constvars, closed_jaxpr.consts)
    env.update(zip(jaxpr.invars, ins))
    eqns = flattener.eqns(jaxpr.eqns, env, (outer.where, outer.scope))
    outs = [_operand(env, v) for v in jaxpr.outvars]
    return live_eqns(eqns, outs), outs


def live_eqns(eqns: list, outs: list) -> list:
    """The equations some output depends on. Flax computes RNG keys for initializers that
    inference never calls (``nn.RNN``'s carry): dead code, of types tdag has no use for."""
    live = {x for x in outs if isinstance(x, Ref)}
    kept = []
    for eqn in reversed(eqns):
        if any(r in live for r in eqn.outs):
            kept.append(eqn)
            live.update(x for x in eqn.ins if isinstance(x, Ref))
    return kept[::-1]
