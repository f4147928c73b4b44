"""strip_batch on the patterns held-out architectures used to refuse (issue 21): each model
is built in code from a tiny config with random weights, captured, stripped, re-batched with
``add_batch`` and run at batch 1 and 3 against torch eager (atol/rtol 1e-5).

- RoBERTa's ``token_type_ids``: a buffer expanded to the batch and gathered along the
  positions (a take-along, whose row numbers are ``arange(batch) * 512``), with positions
  from a cumsum of the padding mask (the scan's bounds keep the index in the sample's rows);
- T5's relative-position buckets; BERT's buffer sliced and expanded;
- a BatchNorm over a batch-merged axis ([b, t, c, h, w] -> [b*t, c, h, w]): its ``-mean``
  repeated to ``b*t`` is a broadcast read per sample;
- ``nn.MultiheadAttention`` pooling with a learned query, batch-first and sequence-first
  (the query ``[1, b, d]`` split from ``[b]``);
- an ONNX LSTM exported at batch 1 (its zero first state ``[1, 1, h]`` is one sample's);
- ``from_torch(m, args, dynamic_batch=True)`` on ``forward(self, *args)``;
- GPT-2's sequence-classification pooler ``logits[arange(b), argmax(...)]`` (the argmax
  composition's bounds are [0, n - 1], the sample's own rows);
- a take-along over ``[batch * heads, q, k]`` (DeBERTa-v2's relative attention): the flat
  row numbers ``arange(batch * heads * q)`` are folded, ``q`` per head of a sample, and the
  positions' integer clamp (a ``where`` by a comparison of its branches) bounds the index;
- an ONNX LSTM exported at batch 2: its zero first state ``[1, 2, h]`` is a constant
  repeated over the batch; a loop started from rows that differ is refused with what to do.
"""
from __future__ import annotations

import warnings

import onnxruntime as ort
import pytest
import torch
import transformers as T

import tdag
from tdag import ops
from tdag.ir.graph import Value, Weight
from tdag.ir.program import Block, Call, Loop, Program
from tdag.ir.types import DType, TensorKind, TensorType
from tdag.refine import BatchError, add_batch, strip_batch


class Hidden(torch.nn.Module):
    """A transformers model's first output as one tensor."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        out = self.model(*args)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _ids(b):
    ids = torch.randint(1, 100, (b, 8))
    ids[0, 6:] = 0  # padding in the first sample
    return (ids,)


def roberta():
    return Hidden(T.RobertaModel(T.RobertaConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, pad_token_id=0))), _ids


def bert():
    return Hidden(T.BertModel(T.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64))), _ids


def gpt2_pooler():
    return Hidden(T.GPT2ForSequenceClassification(T.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=16, pad_token_id=0,
        num_labels=3))), _ids


def t5():
    return Hidden(T.T5EncoderModel(T.T5Config(
        vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2))), _ids


class FramesBatchNorm(torch.nn.Module):
    """Video frames merged into the batch for a conv + BatchNorm2d, then a BatchNorm1d
    over the merged [b*t, c]."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.bn1 = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), \
            torch.nn.BatchNorm1d(4)
        for bn in (self.bn, self.bn1):
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        b, t = x.shape[:2]
        y = self.bn(self.conv(x.reshape(b * t, 3, 8, 8)))
        y = y.reshape(b, t, 4, -1).mean(-1)
        return self.bn1(y.reshape(b * t, 4)).reshape(b, t, 4)


class QueryPool(torch.nn.Module):
    """Attention pooling: one learned query attends over the sequence."""

    def __init__(self, batch_first: bool):
        super().__init__()
        self.batch_first = batch_first
        self.query = torch.nn.Parameter(torch.randn(1, 1, 16))
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=batch_first)

    def forward(self, x):
        if self.batch_first:
            q = self.query.expand(x.shape[0], -1, -1)
            return self.attn(q, x, x, need_weights=False)[0].squeeze(1)
        kv = x.transpose(0, 1)
        return self.attn(self.query.expand(1, x.shape[0], -1), kv, kv)[0][0]


class StarArgs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, *args):
        return self.linear(args[0]) + args[1]


MODELS = {
    "roberta_token_type_ids": roberta,
    "bert_token_type_ids": bert,
    "t5_relative_positions": t5,
    "gpt2_pooler": gpt2_pooler,
    "batchnorm_batch_merged": lambda: (FramesBatchNorm(),
                                       lambda b: (torch.randn(b, 2, 3, 8, 8),)),
    "mha_pool_batch_first": lambda: (QueryPool(True), lambda b: (torch.randn(b, 5, 16),)),
    "mha_pool_seq_first": lambda: (QueryPool(False), lambda b: (torch.randn(b, 5, 16),)),
    "forward_star_args": lambda: (StarArgs(), lambda b: (torch.randn(b, 4), torch.randn(b, 4))),
}
SMALL = ("batchnorm_batch_merged", "mha_pool_seq_first", "forward_star_args")


def _model(name):
    torch.manual_seed(0)
    module, args = MODELS[name]()
    return module.eval(), args


def check_rebatched(prog, module, args, batches=(1, 3)):
    rebatched = add_batch(strip_batch(prog), "n")
    tdag.verify(rebatched)
    for b in batches:
        example = args(b)
        got = tdag.run(rebatched, *example)
        with torch.no_grad():
            torch.testing.assert_close(got, module(*example), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("name", list(MODELS))
def test_held_out_patterns_strip_and_rebatch(name, dynamic):
    if not dynamic and name not in SMALL:
        pytest.skip("the static capture of the transformers models is the dynamic one's")
    module, args = _model(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = tdag.from_torch(module, args(2), dynamic_batch=dynamic)
    check_rebatched(prog, module, args)


class Lstm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 6, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


def _lstm_file(tmp_path, batch):
    torch.manual_seed(0)
    module = Lstm().eval()
    path = str(tmp_path / "lstm.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.randn(batch, 5, 4),), path, dynamo=False)
    return module, tdag.from_onnx(path)


def test_an_onnx_lstm_exported_at_batch_1_rebatches(tmp_path):
    module, prog = _lstm_file(tmp_path, 1)
    check_rebatched(prog, module, lambda b: (torch.randn(b, 5, 4),))


def test_an_onnx_lstm_exported_at_batch_2_rebatches(tmp_path):
    module, prog = _lstm_file(tmp_path, 2)
    x = torch.randn(2, 5, 4)
    rebatched = add_batch(strip_batch(prog), "n")
    session = ort.InferenceSession(str(tmp_path / "lstm.onnx"))
    torch.testing.assert_close(tdag.run(rebatched, x),
                               torch.from_numpy(session.run(None, {"input": x.numpy()})[0]),
                               atol=1e-5, rtol=1e-5)
    check_rebatched(prog, module, lambda b: (torch.randn(b, 5, 4),), (1, 3))


def _deberta():
    config = T.DebertaV2Config(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=64,
                               relative_attention=True, position_buckets=4,
                               max_relative_positions=8, pos_att_type=["p2c", "c2p"])
    return Hidden(T.DebertaV2Model(config)).eval()


@pytest.mark.slow  # the capture takes ~10 s
def test_deberta_v2_relative_attention_strips_and_rebatches():
    torch.manual_seed(0)
    module = _deberta()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = tdag.from_torch(module, _ids(2), dynamic_batch=True)
    check_rebatched(prog, module, _ids, (1, 3, 5))


class TakeAlong(torch.nn.Module):
    """DeBERTa's c2p lookup in small: scores ``[b * h, q, k]`` gathered along k at positions
    computed in float, cast and clamped to [0, k - 1], expanded over ``b * h``."""

    def forward(self, x):
        b, h, q, k = x.shape
        pos = torch.arange(q)[:, None] - torch.arange(k)[None, :]
        pos = (pos.float() * 1.5).round().long() + k // 2
        index = pos.clamp(0, k - 1).expand(b * h, q, k)
        return torch.gather(x.reshape(b * h, q, k), -1, index).reshape(b, h, q, k)


def test_a_take_along_over_batch_times_heads_rows_rebatches():
    # at a static batch, arange(b * h * q) is not told from positions: captured dynamic
    module = TakeAlong()
    prog = tdag.from_torch(module, (torch.randn(2, 2, 4, 5),), dynamic_batch=True)
    check_rebatched(prog, module, lambda b: (torch.randn(b, 2, 4, 5),), (1, 3, 5))


def _loop_from_a_state(batch: int, first=None):
    """``h = h0; for 2 steps: h = h + x`` with ``h0`` program state of shape [batch, 3]:
    free, yet the body makes it depend on the sample; with ``first``, ``h0`` is that
    constant, computed by a call."""
    t = TensorType((batch, 3), DType.f32)
    step = tdag.trace(lambda i, h, x: (h + x, x), tdag.TensorSpec((), "int64"), t, t).graph
    body = Block((Value("i", step.inputs[0].type), Value("h", t), Value("x", t)),
                 (Call("step", ("i", "h", "x"), ("h1", "x1")),), ("h1", "x1"))
    loop = Loop(("h0", "x"), body, ("hn", "xn"), count=2)
    if first is None:
        state = {"h0": Weight(TensorKind.buffer, t, torch.randn(batch, 3))}
        return Program({"step": step}, Block((Value("x", t),), (loop,), ("hn",)), state)
    start = tdag.trace(lambda x: ops.exp(ops.const(first)), tdag.TensorSpec((batch, 3))).graph
    steps = (Call("start", ("x",), ("h0",)), loop)
    return Program({"step": step, "start": start}, Block((Value("x", t),), steps, ("hn",)), {})


def test_a_loop_from_a_constant_with_one_row_per_sample_is_refused_with_what_to_do():
    with pytest.raises(BatchError, match="not the same row repeated: export the model with a "
                                         "dynamic batch axis") as err:
        strip_batch(_loop_from_a_state(4, torch.randn(4, 3)))
    assert err.value.node is not None


@pytest.mark.parametrize("batch, first", [(1, None), (4, torch.arange(3.0).expand(4, 3))])
def test_a_loop_carrying_a_free_first_value_strips_where_it_is_one_row_repeated(batch, first):
    # any first value at a batch of one; a constant repeated over the batch at any batch
    prog = _loop_from_a_state(batch, first)
    x = torch.randn(batch, 3)
    stripped = strip_batch(prog)
    tdag.verify(stripped)
    torch.testing.assert_close(tdag.run(stripped, x[-1]), tdag.run(prog, x)[-1])


def test_a_loop_carrying_a_free_first_value_is_refused_at_a_larger_batch():
    # the samples would start from different rows of it: the body's add says so
    with pytest.raises(BatchError, match="add mixes samples: operand %h does not depend on "
                                         "the batch yet has a batch-sized axis 0") as err:
        strip_batch(_loop_from_a_state(2))
    assert err.value.node is not None
