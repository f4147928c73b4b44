"""The ``tdag`` command line: the public API on files.

    tdag show model.pt2                     # the program in tdag's text form
    tdag verify model.tdag
    tdag cost model.pt2 --by scope --size batch=8
    tdag convert model.onnx model.tdag      # .pt2 / .onnx / .tdag  ->  .tdag / .onnx
    tdag extract model.tdag --scope encoder.layer.1 -o block.tdag
    tdag simplify model.tdag -o smaller.tdag
    tdag explain model.tdag %42             # why node %42 was or was not lowered
    tdag demo

Inputs: ``.pt2`` (written by ``torch.export.save``), ``.onnx`` and ``.tdag``. Errors print
one line and exit with status 1; no traceback.
"""
from __future__ import annotations

import argparse
import os
import sys

import onnx

import tdag
import tdag.lower
from tdag.demo import main as demo_main
from tdag.errors import TdagError


def _load(path: str, dynamic_batch: bool = False):
    if not os.path.isfile(path):
        raise TdagError(f"no such file: {path!r}")
    if path.endswith(".tdag"):
        return tdag.load(path)
    if path.endswith(".pt2"):
        return tdag.from_torch(path, dynamic_batch=dynamic_batch)
    if path.endswith(".onnx"):
        return tdag.from_onnx(path)
    raise TdagError(f"cannot read {path!r}: expected a .tdag, a .pt2 or an .onnx file")


def _write(prog, path: str) -> None:
    if path.endswith(".tdag"):
        tdag.save(prog, path)
    elif path.endswith(".onnx"):
        onnx.save(tdag.to_onnx(prog), path)
    else:
        raise TdagError(f"cannot write {path!r}: expected a .tdag or an .onnx file")
    print(f"wrote {path}")


def _sizes(pairs: list[str]) -> dict[str, int]:
    sizes = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if not value.isdigit():
            raise TdagError(f"--size takes NAME=INT, got {pair!r}")
        sizes[name] = int(value)
    return sizes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tdag", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 2)[2])
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_: str, output: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_)
        p.add_argument("file", help="a .pt2, .onnx or .tdag file")
        p.add_argument("--dynamic-batch", action="store_true",
                       help="for .pt2 input: make dim 0 of every input symbolic")
        if output:
            p.add_argument("-o", "--output", required=True, help="a .tdag or .onnx file")
        return p

    command("show", "print the program in tdag's text form")
    command("verify", "check the program and report problems")
    cost = command("cost", "print flops and memory traffic per primitive or scope")
    cost.add_argument("--by", choices=["op", "scope", "graph", "node"], default="op")
    cost.add_argument("--size", action="append", default=[], metavar="NAME=INT",
                      help="a value for a symbolic dimension, e.g. batch=8")
    convert = sub.add_parser("convert", help="convert .pt2, .onnx or .tdag to .tdag or .onnx")
    convert.add_argument("file")
    convert.add_argument("output")
    convert.add_argument("--dynamic-batch", action="store_true")
    extract = command("extract", "extract a module scope as a standalone program", True)
    extract.add_argument("--scope", required=True)
    command("simplify", "run the simplification passes", True)
    command("strip-batch", "write the per-sample program", True)
    explain = command("explain", "say which lowering rules looked at a node, and why they did "
                      "or did not fire")
    explain.add_argument("node", help="a node name, e.g. %%42")
    explain.add_argument("--graph", default=None,
                         help="the node's TDAG, where several TDAGs have a node of that name")
    demo = sub.add_parser("demo", help="run the end-to-end demo")
    demo.add_argument("--out", default=None, help="folder for the files the demo writes")
    return parser


def _run(args) -> int:
    if args.command == "demo":
        return demo_main(args.out)
    prog = _load(args.file, args.dynamic_batch)
    if args.command == "show":
        print(prog)
    elif args.command == "verify":
        tdag.verify(prog)
        print(f"ok: {len(prog.graphs)} TDAG(s), {prog.num_nodes} nodes")
    elif args.command == "cost":
        print(tdag.cost(prog).table(by=args.by, **_sizes(args.size)))
    elif args.command == "convert":
        _write(prog, args.output)
    elif args.command == "extract":
        _write(tdag.extract(prog, scope=args.scope), args.output)
    elif args.command == "simplify":
        _write(tdag.simplify(prog), args.output)
    elif args.command == "strip-batch":
        _write(tdag.strip_batch(prog), args.output)
    elif args.command == "explain":
        print(tdag.lower.explain(prog, args.node, args.graph))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except TdagError as exc:
        print(f"tdag: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
