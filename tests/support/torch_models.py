"""Small torch models for the from_torch tests and benchmarks, each exercising a family of
ATen ops: dense layers, convolutions and norms, attention, recurrences, resampling; and
``MODELS``, the test zoo (each with its input makers) that from_torch, reify and to_jax run."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


class Fn(nn.Module):
    """A module whose forward is ``fn``: a plain function as torch.export, from_torch and
    torch.onnx.export take it."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


class MLP(nn.Module):
    def __init__(self, sizes=(16, 32, 32, 4)):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.norm = nn.LayerNorm(sizes[-2])

    def forward(self, x):
        for i, layer in enumerate(self.layers[:-1]):
            x = F.gelu(layer(x)) if i % 2 else torch.tanh(layer(x))
        return self.layers[-1](self.norm(x)).log_softmax(-1)


class CNN(nn.Module):
    """Conv, batch norm, group norm, max/avg/adaptive pooling, transposed conv."""

    def __init__(self, channels=3, classes=5):
        super().__init__()
        self.stem = nn.Conv2d(channels, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.block = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2),
                                   nn.GroupNorm(4, 16), nn.SiLU())
        self.up = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8)
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = F.max_pool2d(x, 3, stride=1, padding=1)
        y = self.block(x)
        x = self.depthwise(self.up(y)) + x
        x = F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False)
        pooled = torch.cat([F.adaptive_avg_pool2d(x, 1), F.adaptive_avg_pool2d(x, 1) * 0.5], 1)
        return self.head(pooled.flatten(1))


class Encoder(nn.Module):
    """torch's own TransformerEncoderLayer with a key-padding mask."""

    def __init__(self, d=32, heads=4, layers=2):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x, padding_mask):
        return self.encoder(x, src_key_padding_mask=padding_mask)


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Rotary(nn.Module):
    def __init__(self, head_dim, base=10000.0):
        super().__init__()
        inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, positions):
        angles = positions[..., None].float() * self.inv_freq
        emb = torch.cat([angles, angles], dim=-1)
        return emb.cos(), emb.sin()


class Attention(nn.Module):
    """Grouped-query attention with rotary embeddings and causal + padding masks."""

    def __init__(self, d, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.rotary = Rotary(self.head_dim)

    def forward(self, x, mask):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary(torch.arange(s, device=x.device))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
        v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLPBlock(nn.Module):
    """SwiGLU."""

    def __init__(self, d, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, d, heads, kv_heads, hidden):
        super().__init__()
        self.input_layernorm = RMSNorm(d)
        self.self_attn = Attention(d, heads, kv_heads)
        self.post_attention_layernorm = RMSNorm(d)
        self.mlp = MLPBlock(d, hidden)

    def forward(self, x, mask):
        x = x + self.self_attn(self.input_layernorm(x), mask)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class LMOutput:
    """An output dataclass, as Hugging Face models return (registered as a pytree below)."""
    logits: torch.Tensor
    hidden: torch.Tensor


torch.utils._pytree.register_dataclass(LMOutput)


class Decoder(nn.Module):
    """A Llama-shaped causal decoder: embedding, RMSNorm, rotary GQA attention, SwiGLU."""

    def __init__(self, vocab=64, d=32, layers=2, heads=4, kv_heads=2, hidden=64):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(DecoderLayer(d, heads, kv_heads, hidden)
                                    for _ in range(layers))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, input_ids, attention_mask):
        s = input_ids.shape[1]
        causal = torch.ones(s, s, dtype=torch.bool, device=input_ids.device).tril()
        mask = causal[None, None] & attention_mask[:, None, None, :].bool()
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, mask)
        x = self.norm(x)
        return LMOutput(logits=self.lm_head(x), hidden=x)


class Tagger(nn.Module):
    """Embedding + bidirectional LSTM + per-token classifier."""

    def __init__(self, vocab=50, d=16, hidden=24, tags=7):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, tags)

    def forward(self, tokens):
        h, _ = self.lstm(self.embed(tokens))
        return self.out(h).log_softmax(-1)


class UNetBlock(nn.Module):
    """Down, up by interpolation, skip connection by concat."""

    def __init__(self, c=4):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.ReLU())
        self.mid = nn.Conv2d(2 * c, 2 * c, 3, padding=1)
        self.fuse = nn.Conv2d(3 * c, c, 1)

    def forward(self, x):
        y = self.mid(self.down(x))
        y = F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)
        z = F.interpolate(y, size=x.shape[-2:], mode="nearest")
        return self.fuse(torch.cat([x, z], dim=1)) + F.hardswish(x)


def padding_mask(batch, seq):
    """A key-padding mask (True = padded) with the last two positions of sample 0 padded."""
    mask = torch.zeros(batch, seq, dtype=torch.bool)
    mask[0, seq - 2:] = True
    return mask


def attention_mask(batch, seq):
    """An HF-style attention mask (1 = attend) with the last sample left-padded by two."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, :2] = 0
    return mask


def llama_config_7b():
    return dict(vocab=32000, d=4096, layers=32, heads=32, kv_heads=32, hidden=11008)


def token_ids(vocab):
    """A maker of random token ids in [1, vocab) of shape (batch, seq)."""
    return lambda batch, seq: torch.randint(1, vocab, (batch, seq))


# name -> (model factory, input makers taking a batch size)
MODELS = {
    "mlp": (MLP, [lambda b: torch.randn(b, 16)]),
    "cnn": (CNN, [lambda b: torch.randn(b, 3, 12, 12)]),
    "encoder": (Encoder, [lambda b: torch.randn(b, 6, 32), lambda b: padding_mask(b, 6)]),
    "decoder": (Decoder, [lambda b: token_ids(64)(b, 7), lambda b: attention_mask(b, 7)]),
    "tagger": (Tagger, [lambda b: token_ids(50)(b, 9)]),
    "unet": (UNetBlock, [lambda b: torch.randn(b, 4, 8, 8)]),
}


def make_model(name):
    """(the zoo's model ``name`` in eval mode, seeded; a function batch -> its inputs)."""
    torch.manual_seed(0)
    factory, makers = MODELS[name]
    model = factory().eval()
    return model, lambda batch: tuple(make(batch) for make in makers)
