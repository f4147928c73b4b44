"""A reified training step against torch eager's, on the architectures of
tests/support/grad_models.py at small-but-not-tiny sizes (each wrapped to return a
scalar loss):

    eager ms   ``opt.zero_grad(); loss = m(*batch); loss.backward(); opt.step()`` with
               torch.optim.AdamW
    tdag ms    ``tdag.to_torch(tdag.train_step(prog, tdag.optim.AdamW()))(*batch)``: the
               same step as one generated module that updates its own state
    torch x    tdag over eager (one thread, interleaved medians; the issue's goal <= 1.0x,
               as a geo-mean over the models)
    ort ms, onnx x   ``tdag.to_onnx`` of the step on onnxruntime (one thread; the state fed
               back from its ``.next`` outputs), over eager

    python benchmarks/train_step_speed.py                      # every model
    python benchmarks/train_step_speed.py --models gpt2,vit --rounds 31
    python benchmarks/train_step_speed.py --scale 2            # every width twice as wide
    python benchmarks/train_step_speed.py --models bert --code # print the generated module
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "tests")]

import transformers as T  # noqa: E402

import tdag  # noqa: E402
from real_sizes import interleaved, session  # noqa: E402
from support.grad_models import Loss, UNetBlock  # noqa: E402

LR = 1e-4  # small: the timed steps keep the weights near where they started
EAGER = dict(attn_implementation="eager")


def _width(n: int, scale: float) -> int:
    """``n`` scaled, a multiple of 16 (so every head count used here divides it)."""
    return max(16, round(n * scale / 16) * 16)


def _hidden(o):
    return o.last_hidden_state.pow(2).mean()


def _pooled(o):
    return o.pooler_output.pow(2).mean()


def _lm(o):
    return o.logits.logsumexp(-1).mean()


def _gpt2(s):
    d = _width(128, s)
    return T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=d, n_head=4, vocab_size=1000,
                                          n_positions=64, **EAGER)), _tokens(), _lm


def _llama(s):
    d = _width(128, s)
    return T.LlamaForCausalLM(T.LlamaConfig(
        num_hidden_layers=2, hidden_size=d, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=2 * d, vocab_size=1000, **EAGER)), _tokens(), _lm


def _bert(s):
    d = _width(128, s)
    return T.BertModel(T.BertConfig(num_hidden_layers=2, hidden_size=d, num_attention_heads=4,
                                    intermediate_size=4 * d, vocab_size=1000, **EAGER)), \
        _tokens(), _hidden


def _t5(s):
    d = _width(128, s)
    return T.T5EncoderModel(T.T5Config(num_layers=2, d_model=d, d_kv=d // 4, num_heads=4,
                                       d_ff=2 * d, vocab_size=1000, **EAGER)), \
        _tokens(), _hidden


def _vit(s):
    d = _width(128, s)
    return T.ViTModel(T.ViTConfig(image_size=32, patch_size=4, num_hidden_layers=2,
                                  hidden_size=d, num_attention_heads=4,
                                  intermediate_size=4 * d, **EAGER)), \
        (torch.randn(4, 3, 32, 32),), _hidden


def _resnet(s):
    d = _width(32, s)
    return T.ResNetModel(T.ResNetConfig(embedding_size=d, hidden_sizes=[d, 2 * d],
                                        depths=[1, 1], layer_type="basic")), \
        (torch.randn(4, 3, 64, 64),), _pooled


def _convnext(s):
    d = _width(32, s)
    return T.ConvNextModel(T.ConvNextConfig(hidden_sizes=[d, 2 * d], depths=[1, 1],
                                            num_stages=2)), \
        (torch.randn(4, 3, 64, 64),), _pooled


def _mobilenet(s):
    return T.MobileNetV2Model(T.MobileNetV2Config(image_size=64, depth_multiplier=0.5 * s)), \
        (torch.randn(4, 3, 64, 64),), _pooled


def _whisper(s):
    d = _width(128, s)
    return T.WhisperModel(T.WhisperConfig(
        d_model=d, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=4 * d, decoder_ffn_dim=4 * d,
        num_mel_bins=16, max_source_positions=32, vocab_size=100, pad_token_id=1,
        bos_token_id=2, eos_token_id=3, decoder_start_token_id=2, **EAGER)).get_encoder(), \
        (torch.randn(4, 16, 64),), _hidden


def _unet(s):
    return UNetBlock(_width(32, s)), (torch.randn(4, _width(32, s), 32, 32),), \
        lambda y: y.pow(2).mean()


def _tokens():
    return (torch.randint(0, 1000, (4, 32)),)


MODELS = {"gpt2": _gpt2, "llama": _llama, "bert": _bert, "t5-encoder": _t5, "vit": _vit,
          "resnet": _resnet, "convnext": _convnext, "mobilenet-v2": _mobilenet,
          "whisper-encoder": _whisper, "unet-block": _unet}


# -- the three steps -------------------------------------------------------------------------

def eager_step(model, args):
    """torch's own loop, one step per call."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    def step():
        optimizer.zero_grad()
        loss = model(*args)
        loss.backward()
        optimizer.step()
        return loss
    return step


def onnx_step(prog: tdag.Program, args):
    """The step's ONNX file on onnxruntime, its state carried from call to call."""
    sess = session(tdag.to_onnx(prog).SerializeToString())
    batch = {v.name: a.numpy() for v, a in zip(prog.main.inputs, args)}
    state = {name: w.value.numpy() for name, w in prog.state.items()}
    outputs = [o.name for o in sess.get_outputs()]

    def step():
        results = sess.run(None, {**batch, **state})
        state.update({n.removesuffix(".next"): v for n, v in zip(outputs, results)
                      if n.endswith(".next")})
        return results[0]
    return step


def build(name: str, scale: float):
    """(eager step, reified step, ONNX step, the reified module) for one model."""
    torch.manual_seed(0)
    model, args, reduce = MODELS[name](scale)
    wrapped = Loss(model, reduce).eval()
    prog = tdag.train_step(tdag.from_torch(wrapped, args), tdag.optim.AdamW(lr=LR))
    module = tdag.to_torch(prog)
    first = module(*args)
    eager = eager_step(copy.deepcopy(wrapped), args)
    want = eager()
    torch.testing.assert_close(first, want.detach(), rtol=1e-4, atol=1e-5)
    return eager, lambda: module(*args), onnx_step(prog, args), module


def measure(name: str, scale: float, rounds: int) -> dict:
    eager, reified, onnx, _ = build(name, scale)
    eager_s, tdag_s = interleaved(eager, reified, rounds)
    again_s, ort_s = interleaved(eager, onnx, rounds)
    return {"model": name, "eager_ms": eager_s * 1e3, "tdag_ms": tdag_s * 1e3,
            "torch_ratio": tdag_s / eager_s, "ort_ms": ort_s * 1e3, "onnx_ratio": ort_s / again_s}


COLUMNS = (("model", "<17", "{}"), ("eager ms", ">10", "{:.2f}"), ("tdag ms", ">10", "{:.2f}"),
           ("torch x", ">9", "{:.2f}"), ("ort ms", ">10", "{:.2f}"), ("onnx x", ">9", "{:.2f}"))
KEYS = ("model", "eager_ms", "tdag_ms", "torch_ratio", "ort_ms", "onnx_ratio")


def _line(row: dict) -> str:
    return "".join(format(form.format(row[key]), align)
                   for (_, align, form), key in zip(COLUMNS, KEYS))


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--scale", type=float, default=1.0, help="of every model's widths")
    parser.add_argument("--code", action="store_true", help="print each generated module")
    args = parser.parse_args()
    names = args.models.split(",")
    unknown = set(names) - set(MODELS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; known: {', '.join(MODELS)}")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # transformers' and torch's deprecations, not ours
    if args.code:
        for name in names:
            print(f"# {name}\n{build(name, args.scale)[3].code}")
        return
    print(f"scale {args.scale}, one thread, AdamW, medians of {args.rounds} interleaved rounds")
    print("".join(format(title, align) for title, align, _ in COLUMNS))
    rows = []
    for name in names:
        rows.append(measure(name, args.scale, args.rounds))
        print(_line(rows[-1]), flush=True)
    print(f"{'geo-mean':<17}{'':>20}{_geomean(r['torch_ratio'] for r in rows):>9.2f}"
          f"{'':>10}{_geomean(r['onnx_ratio'] for r in rows):>9.2f}")


if __name__ == "__main__":
    main()
