"""The models tdag.grad is checked on (tests/refine/test_grad_models.py) and costed on
(tests/refine/test_training_flops.py, benchmarks/training_flops.py): transformers' small configs
with random weights (eager attention), plus a UNet block written here; each is wrapped so that
its forward returns a scalar loss. ``MODELS[name]()`` -> (model, args, reduce)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import transformers as T


class Loss(torch.nn.Module):
    """The model, then a scalar of its output that every parameter reaches."""

    def __init__(self, model, reduce):
        super().__init__()
        self.model, self.reduce = model, reduce

    def forward(self, *args):
        return self.reduce(self.model(*args))


class UNetBlock(torch.nn.Module):
    """A diffusion UNet's down-up block: conv, GroupNorm, SiLU, a residual, a strided conv
    down and a transposed conv up, with the skip concatenated."""

    def __init__(self, c=8):
        super().__init__()
        self.conv1, self.norm1 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.GroupNorm(2, c)
        self.conv2, self.norm2 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.GroupNorm(2, c)
        self.down = torch.nn.Conv2d(c, 2 * c, 3, stride=2, padding=1)
        self.up = torch.nn.ConvTranspose2d(2 * c, c, 4, stride=2, padding=1)
        self.out = torch.nn.Conv2d(2 * c, c, 1)

    def forward(self, x):
        h = self.conv2(F.silu(self.norm2(self.conv1(F.silu(self.norm1(x)))))) + x
        return self.out(torch.cat([self.up(F.silu(self.down(h))), h], 1))


def _ids(vocab=100, shape=(2, 8)):
    return torch.randint(0, vocab, shape)


def _text(cls, config, reduce=lambda o: o.last_hidden_state.pow(2).mean()):
    return lambda: (cls(config), (_ids(),), reduce)


def _lm(o):
    return o.logits.logsumexp(-1).mean()


SMALL = dict(attn_implementation="eager")
MODELS = {
    "gpt2": _text(T.GPT2LMHeadModel, T.GPT2Config(n_layer=2, n_embd=32, n_head=2,
                                                  vocab_size=100, n_positions=32, **SMALL), _lm),
    "llama": _text(T.LlamaForCausalLM, T.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=100, **SMALL), _lm),
    "bert": _text(T.BertModel, T.BertConfig(num_hidden_layers=2, hidden_size=32,
                                            num_attention_heads=2, intermediate_size=64,
                                            vocab_size=100, **SMALL)),
    "t5-encoder": _text(T.T5EncoderModel, T.T5Config(
        num_layers=2, d_model=32, d_kv=8, num_heads=4, d_ff=64, vocab_size=100, **SMALL)),
    "vit": lambda: (T.ViTModel(T.ViTConfig(
        image_size=16, patch_size=4, num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
        intermediate_size=64, **SMALL)), (torch.randn(2, 3, 16, 16),),
        lambda o: o.last_hidden_state.pow(2).mean()),
    "resnet": lambda: (T.ResNetModel(T.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")),
        (torch.randn(2, 3, 32, 32),), lambda o: o.pooler_output.pow(2).mean()),
    "convnext": lambda: (T.ConvNextModel(T.ConvNextConfig(
        hidden_sizes=[8, 16], depths=[1, 1], num_stages=2)), (torch.randn(2, 3, 32, 32),),
        lambda o: o.pooler_output.pow(2).mean()),
    "mobilenet-v2": lambda: (T.MobileNetV2Model(T.MobileNetV2Config(
        image_size=32, depth_multiplier=0.25)), (torch.randn(2, 3, 32, 32),),
        lambda o: o.pooler_output.pow(2).mean()),
    "whisper-encoder": lambda: (T.WhisperModel(T.WhisperConfig(
        d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
        max_source_positions=16, vocab_size=100, pad_token_id=1, bos_token_id=2,
        eos_token_id=3, decoder_start_token_id=2, **SMALL)).get_encoder(),
        (torch.randn(2, 8, 32),), lambda o: o.last_hidden_state.pow(2).mean()),
    "unet-block": lambda: (UNetBlock(), (torch.randn(2, 8, 8, 8),), lambda y: y.pow(2).mean()),
}


class CrossEntropyLM(torch.nn.Module):
    """A causal LM's next-token loss: cross-entropy of its logits against ``labels``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        logits = self.model(ids).logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def gpt2_cross_entropy(n_embd: int = 64, tokens: int = 16):
    """GPT-2 (2 layers, vocabulary 100) under a cross-entropy loss on a batch of 2 x ``tokens``
    -> (wrapped model, (ids, labels))."""
    config = T.GPT2Config(n_layer=2, n_embd=n_embd, n_head=2, vocab_size=100, n_positions=32,
                          **SMALL)
    return CrossEntropyLM(T.GPT2LMHeadModel(config)), (_ids(shape=(2, tokens)),
                                                        _ids(shape=(2, tokens)))


class Tagger(torch.nn.Module):
    """An LSTM tagger: embedding, LSTM (a Loop over the cell), a linear head, cross-entropy."""

    def __init__(self):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(20, 8), torch.nn.Linear(16, 5)
        self.lstm = torch.nn.LSTM(8, 16, batch_first=True)

    def forward(self, ids, tags):
        hidden, _ = self.lstm(self.emb(ids))
        return F.cross_entropy(self.out(hidden).flatten(0, 1), tags.flatten())


def onnx_outputs(prog, args) -> list:
    """``prog`` written by to_onnx and run on onnxruntime's CPU provider (its batch only:
    the state, if any, keeps the file's initializers)."""
    import onnxruntime as ort

    import tdag

    session = ort.InferenceSession(tdag.to_onnx(prog).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {n: a.numpy() for n, a in zip(names, args)})


def assert_lowered_gradients(name: str, kernels: dict, relative: float = 1e-4) -> None:
    """``tdag.grad`` of MODELS[name], lowered, holds each kernel of ``kernels`` as often as
    it says, and its gradients equal torch.autograd's through to_torch and onnxruntime
    (``relative`` to the largest gradient)."""
    import tdag
    from tdag.lower.pipeline import lower

    torch.manual_seed(0)
    model, args, reduce = MODELS[name]()
    wrapped = Loss(model, reduce).eval()
    g = tdag.grad(tdag.from_torch(wrapped, args))
    ops = [n.op for n in lower(g).graph.nodes]
    assert {op: ops.count(op) for op in kernels} == kernels
    wrapped(*args).backward()
    params = dict(wrapped.named_parameters())
    scale = max(p.grad.abs().max().item() for p in params.values() if p.grad is not None)
    for outs in (tdag.to_torch(g)(*args), onnx_outputs(g, args)):
        for n, got in zip(g.wrt, outs[1:]):
            want = params[n].grad if params[n].grad is not None else torch.zeros(got.shape)
            err = (torch.as_tensor(got) - want).abs().max().item()
            assert err <= relative * scale, f"{name}: {n} off by {err:.2e} (scale {scale:.2e})"
