"""The ``tdag`` command line: the public API on files.

    tdag show model.pt2                     # the program in tdag's text form
    tdag show model.pt2 -o graph.html       # one self-contained page to browse it
    tdag verify model.tdag
    tdag cost model.pt2 --depth 2 --size batch=8,seq=2048 --device h100-sxm
    tdag cost model.onnx --by op --json     # --csv; --device local measures this machine
    tdag convert model.onnx model.tdag      # .pt2 / .onnx / .tdag  ->  .tdag / .onnx
    tdag extract model.tdag --scope encoder.layer.1 -o block.tdag
    tdag simplify model.tdag -o smaller.tdag
    tdag rebatch model.onnx -o dynamic.onnx # a file exported at one batch size, made symbolic
    tdag grad model.pt2 -o grad.onnx        # the loss and d loss / d every parameter
    tdag train-step model.onnx --optimizer adamw --lr 1e-3 -o step.onnx
    tdag explain model.tdag %42             # why node %42 was or was not lowered
    tdag demo

Inputs: ``.pt2`` (written by ``torch.export.save``), ``.onnx`` and ``.tdag``; grad and
train-step differentiate a scalar output (the first, or ``--loss``) with respect to the
parameters: a module's parameters, an ONNX file's floating-point initializers (not its
Constant nodes). Any failure
prints one line (two where the message is a list: its first entry and how many more) and
exits with status 1, 2 for a usage error; ``--debug`` prints the full traceback instead.
Also ``python -m tdag``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import stat
import sys
import traceback
import warnings

from tqdm import tqdm

import tdag
from tdag.reify import write_onnx
import tdag.lower
from tdag.demo import main as demo_main
from tdag.errors import TdagError
from tdag.ir.program import Call
from tdag.ir.types import TensorKind
from tdag.view.page import write_page
from tdag.lower.cost import lowered_for_cost
from tdag.refine.cost import table as cost_table
from tdag.refine.cost import roofline
from tdag.refine.cost.report import cost as cost_of
from tdag.refine.memory.plot import plot as memory_plot


def _load(path: str, dynamic_batch: bool = False):
    _check_readable(path)
    if path.endswith(".tdag"):
        return tdag.load(path)
    if path.endswith(".pt2"):
        return tdag.from_torch(path, dynamic_batch=dynamic_batch)
    if path.endswith(".onnx"):
        return tdag.from_onnx(path)
    raise TdagError(f"cannot read {path!r}: expected a .tdag, a .pt2 or an .onnx file")


def _check_readable(path: str) -> None:
    """Say plainly what is wrong with the path before a reader turns it into a parse error."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise TdagError(f"no such file: {path!r}") from None
    except OSError as exc:
        raise TdagError(f"cannot read {path!r}: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise TdagError(f"{path!r} is a directory, not a .tdag, .pt2 or .onnx file")
    if not stat.S_ISREG(mode):
        raise TdagError(f"{path!r} is not a regular file")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise TdagError(f"cannot read {path!r}: {exc.strerror}") from None


def _write(prog, path: str) -> None:
    if path.endswith(".tdag"):
        tdag.save(prog, path)
    elif path.endswith(".onnx"):
        write_onnx(tdag.to_onnx(prog), path)
    else:
        raise TdagError(f"cannot write {path!r}: expected a .tdag or an .onnx file")
    print(f"wrote {path}")


def _sizes(pairs: list[str]) -> dict[str, int]:
    """``--size batch=8,seq=2048`` (or the flag repeated) -> {"batch": 8, "seq": 2048}."""
    sizes = {}
    for pair in (p for group in pairs for p in group.split(",") if p):
        name, _, value = pair.partition("=")
        if not name or not value.isdigit():
            raise TdagError(f"--size takes NAME=INT[,NAME=INT...], got {pair!r}")
        sizes[name] = int(value)
    return sizes


def _parser() -> argparse.ArgumentParser:
    # --debug is accepted before and after the command; SUPPRESS keeps a subcommand's unset
    # flag from overwriting ``tdag --debug show ...``'s
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="on failure print the full traceback, and let warnings and "
                             "third-party logs through")
    parser = argparse.ArgumentParser(prog="tdag", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 2)[2], parents=[common])
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_: str, output: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, parents=[common])
        p.add_argument("file", help="a .pt2, .onnx or .tdag file")
        p.add_argument("--dynamic-batch", action="store_true",
                       help="for .pt2 input: make dim 0 of every input symbolic")
        if output:
            p.add_argument("-o", "--output", required=True, help="a .tdag or .onnx file")
        return p

    show = command("show", "print the program in tdag's text form, or write it as a page")
    show.add_argument("-o", "--output", default=None, metavar="FILE.html",
                      help="write one self-contained HTML page (no network needed) to browse "
                           "the program: scopes as groups, colour by flops or bytes, search")
    show.add_argument("--size", action="append", default=[], metavar="NAME=INT",
                      help="with -o: a value for a symbolic dimension in the colours, "
                           "e.g. batch=8 (others count as 1)")
    command("verify", "check the program and report problems")
    _cost_arguments(command("cost", "flops and memory traffic per layer, op, scope or node; "
                            "a roofline estimate with --device"))
    convert = sub.add_parser("convert", help="convert .pt2, .onnx or .tdag to .tdag or .onnx",
                             parents=[common])
    convert.add_argument("file")
    convert.add_argument("output")
    convert.add_argument("--dynamic-batch", action="store_true")
    extract = command("extract", "extract a module scope as a standalone program", True)
    extract.add_argument("--scope", required=True)
    command("simplify", "run the simplification passes", True)
    command("strip-batch", "write the per-sample program", True)
    rebatch = command("rebatch", "give a file exported at one batch size (batch 1: every "
                      "Reshape's shape baked in) a symbolic batch axis", True)
    rebatch.add_argument("--name", default="batch",
                         help="the name of the symbolic batch size (default: batch)")
    _train_arguments(command)
    explain = command("explain", "say which lowering rules looked at a node, and why they did "
                      "or did not fire")
    explain.add_argument("node", help="a node name, e.g. %%42")
    explain.add_argument("--graph", default=None,
                         help="the node's TDAG, where several TDAGs have a node of that name")
    demo = sub.add_parser("demo", help="run the end-to-end demo", parents=[common])
    demo.add_argument("--out", default=None, help="folder for the files the demo writes")
    return parser


def _train_arguments(command) -> None:
    """``grad`` and ``train-step``: the loss output, what to differentiate, the optimizer."""
    loss_help = "the scalar output to differentiate, by name or index (default: the first)"
    grad = command("grad", "the program with the gradient of its loss: outputs the loss and "
                   "grad.<name> per parameter; without -o a one-line summary")
    grad.add_argument("-o", "--output", default=None, help="a .tdag or .onnx file")
    grad.add_argument("--loss", default="0", metavar="NAME_OR_INDEX", help=loss_help)
    grad.add_argument("--wrt", action="extend", nargs="+", default=None, metavar="NAME",
                      help="inputs or weights to differentiate (default: every "
                           "floating-point parameter: a module's parameters, an ONNX file's "
                           "float initializers)")
    step = command("train-step", "one optimizer step as a program: state holds the "
                   "parameters, the optimizer's moments and its step count", True)
    step.add_argument("--loss", default="0", metavar="NAME_OR_INDEX", help=loss_help)
    step.add_argument("--optimizer", required=True, choices=sorted(_OPTIMIZERS))
    step.add_argument("--lr", type=float, default=None, help="learning rate (default 1e-3)")
    step.add_argument("--weight-decay", type=float, default=None,
                      help="default: 0 for sgd, 1e-2 for adamw (torch's defaults)")
    step.add_argument("--momentum", type=float, default=None, help="sgd only (default 0)")
    step.add_argument("--betas", type=float, nargs=2, default=None, metavar=("B1", "B2"),
                      help="adamw only (default 0.9 0.999)")
    step.add_argument("--eps", type=float, default=None, help="adamw only (default 1e-8)")


# each optimizer and the flags it takes (torch.optim's settings, torch's defaults)
_OPTIMIZERS = {"sgd": (tdag.optim.SGD, ("lr", "momentum", "weight_decay")),
               "adamw": (tdag.optim.AdamW, ("lr", "betas", "eps", "weight_decay"))}


def _optimizer(args) -> tdag.optim.Optimizer:
    """The optimizer of ``--optimizer`` with the settings given; a flag of the other
    optimizer is an error rather than silently ignored."""
    cls, takes = _OPTIMIZERS[args.optimizer]
    given = {k: getattr(args, k) for k in ("lr", "momentum", "weight_decay", "betas", "eps")
             if getattr(args, k) is not None}
    wrong = sorted(given.keys() - set(takes))
    if wrong:
        raise TdagError(f"--{wrong[0].replace('_', '-')} is not a setting of {args.optimizer} "
                        f"(it takes {', '.join('--' + t.replace('_', '-') for t in takes)})")
    if "betas" in given:
        given["betas"] = tuple(given["betas"])
    return cls(**given)


def _loss(prog, args) -> str:
    """The name of the output ``--loss`` picks, checked to be one floating-point value here,
    where the error can list the outputs to pick from instead."""
    outputs = prog.main.outputs
    name = args.loss
    if name not in outputs:
        if not name.lstrip("-").isdigit() or not -len(outputs) <= int(name) < len(outputs):
            raise TdagError(f"--loss {name}: {args.file} has no such output (outputs: "
                            f"{', '.join(outputs)}, or an index below {len(outputs)})")
        name = outputs[int(name)]
    types = _output_types(prog)
    kind = types.get(name)
    if kind is not None and not (kind.dtype.is_float and kind.numel == 1):
        listed = ", ".join(f"{o} {t}" for o, t in types.items())
        raise TdagError(f"output {name!r} of {args.file} is {kind}, not a float scalar (a loss): "
                        f"pick one with --loss NAME_OR_INDEX (outputs: {listed})")
    return name


def _output_types(prog) -> dict:
    """The type of each output a Call of the main block computes; a controller's outputs
    are left to grad's own check."""
    types = {}
    for step in prog.main.steps:
        if isinstance(step, Call):
            types.update(zip(step.outputs, prog.graphs[step.graph].output_types))
    return {o: types[o] for o in prog.main.outputs if o in types}


def _check_parameters(prog, args) -> None:
    """Refuse a file with nothing to train here, where the hint can name the flag."""
    if args.command == "grad" and args.wrt:
        return
    if not any(w.kind is TensorKind.parameter and w.type.dtype.is_float
               for g in prog.graphs.values() for w in g.weights.values()):
        hint = "; name inputs to differentiate with --wrt NAME" if args.command == "grad" else ""
        raise TdagError(f"{args.file} has no floating-point parameters{hint}")


def _grad(prog, args) -> None:
    """``tdag grad``: the gradient program written out, or a one-line summary of it."""
    loss = _loss(prog, args)
    _check_parameters(prog, args)
    g = tdag.grad(prog, wrt=args.wrt, output=loss)
    if args.output is not None:
        _write(g, args.output)
        return
    types = {v.name: v.type for v in g.main.inputs}
    for graph in g.graphs.values():
        types.update((n, w.type) for n, w in graph.weights.items())
    count = sum(types[n].numel for n in g.wrt)  # symbolic where an input has a symbolic size
    shown = f"{count:,}" if isinstance(count, int) else str(count)
    names = ", ".join(g.wrt[:4]) + (f", ... {len(g.wrt) - 4} more" if len(g.wrt) > 4 else "")
    print(f"loss {g.output}: {len(g.wrt)} gradient(s) of {shown} value(s) ({names})")


def _train_step(prog, args) -> None:
    loss = _loss(prog, args)
    _check_parameters(prog, args)
    _write(tdag.train_step(prog, _optimizer(args), output=loss), args.output)


def _cost_arguments(cost: argparse.ArgumentParser) -> None:
    cost.add_argument("--by", choices=cost_table.BY, default="layer",
                      help="rows: the module tree (layer, default), op, scope, node, graph, step")
    cost.add_argument("--depth", type=int, default=None, help="levels of the module tree shown")
    cost.add_argument("--size", action="append", default=[], metavar="NAME=INT[,NAME=INT]",
                      help="values for symbolic dimensions, e.g. batch=8,seq=2048")
    cost.add_argument("--sort", choices=["flops", "bytes"], default=None,
                      help="order the rows by flops or bytes (shows each row's share of both)")
    out = cost.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print report.to_dict() as JSON")
    out.add_argument("--csv", action="store_true", help="print the same rows as CSV")
    cost.add_argument("--device", default=None,
                      help=f"a roofline: local (measured here; local:quick for a rough one) or "
                           f"one of {', '.join(roofline.DEVICES)}")
    cost.add_argument("--peak-tflops", type=float, default=None,
                      help="a custom device's peak (with --bandwidth-gbs)")
    cost.add_argument("--bandwidth-gbs", type=float, default=None,
                      help="a custom device's memory bandwidth")
    cost.add_argument("--launch-us", type=float, default=0.0,
                      help="a custom device's cost of issuing one kernel, in microseconds")
    cost.add_argument("--plot", default=None, metavar="FILE.png",
                      help="draw the rows on the device's roofline (needs matplotlib)")
    cost.add_argument("--unlowered", action="store_true",
                      help="cost the program as it stands, op by op, without lowering it")
    cost.add_argument("--memory", action="store_true",
                      help="peak memory as to_torch's module runs it: a table, --json, --plot")


def _cost(prog, args) -> None:
    """``tdag cost``: the report as a table, JSON or CSV; a roofline with a device."""
    if args.memory:
        return _memory(prog, args)
    dev = _device(args)
    if args.plot and dev is None:
        raise TdagError("--plot needs a device: --device NAME or --peak-tflops/--bandwidth-gbs")
    with _progress("lowering", 2) as bar:  # the two long steps of a large model
        lowered = None if args.unlowered else lowered_for_cost(prog)
        bar.update()
        bar.set_description("tdag: costing")
        report = cost_of(prog, lowered)
        bar.update()
    sizes = _sizes(args.size)
    if args.json or args.csv or args.plot:
        data = report.to_dict(args.by, args.depth, sizes, dev, args.sort)
        if args.plot:
            roofline.plot(data, dev, args.plot, cost_table.main_dtype(report))
            print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(data, indent=1))
    elif args.csv:
        print(cost_table.to_csv(data), end="")
    else:
        print(report.table(args.by, args.depth, dev, args.sort, **sizes))


def _memory(prog, args) -> None:
    """``tdag cost --memory``: ``tdag.memory``'s table, JSON, or its curve with --plot."""
    report = tdag.memory(prog, **_sizes(args.size))
    if args.plot:
        memory_plot(report, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.table())


def _device(args) -> roofline.Device | None:
    if (args.peak_tflops is None) != (args.bandwidth_gbs is None):
        raise TdagError("a custom device takes both --peak-tflops and --bandwidth-gbs")
    if args.peak_tflops is not None:
        if args.device is not None:
            raise TdagError("give --device or --peak-tflops/--bandwidth-gbs, not both")
        return roofline.custom(args.peak_tflops, args.bandwidth_gbs, launch_us=args.launch_us)
    if args.device is None:
        return None
    with _progress(f"measuring {args.device}", 1) as bar:  # local takes a few seconds
        dev = roofline.device(args.device)
        bar.update()
    return dev


def _progress(what: str, total: int):
    """A tqdm bar on a terminal's stderr; silent when stderr is piped or captured."""
    return tqdm(total=total, desc=f"tdag: {what}", leave=False,
                disable=not sys.stderr.isatty())


def _run(args) -> int:
    if args.command == "demo":
        return demo_main(args.out)
    with _progress(f"loading {os.path.basename(args.file)}", 1) as bar:
        prog = _load(args.file, args.dynamic_batch)
        bar.update()
    if args.command == "show":
        _show(prog, args)
    elif args.command == "verify":
        tdag.verify(prog)
        print(f"ok: {len(prog.graphs)} TDAG(s), {prog.num_nodes} nodes")
    elif args.command == "cost":
        _cost(prog, args)
    elif args.command == "convert":
        _write(prog, args.output)
    elif args.command == "extract":
        _write(tdag.extract(prog, scope=args.scope), args.output)
    elif args.command == "simplify":
        _write(tdag.simplify(prog), args.output)
    elif args.command == "strip-batch":
        _write(tdag.strip_batch(prog), args.output)
    elif args.command == "rebatch":
        # per sample, then a batch axis 0 again: every size that was the batch is symbolic
        _write(tdag.add_batch(tdag.strip_batch(prog), args.name), args.output)
    elif args.command == "grad":
        _grad(prog, args)
    elif args.command == "train-step":
        _train_step(prog, args)
    elif args.command == "explain":
        print(tdag.lower.explain(prog, args.node, args.graph))
    return 0


def _show(prog, args) -> None:
    """``tdag show``: the text form, or with ``-o`` the HTML page."""
    if args.output is None:
        print(prog)
        return
    if not args.output.endswith((".html", ".htm")):
        raise TdagError(f"show -o writes an HTML page: expected a .html file, got "
                        f"{args.output!r}")
    sizes = _sizes(args.size)
    size = write_page(prog, args.output, os.path.basename(args.file), _page_memory(prog, sizes),
                      **sizes)
    print(f"wrote {args.output} ({size:,} bytes)")


def _page_memory(prog, sizes: dict):
    """The memory report the page highlights, or None where tdag.memory cannot replay the
    program (a while loop with no trip bound): the page shows the rest."""
    try:
        return tdag.memory(prog, **sizes)
    except TdagError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # a usage error exits with status 2, as argparse does
    debug = getattr(args, "debug", False)
    try:
        with contextlib.nullcontext() if debug else _quiet():
            return _run(args)
    except KeyboardInterrupt:
        print("tdag: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `tdag show m.tdag | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:  # the boundary: whatever fails, the user gets a line, not a trace
        if debug:
            traceback.print_exc()
        else:
            print("\n".join(_error_lines(exc)), file=sys.stderr)
        return 1


@contextlib.contextmanager
def _quiet():
    """Silence third-party chatter for the run: torch.export logs whole tracebacks as
    warnings before raising, and torch and onnx warn through ``warnings``; either would bury
    the one-line error. ``--debug`` keeps them."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _error_lines(exc: Exception) -> list[str]:
    """``tdag: error: <first line>``, and for a multi-line message (the onnx checker's, a list
    of unsupported ops) a second line saying how much more --debug shows."""
    lines = [line.strip() for line in _message(exc).splitlines() if line.strip()]
    head, rest = (lines[0], lines[1:]) if lines else (type(exc).__name__, [])
    if head.endswith(":") and rest:  # "3 unsupported op use(s) (a, b):" then one line each
        head = f"{head} {rest.pop(0)}"
    if isinstance(exc, TdagError) and exc.where:
        head = f"{head} [{exc.where}]"
    out = [f"tdag: error: {head}"]
    if rest:
        out.append(f"({len(rest)} more: run with --debug for the full list)")
    return out


def _message(exc: Exception) -> str:
    if isinstance(exc, TdagError):
        return exc.message  # the location goes on the first line, not after the list
    if isinstance(exc, OSError) and exc.strerror:  # the environment: a missing folder, a full disk
        return f"{exc.filename!r}: {exc.strerror}" if exc.filename else exc.strerror
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    what = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return f"internal error: {what} (run with --debug and report it)"


if __name__ == "__main__":
    sys.exit(main())
