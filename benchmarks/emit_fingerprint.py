"""Fingerprints of what tdag makes of a fixed set of models, to check that a refactoring
changed no behaviour: the printed program, its lowered form, the generated torch source, the
emitted ONNX bytes and the cost totals, each as a short sha256. Run it at two commits and
compare the lines (``diff``): equal lines mean the two trees capture, lower, cost and emit
these models identically.

    python benchmarks/emit_fingerprint.py > after.txt
    git stash; python benchmarks/emit_fingerprint.py > before.txt; git stash pop
    diff before.txt after.txt

The models: the small ViT that ships with tdag (``tdag.models.tiny_vit``, from torch, with a
dynamic batch), GPT-2 and BERT from transformers (small configs, random weights), and the 9
real CNNs that ship with onnx (``onnx/backend/test/data/light``, from ONNX).
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import os

import onnx
import torch

import tdag
import tdag.lower
from tdag.models import tiny_vit

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def digest(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()[:12]


def fingerprint(prog: tdag.Program) -> dict[str, str]:
    """What each stage makes of ``prog``, hashed."""
    report = tdag.cost(prog)
    totals = (report.flops, report.matmul_flops, report.bytes_read, report.bytes_written)
    return {"program": digest(str(prog)), "lowered": digest(str(tdag.lower.lower(prog))),
            "torch": digest(tdag.to_torch(prog).code),
            "onnx": digest(tdag.to_onnx(prog).SerializeToString()),
            "cost": digest(repr(totals))}


def torch_models():
    """(name, thunk giving a Program) for the torch models."""
    def vit():
        model, args = tiny_vit()
        return tdag.from_torch(model, args, dynamic_batch=True)

    def hf(config_name: str, model_name: str, vocab: int):
        def build():
            import transformers  # noqa: PLC0415  (optional: a dev dependency)
            config = getattr(transformers, config_name)(
                vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=64, n_embd=32, n_layer=2, n_head=2, use_cache=False)
            torch.manual_seed(0)
            model = getattr(transformers, model_name)(config).eval()
            ids = torch.randint(0, vocab, (1, 8), generator=torch.Generator().manual_seed(0))
            return tdag.from_torch(model, (ids,))
        return build

    yield "tiny_vit", vit
    yield "gpt2", hf("GPT2Config", "GPT2Model", 100)
    yield "bert", hf("BertConfig", "BertModel", 100)


def onnx_models():
    for path in sorted(glob.glob(os.path.join(LIGHT, "light_*.onnx"))):
        name = os.path.basename(path)[len("light_"):-len(".onnx")]
        yield name, (lambda path=path: tdag.from_onnx(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated names; default: all")
    args = parser.parse_args()
    wanted = set(args.models.split(",")) if args.models else None
    stages = ("program", "lowered", "torch", "onnx", "cost")
    print(f"{'model':<14}" + "".join(f"{s:>14}" for s in stages))
    for name, build in [*torch_models(), *onnx_models()]:
        if wanted and name not in wanted:
            continue
        prints = fingerprint(build())
        print(f"{name:<14}" + "".join(f"{prints[s]:>14}" for s in stages), flush=True)


if __name__ == "__main__":
    main()
