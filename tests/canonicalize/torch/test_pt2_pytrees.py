""".pt2 archives whose pytrees name classes tdag does not import: transformers' ModelOutputs
and a user's dataclass, opened in a fresh process that never imports them.

torch.export.save writes a transformers model's output as a ``CausalLMOutputWithPast`` (or
``BaseModelOutput...``) node; torch rebuilds it only where transformers is imported. tdag
reads such a node as data (``pt2/pytrees.py``): its fields name the program's outputs and
nothing is imported. The models are built here from tiny configs (random weights, nothing
downloaded) and their eager outputs handed to the child process in a tensor file.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
import transformers

import tdag

TOL = dict(rtol=1e-5, atol=1e-5)


def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64, use_cache=False))


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        use_cache=False))


def _bert():
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64))


# name -> (model, the fields of its output, a module path the cost table shows)
HF = {"gpt2": (_gpt2, ("logits",), "lm_head"),
      "llama": (_llama, ("logits",), "lm_head"),
      "bert": (_bert, ("last_hidden_state", "pooler_output"), "pooler")}


@dataclasses.dataclass
class Halves:
    """A user's output type: registered for export under the user's own name."""

    low: torch.Tensor
    high: torch.Tensor


torch.export.register_dataclass(Halves, serialized_type_name="my_project.outputs.Halves")


class Split(torch.nn.Module):
    """Takes a Halves and a tensor, returns a Halves."""

    def forward(self, h: Halves, x: torch.Tensor) -> Halves:
        return Halves(low=h.low + x, high=torch.tanh(h.high * x))


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    """{name: (path, fields)}, and the tensor file of inputs and eager outputs."""
    folder = tmp_path_factory.mktemp("pt2_pytrees")
    saved, tensors = {}, {}
    for name, (make, fields, _) in HF.items():
        torch.manual_seed(0)
        model = make().eval()
        ids = torch.randint(0, 100, (2, 7))
        ep = torch.export.export(model, (ids,), strict=False)
        assert issubclass(ep.call_spec.out_spec.type, transformers.utils.ModelOutput)
        path = folder / f"{name}.pt2"
        torch.export.save(ep, str(path))
        with torch.no_grad():
            out = model(ids)
        tensors[f"{name}:input"] = ids
        tensors.update({f"{name}:{field}": out[field] for field in fields})
        saved[name] = (str(path), fields)
    # the dataclass both in and out; saved without example inputs, whose pickle would name
    # the class (tdag refuses a pickle that imports anything beyond tensors)
    args = (Halves(torch.randn(3), torch.randn(3)), torch.randn(3))
    ep = torch.export.export(Split(), args, strict=False)
    ep.example_inputs = None
    torch.export.save(ep, str(folder / "halves.pt2"))
    out = Split()(*args)
    tensors.update({"halves:in0": args[0].low, "halves:in1": args[0].high,
                    "halves:in2": args[1], "halves:low": out.low, "halves:high": out.high})
    saved["halves"] = (str(folder / "halves.pt2"), ("low", "high"))
    torch.save(tensors, folder / "expected.pt")
    return folder, saved


# Run in a fresh interpreter: any import of transformers (or of the module that defined
# Halves) is recorded and refused, and must not have happened by the end.
_CHILD = r"""
import contextlib, importlib.abc, io, json, os, runpy, sys

attempts = []

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("transformers", "my_project", "test_pt2_pytrees"):
            attempts.append(name)
            raise ImportError(f"{name} must not be imported")

sys.meta_path.insert(0, Refuse())
import torch
import tdag
from tdag.cli import main

folder, saved, layers = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
expected = torch.load(os.path.join(folder, "expected.pt"), weights_only=True)
for name, (path, fields) in saved.items():
    prog = tdag.from_torch(path)
    assert prog.main.outputs == tuple(fields), (name, prog.main.outputs)
    assert prog.graph.outputs == tuple(fields), (name, prog.graph.outputs)
    inputs = [expected[f"{name}:input"]] if name in layers else \
        [expected[f"halves:in{i}"] for i in range(3)]
    outs = tdag.run(prog, *inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    for field, got in zip(fields, outs):
        torch.testing.assert_close(got, expected[f"{name}:{field}"], rtol=1e-5, atol=1e-5)
    if name not in layers:
        continue
    assert "return " + ", ".join("%" + f for f in fields) in str(prog)
    text = io.StringIO()
    page = os.path.join(folder, f"{name}.html")
    with contextlib.redirect_stdout(text):
        if name == "llama":  # as ``python -m tdag cost`` runs
            sys.argv = ["tdag", "cost", path]
            try:
                runpy.run_module("tdag", run_name="__main__")
            except SystemExit as exit:
                assert exit.code == 0, exit.code
        else:
            assert main(["cost", path]) == 0
        assert main(["show", path, "-o", page]) == 0
    out = text.getvalue()
    assert "total" in out and layers[name] in out and "wrote" in out, out[-2000:]
    html = open(page, encoding="utf-8").read()
    assert all(field in html for field in fields), name
    print(name, "ok")
assert not attempts, attempts
assert not any(m.split(".")[0] in ("transformers", "my_project") for m in sys.modules)
print("no transformers")
"""


def test_archives_load_run_and_show_without_their_classes(archives):
    folder, saved = archives
    layers = {name: layer for name, (_, _, layer) in HF.items()}
    child = subprocess.run([sys.executable, "-c", _CHILD, str(folder), json.dumps(saved),
                            json.dumps(layers)], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-5000:]
    lines = child.stdout.split("\n")
    assert [f"{name} ok" for name in HF] + ["no transformers"] == \
        [line for line in lines if line.endswith((" ok", "no transformers"))]


def test_the_same_names_where_transformers_is_imported(archives):
    """Here the ModelOutput types are registered: torch rebuilds them, and tdag names the
    outputs the same way (from the module, and from the archive)."""
    _, saved = archives
    for name in ("bert", "halves"):
        path, fields = saved[name]
        assert tdag.from_torch(path).main.outputs == fields
    torch.manual_seed(0)
    model = _bert().eval()
    prog = tdag.from_torch(model, (torch.randint(0, 100, (2, 7)),))
    assert prog.main.outputs == HF["bert"][1]


def test_a_dict_output_is_named_by_its_keys_and_a_tuple_is_not():
    class Heads(torch.nn.Module):
        def forward(self, x):
            return {"score": x.sum(-1), "pair": (x * 2, x)}, x - 1

    prog = tdag.from_torch(Heads(), (torch.randn(2, 3),))
    assert prog.main.outputs == ("0.score", "0.pair.0", "0.pair.1", "out3")
    assert prog.graph.outputs[:3] == ("0.score", "0.pair.0", "x")  # an input keeps its name
    assert tdag.parse(str(prog)) == prog
    x = torch.randn(2, 3)
    got = tdag.run(prog, x)
    for a, b in zip(got, (x.sum(-1), x * 2, x, x - 1)):
        torch.testing.assert_close(a, b)
