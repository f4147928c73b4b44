"""The ``tdag`` command line: the public API on files (.tdag now; .onnx and .pt2 as the
canonicalizers land)."""
from __future__ import annotations

import argparse
import sys

from tdag.errors import TdagError


def _load(path: str):
    import tdag
    if path.endswith(".tdag"):
        return tdag.load(path)
    if path.endswith(".onnx") and hasattr(tdag, "from_onnx"):
        return tdag.from_onnx(path)
    if path.endswith(".pt2") and hasattr(tdag, "from_torch"):
        return tdag.from_torch(path)
    raise TdagError(f"cannot read {path!r}: expected a .tdag, .onnx or .pt2 file")


def main(argv: list[str] | None = None) -> int:
    import tdag
    parser = argparse.ArgumentParser(prog="tdag", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in [("show", "print the program in tdag's text form"),
                        ("verify", "check the program and report problems"),
                        ("cost", "print flops and memory traffic per primitive and scope")]:
        p = sub.add_parser(name, help=help_)
        p.add_argument("file")
        if name == "cost":
            p.add_argument("--by", choices=["op", "scope"], default="op")
    demo = sub.add_parser("demo", help="run the end-to-end demo")
    demo.add_argument("--out", default=None, help="folder for the files the demo writes")
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from tdag.demo import main as demo_main
            return demo_main(args.out)
        prog = _load(args.file)
        if args.command == "show":
            print(prog)
        elif args.command == "verify":
            tdag.verify(prog)
            print(f"ok: {len(prog.graphs)} TDAG(s), {prog.num_nodes} nodes")
        elif args.command == "cost":
            print(tdag.cost(prog).table(by=args.by))
    except TdagError as exc:
        print(f"tdag: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
