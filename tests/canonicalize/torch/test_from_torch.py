"""from_torch: torch models canonicalized into tdag Programs, compared with eager PyTorch.

Each model runs through ``tdag.run`` at the example's batch size and, with
``dynamic_batch=True``, at another one; outputs must match eager within a relative error of
1e-4 (of the output's scale: summation order differs from torch's kernels).
"""
from __future__ import annotations

import io
import os
import pickle

import pytest
import torch
import torch.nn as nn
from torch.export import Dim

import tdag
from tdag.canonicalize import from_torch
from tdag.canonicalize.torch.capture import _no_arbitrary_unpickling
from tdag.ir.types import TensorKind

from support.torch_models import (MODELS, Decoder, LMOutput, attention_mask, llama_config_7b,
                                  make_model, token_ids)


def assert_matches(prog, model, args):
    with torch.no_grad():
        expected = torch.utils._pytree.tree_leaves(model(*args))
        got = tdag.run(prog, *args)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    for out, ref in zip(got, expected):
        scale = ref.abs().max().item() if ref.numel() else 1.0
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("name", list(MODELS))
def test_matches_eager_at_several_batch_sizes(name):
    model, inputs = make_model(name)
    prog = from_torch(model, inputs(2), dynamic_batch=True)
    tdag.verify(prog)
    assert all(str(t.shape[0]) == "batch" for t in prog.input_types)
    for batch in (2, 3, 1):
        assert_matches(prog, model, inputs(batch))


def test_an_example_batch_of_one_is_still_dynamic():
    model, inputs = make_model("mlp")
    prog = from_torch(model, inputs(1), dynamic_batch=True)  # export specialises sizes 0 and 1
    assert [str(t) for t in prog.input_types] == ["f32[batch,16]"]
    for batch in (1, 4):
        assert_matches(prog, model, inputs(batch))


def test_no_grad_and_autocast_regions_in_forward():
    class Regions(nn.Module):  # as Hugging Face's rotary embeddings are written
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, x):
            with torch.no_grad():
                y = torch.relu(self.proj(x))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                z = self.proj(y)
            return y * 2, z

    model, x = Regions().eval(), torch.randn(3, 4)
    prog = from_torch(model, (x,))
    assert [str(t) for t in prog.graph.output_types] == ["f32[3,4]", "bf16[3,4]"]
    for out, ref in zip(tdag.run(prog, x), model(x)):
        torch.testing.assert_close(out, ref)


def test_static_shapes_without_dynamic_batch():
    model, inputs = make_model("cnn")
    prog = from_torch(model, inputs(2))
    tdag.verify(prog)
    assert [str(t) for t in prog.input_types] == ["f32[2,3,12,12]"]
    assert_matches(prog, model, inputs(2))


def test_parameter_and_buffer_names_are_torch_names():
    model, inputs = make_model("cnn")
    graph = from_torch(model, inputs(2)).graph
    params = {k for k, w in graph.weights.items() if w.kind is TensorKind.parameter}
    buffers = {k for k, w in graph.weights.items() if w.kind is TensorKind.buffer}
    assert params == {k for k, _ in model.named_parameters()}
    assert buffers == {k for k, _ in model.named_buffers()}
    assert "bn.running_mean" in buffers and "block.0.weight" in params
    for name, value in model.state_dict().items():
        assert torch.equal(graph.weights[name].value, value)


def test_provenance_names_aten_op_module_and_line():
    model, inputs = make_model("decoder")
    graph = from_torch(model, inputs(2)).graph
    origins = [node.origin for node in graph.nodes]
    assert all(o.op.startswith("aten.") for o in origins)
    scopes = {o.scope for o in origins}
    assert "layers.1.self_attn.q_proj" in scopes and "layers.0.mlp" in scopes
    assert any(o.location.startswith("torch_models.py:") for o in origins)
    q_proj = [n for n in graph.nodes if n.origin.scope == "layers.0.self_attn.q_proj"]
    assert {n.origin.op for n in q_proj} == {"aten.linear"}


def test_nested_inputs_kwargs_and_dataclass_outputs():
    class Nested(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, pair, extra, *, scale):
            a, (b, c) = pair
            out = self.proj(a) + b * extra["w"] - c
            return LMOutput(logits=out * scale, hidden=out), {"sum": out.sum(-1)}

    model = Nested().eval()
    args = ((torch.randn(2, 4), (torch.randn(2, 4), torch.randn(2, 4))), {"w": torch.randn(4)})
    kwargs = {"scale": torch.randn(2, 1)}
    prog = from_torch(model, args, kwargs)
    assert len(prog.input_types) == 5 and len(prog.graph.outputs) == 3
    flat = torch.utils._pytree.tree_leaves((args, kwargs))
    expected = torch.utils._pytree.tree_leaves(model(*args, **kwargs))
    for out, ref in zip(tdag.run(prog, *flat), expected):
        torch.testing.assert_close(out, ref)


def test_named_dynamic_shapes_give_named_symbols():
    model, _ = make_model("decoder")
    batch, seq = Dim("batch"), Dim("seq", min=2, max=64)
    example = (token_ids(64)(2, 7), attention_mask(2, 7))
    prog = from_torch(model, example, dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    assert [str(t) for t in prog.input_types] == ["i64[batch,seq]", "i64[batch,seq]"]
    for b, s in ((3, 5), (1, 12)):
        assert_matches(prog, model, (token_ids(64)(b, s), attention_mask(b, s)))


def test_inplace_ops_respect_aliasing():
    class Mutating(nn.Module):
        def forward(self, x):
            y = x.clone()
            view = y[:, 0]          # a view taken before the write sees it
            y.add_(1)
            z = x * 2
            z.masked_fill_(x > 0, 0.5)
            return view * 2, z

    x = torch.randn(3, 4)
    prog = from_torch(Mutating(), (x,))
    for out, ref in zip(tdag.run(prog, x), Mutating()(x)):
        torch.testing.assert_close(out, ref)


def test_unsupported_ops_are_all_reported_with_module_and_line():
    class Gamma(nn.Module):
        def forward(self, x):
            return torch.nextafter(x, x.abs() + 1)  # the bits of a float, stepped

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.gamma = Gamma()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            y = self.gamma(self.fc(x))
            return torch.frexp(y).mantissa + y  # a float split into its bits

    with pytest.raises(tdag.UnsupportedOpError) as info:
        from_torch(Model().eval(), (torch.randn(8, 8),))
    message = str(info.value)
    assert "prims.nextafter" in message and "prims.frexp" in message
    assert "@ gamma (test_from_torch.py:" in message
    assert {origin.op for _, origin in info.value.problems} == {"prims.nextafter",
                                                               "prims.frexp"}, \
        info.value.problems


def test_training_mode_dropout_is_refused():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    with pytest.raises(tdag.UnsupportedOpError, match="eval"):
        from_torch(model, (torch.randn(2, 4),))


def test_meta_device_weights_are_never_materialised():
    with torch.device("meta"):
        model = Decoder(vocab=1000, d=256, layers=4, heads=8, kv_heads=2, hidden=512).eval()
    ids = torch.zeros(1, 16, dtype=torch.long, device="meta")
    prog = from_torch(model, (ids, torch.ones_like(ids)), dynamic_batch=True)
    tdag.verify(prog)
    weights = prog.graph.weights
    assert {k for k, w in weights.items() if w.kind is TensorKind.parameter} == \
        {k for k, _ in model.named_parameters()}
    assert all(w.value is None for w in weights.values() if w.kind is not TensorKind.const)
    assert [str(t) for t in prog.graph.output_types] == ["f32[batch,16,1000]",
                                                         "f32[batch,16,256]"]


@pytest.mark.slow
def test_llama_7b_on_meta_canonicalizes():
    with torch.device("meta"):
        model = Decoder(**llama_config_7b()).eval()
    assert sum(p.numel() for p in model.parameters()) > 6.5e9
    ids = torch.zeros(1, 32, dtype=torch.long, device="meta")
    prog = from_torch(model, (ids, torch.ones_like(ids)), dynamic_batch=True)
    tdag.verify(prog)
    assert "layers.31.mlp.down_proj.weight" in prog.graph.weights


def test_exported_program_and_pt2_file(tmp_path):
    model, inputs = make_model("unet")
    example = inputs(2)
    exported = torch.export.export(model, example, strict=False)
    path = tmp_path / "unet.pt2"
    torch.export.save(exported, str(path))
    for source in (exported, str(path)):
        prog = from_torch(source)
        assert_matches(prog, model, example)
    prog = from_torch(exported, dynamic_batch=True)  # re-exported with a dynamic batch
    assert_matches(prog, model, inputs(3))


def test_paths_that_are_not_pt2_files_are_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    for path in (tmp_path, tmp_path / "missing.pt2", tmp_path / "notes.txt"):
        with pytest.raises(tdag.FileFormatError):
            from_torch(str(path))


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_loading_refuses_pickled_code():
    payload = io.BytesIO()
    torch.save({"x": _Exploit()}, payload)
    with _no_arbitrary_unpickling():
        with pytest.raises(pickle.UnpicklingError):
            torch.load(io.BytesIO(payload.getvalue()), weights_only=False)
        from torch.export.pt2_archive import _package
        with pytest.raises(tdag.FileFormatError):
            _package.pickle.loads(pickle.dumps(_Exploit()))
