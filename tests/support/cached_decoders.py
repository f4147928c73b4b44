"""ONNX files of decoders whose KV cache is inputs and outputs, as exporters write them: a
step ``(input_ids, attention_mask[, position_ids], past_key_values.{i}.key/value) -> (logits,
present.{i}.key/value)`` by torch.onnx's legacy exporter with dynamic axes, and the merged
decoder Hugging Face optimum writes (``decoder_model_merged.onnx``): one If on the bool input
``use_cache_branch`` choosing between the no-past export (else branch) and the with-past one
(then branch), their shared weights stored once in the outer graph.

optimum itself does not install beside torch 2.13 here; ``merge_decoders`` does what its
``optimum.onnx.merge_decoders`` does, in fewer lines: the union of the inputs (the past ones
included, fed with length 0 on the first call) plus ``use_cache_branch: bool[1]``, each
export's nodes as a branch without inputs that reads the outer scope, initializers with equal
contents stored once.
"""
from __future__ import annotations

import warnings

import onnx
import torch
from transformers import DynamicCache


class CachedStep(torch.nn.Module):
    """One call of a decoder on new tokens and its past as flat tensors: transformers 5 keeps
    its cache in a DynamicCache object, which the legacy exporter cannot take as an input.
    ``with_past=False`` is the first call (no past inputs); ``position_ids`` adds that input
    after the attention mask, as optimum's Llama exports have it."""

    def __init__(self, model, with_past: bool = True, position_ids: bool = False):
        super().__init__()
        self.model, self.with_past, self.position_ids = model, with_past, position_ids
        self.layers = model.config.num_hidden_layers

    def forward(self, input_ids, attention_mask, *rest):
        positions, past = (rest[0], rest[1:]) if self.position_ids else (None, rest)
        cache = DynamicCache()
        for i in range(self.layers if self.with_past else 0):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=positions, past_key_values=cache, use_cache=True)
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits, *present)


def pair_names(layers: int, prefix: str) -> list[str]:
    return [f"{prefix}.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def export_step(model, path, with_past: bool = True, position_ids: bool = False) -> None:
    """The step of ``model`` (a transformers causal LM) as torch.onnx's legacy exporter
    writes it: batch, sequence and past lengths named dynamic axes."""
    config = model.config
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    size = config.hidden_size // config.num_attention_heads
    batch, seq, past = 2, 3, 4 if with_past else 0
    args = [torch.randint(2, config.vocab_size, (batch, seq)),
            torch.ones(batch, past + seq, dtype=torch.long)]
    inputs = ["input_ids", "attention_mask"]
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"},
            "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
            "logits": {0: "batch_size", 1: "sequence_length"}}
    if position_ids:
        args.append(torch.arange(past, past + seq).expand(batch, seq))
        inputs.append("position_ids")
        axes["position_ids"] = {0: "batch_size", 1: "sequence_length"}
    if with_past:
        args += [torch.randn(batch, heads, past, size) for _ in range(2 * layers)]
        inputs += pair_names(layers, "past_key_values")
        axes.update({n: {0: "batch_size", 2: "past_sequence_length"}
                     for n in pair_names(layers, "past_key_values")})
    presents = pair_names(layers, "present")
    axes.update({n: {0: "batch_size", 2: "total_sequence_length"} for n in presents})
    step = CachedStep(model, with_past, position_ids).eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(step, tuple(args), str(path), input_names=inputs,
                          output_names=["logits", *presents], opset_version=17, dynamo=False,
                          dynamic_axes=axes)


def merge_decoders(no_past_path, with_past_path, path) -> None:
    """optimum's merged decoder of two exports of one model (see the module docstring)."""
    first, cached = onnx.load(str(no_past_path)), onnx.load(str(with_past_path))
    shared, renamed = {}, []
    for model in (first, cached):  # initializers with equal contents, stored once
        names = {}
        for init in model.graph.initializer:
            key = (init.data_type, tuple(init.dims), init.SerializeToString(
                deterministic=True).replace(init.name.encode(), b""))
            if key not in shared:
                shared[key] = onnx.TensorProto()
                shared[key].CopyFrom(init)
                shared[key].name = f"shared_{len(shared)}"
            names[init.name] = shared[key].name
        renamed.append(names)
    branches = [_branch(m, names, label) for m, names, label in
                ((cached, renamed[1], "with_past"), (first, renamed[0], "no_past"))]
    cond = onnx.helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1])
    node = onnx.helper.make_node("If", ["use_cache_branch"],
                                 [o.name for o in cached.graph.output],
                                 then_branch=branches[0], else_branch=branches[1])
    graph = onnx.helper.make_graph([node], "merged", [*cached.graph.input, cond],
                                   list(cached.graph.output), list(shared.values()))
    merged = onnx.helper.make_model(graph, opset_imports=cached.opset_import)
    onnx.checker.check_model(merged, full_check=True)
    onnx.save(merged, str(path))


def _branch(model, initializers: dict, label: str) -> onnx.GraphProto:
    """The export's nodes as a subgraph without inputs, its weights read from the outer
    graph under their shared names. As in optimum, the two branches' own values keep the
    exporter's names (the same in both, with other types) and the branch outputs are named
    as the If's."""
    graph = model.graph
    nodes = []
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = [initializers.get(n, n) for n in node.input]
        nodes.append(copy)
    return onnx.helper.make_graph(nodes, label, [], list(graph.output),
                                  value_info=list(graph.value_info))
