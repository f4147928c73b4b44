"""Does tdag's pipeline hold on the architectures of Hugging Face ``transformers``? Each model
is built from a tiny config with random weights (nothing is downloaded; batch norms get random
statistics), put in eval mode without a KV cache, wrapped to return its first output (the
logits or the last hidden state), run once in eager mode for the reference, then taken
through every stage:

    attn      the attn_implementation it was built with: ``--attn`` where the model has it,
              else eager
    capture   ``prog = tdag.from_torch(model, args)`` (static shapes); nodes: ``prog.num_nodes``
    torch     ``tdag.to_torch(prog)(*args)`` against eager; torch err: max |difference| over
              max |eager|
    state     ``to_torch(prog).load_state_dict(model.state_dict())``, strict
    grad      the module's parameter gradients against eager's (autograd on both, the first
              output weighted at random); grad err: max |difference| over the largest
              eager gradient of any parameter
    onnx      ``tdag.to_onnx(prog)`` on onnxruntime's CPU provider against eager; onnx err
              as torch err
    cost      ``tdag.cost(prog)`` and ``tdag.memory(prog)`` run; flops: ``cost(prog).flops``
              (with a + where sizes data decides appear in it, at zero: Switch's rows per
              expert)

A stage that fails is printed as its exception's type (a stage after a failed capture or
build as ``-``), with a line below the row holding the first line of each message; an error
above 1e-4 is marked ``!``. The sizes are tiny (hidden 32, 2 layers, vocab 128, batch 2 of
12 tokens with the second sequence's last 3 padded, 32x32 or 64x64 images, a quarter second
of 16 kHz audio): 131 models take about five minutes on two cores. A class the installed
transformers lacks is skipped with the reason printed.

    python benchmarks/hf_zoo.py                        # every model
    python benchmarks/hf_zoo.py --list                 # the names, one a line
    python benchmarks/hf_zoo.py --only llama,whisper   # some of them
    python benchmarks/hf_zoo.py --attn sdpa            # sdpa where a model has it
    python benchmarks/hf_zoo.py --only rwkv,bit --traceback   # the failures' tracebacks
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnxruntime as ort
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]

import transformers as T  # noqa: E402

import tdag  # noqa: E402

BATCH, SEQ, VOCAB = 2, 12, 128
TOLERANCE = 1e-4
STAGES = ("capture", "torch", "state", "grad", "onnx", "cost")
FRAMES = 6  # of each traceback --traceback prints


class First(torch.nn.Module):
    """``model(**dict(zip(names, args)))[0]``: one tensor out of positional inputs, as
    from_torch, the reified module and the ONNX file all take them."""

    def __init__(self, model, names):
        super().__init__()
        self.model = model
        self.names = tuple(names)

    def forward(self, *args):
        return self.model(**dict(zip(self.names, args)))[0]


# -- inputs ------------------------------------------------------------------------------------

def _ids(seq: int = SEQ) -> torch.Tensor:
    return torch.randint(3, VOCAB, (BATCH, seq))


def _mask() -> torch.Tensor:
    """All ones but the last three positions of the second sequence (right padding)."""
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -3:] = 0
    return mask


def tokens():
    return {"input_ids": _ids()}


def text():
    return {"input_ids": _ids(), "attention_mask": _mask()}


def seq2seq():
    return {"input_ids": _ids(), "attention_mask": _mask(), "decoder_input_ids": _ids(7)}


def image(size: int):
    return lambda: {"pixel_values": torch.randn(BATCH, 3, size, size)}


def audio():
    return {"input_values": torch.randn(BATCH, 4000)}


def features():
    """Speech2Text's 48 frames of 16 filterbank features."""
    return {"input_features": torch.randn(BATCH, 48, 16), "attention_mask": torch.ones(
        BATCH, 48, dtype=torch.long), "decoder_input_ids": _ids(7)}


def speech():
    """Moonshine: raw audio and decoder tokens."""
    return {"input_values": torch.randn(BATCH, 4000), "decoder_input_ids": _ids(7)}


def spectrogram():
    """AST's 64 frames of 32 mel bins."""
    return {"input_values": torch.randn(BATCH, 64, 32)}


def series():
    """PatchTST's 32 steps of 3 channels."""
    return {"past_values": torch.randn(BATCH, 32, 3)}


def image_text():
    return {**text(), **image(32)()}


def mel():
    """Whisper's 16 mel bins over 2 * max_source_positions frames, and decoder tokens."""
    return {"input_features": torch.randn(BATCH, 16, 64), "decoder_input_ids": _ids(7)}


# -- the zoo -----------------------------------------------------------------------------------

@dataclass
class Spec:
    model: str  # a transformers class
    config: str  # its config class
    inputs: Callable[[], dict]
    kwargs: dict = field(default_factory=dict)


DECODER = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
               pad_token_id=0)
ENCODER = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64, max_position_embeddings=64)
BART = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
            decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=1, bos_token_id=0,
            eos_token_id=2, decoder_start_token_id=2)
T5 = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
          decoder_start_token_id=0)
VIT = dict(image_size=32, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
           num_attention_heads=4, intermediate_size=64)
SPEECH = dict(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, conv_dim=(16, 16, 16), conv_stride=(5, 4, 2),
              conv_kernel=(10, 8, 4), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
MIXED = ["sliding_attention", "full_attention"]  # layer_types: one windowed layer, one full
MOE = dict(DECODER, num_experts_per_tok=2)
MAMBA = dict(vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
             conv_kernel=4, time_step_rank=4)
CLIP_TEXT = dict(ENCODER, max_position_embeddings=16)
# initializer_range above 0.02 in the deep convolutional nets: with N(0, 0.02) weights their
# activations fade within a few layers, and every image gives the same output

MODELS = {
    # decoders
    "gpt2": Spec("GPT2LMHeadModel", "GPT2Config", text, dict(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)),
    "gpt_neo": Spec("GPTNeoForCausalLM", "GPTNeoConfig", text, dict(
        vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4,
        attention_types=[[["global", "local"], 1]], window_size=4, max_position_embeddings=64)),
    "gptj": Spec("GPTJForCausalLM", "GPTJConfig", text, dict(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64)),
    "codegen": Spec("CodeGenForCausalLM", "CodeGenConfig", text, dict(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64,
        n_ctx=64)),
    "gpt_neox": Spec("GPTNeoXForCausalLM", "GPTNeoXConfig", text, dict(
        ENCODER, rotary_pct=0.5)),
    "llama": Spec("LlamaForCausalLM", "LlamaConfig", text, DECODER),
    "mistral": Spec("MistralForCausalLM", "MistralConfig", text, dict(DECODER, sliding_window=8)),
    "qwen2": Spec("Qwen2ForCausalLM", "Qwen2Config", text, DECODER),
    "qwen3": Spec("Qwen3ForCausalLM", "Qwen3Config", text, dict(DECODER, head_dim=8)),
    "phi": Spec("PhiForCausalLM", "PhiConfig", text, dict(DECODER, partial_rotary_factor=0.5)),
    "phi3": Spec("Phi3ForCausalLM", "Phi3Config", text, DECODER),
    "gemma": Spec("GemmaForCausalLM", "GemmaConfig", text, dict(DECODER, head_dim=8)),
    "gemma2": Spec("Gemma2ForCausalLM", "Gemma2Config", text, dict(
        DECODER, head_dim=8, sliding_window=8, query_pre_attn_scalar=8)),
    "gemma3": Spec("Gemma3ForCausalLM", "Gemma3TextConfig", text, dict(
        DECODER, head_dim=8, sliding_window=8, query_pre_attn_scalar=8, layer_types=MIXED)),
    "falcon": Spec("FalconForCausalLM", "FalconConfig", text, dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)),
    "bloom": Spec("BloomForCausalLM", "BloomConfig", text, dict(
        vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)),
    "opt": Spec("OPTForCausalLM", "OPTConfig", text, dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
        num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32)),
    "stablelm": Spec("StableLmForCausalLM", "StableLmConfig", text, DECODER),
    "olmo": Spec("OlmoForCausalLM", "OlmoConfig", text, DECODER),
    "olmo2": Spec("Olmo2ForCausalLM", "Olmo2Config", text, DECODER),
    "gpt_bigcode": Spec("GPTBigCodeForCausalLM", "GPTBigCodeConfig", text, dict(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)),
    "mpt": Spec("MptForCausalLM", "MptConfig", text, dict(
        vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, expansion_ratio=2,
        max_seq_len=64)),
    "granite": Spec("GraniteForCausalLM", "GraniteConfig", text, DECODER),
    "cohere": Spec("CohereForCausalLM", "CohereConfig", text, DECODER),
    "starcoder2": Spec("Starcoder2ForCausalLM", "Starcoder2Config", text, DECODER),
    "persimmon": Spec("PersimmonForCausalLM", "PersimmonConfig", text, dict(
        DECODER, partial_rotary_factor=0.5)),
    "nemotron": Spec("NemotronForCausalLM", "NemotronConfig", text, dict(
        DECODER, head_dim=8, partial_rotary_factor=0.5)),
    "helium": Spec("HeliumForCausalLM", "HeliumConfig", text, dict(DECODER, head_dim=8)),
    "glm": Spec("GlmForCausalLM", "GlmConfig", text, dict(DECODER, head_dim=8)),
    "smollm3": Spec("SmolLM3ForCausalLM", "SmolLM3Config", text, DECODER),
    "cohere2": Spec("Cohere2ForCausalLM", "Cohere2Config", text, dict(
        DECODER, sliding_window=8, layer_types=MIXED)),
    "exaone4": Spec("Exaone4ForCausalLM", "Exaone4Config", text, dict(
        DECODER, sliding_window=8, layer_types=MIXED)),
    "diffllama": Spec("DiffLlamaForCausalLM", "DiffLlamaConfig", text, DECODER),
    "biogpt": Spec("BioGptForCausalLM", "BioGptConfig", text, ENCODER),
    "xglm": Spec("XGLMForCausalLM", "XGLMConfig", text, dict(
        vocab_size=VOCAB, d_model=32, num_layers=2, attention_heads=4, ffn_dim=64,
        max_position_embeddings=64)),
    # mixtures of experts
    "mixtral": Spec("MixtralForCausalLM", "MixtralConfig", text, dict(MOE, num_local_experts=4)),
    "qwen2_moe": Spec("Qwen2MoeForCausalLM", "Qwen2MoeConfig", text, dict(
        MOE, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=32)),
    "qwen3_moe": Spec("Qwen3MoeForCausalLM", "Qwen3MoeConfig", text, dict(
        MOE, num_experts=4, moe_intermediate_size=32)),
    "olmoe": Spec("OlmoeForCausalLM", "OlmoeConfig", text, dict(MOE, num_experts=4)),
    "phimoe": Spec("PhimoeForCausalLM", "PhimoeConfig", text, dict(MOE, num_local_experts=4)),
    "granitemoe": Spec("GraniteMoeForCausalLM", "GraniteMoeConfig", text, dict(
        MOE, num_local_experts=4)),
    "dbrx": Spec("DbrxForCausalLM", "DbrxConfig", text, dict(
        vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, max_seq_len=64,
        attn_config={"kv_n_heads": 2, "rope_theta": 1e4, "clip_qkv": 8.0}, ffn_config={
            "ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2})),
    "gpt_oss": Spec("GptOssForCausalLM", "GptOssConfig", text, dict(
        MOE, head_dim=8, num_local_experts=4, intermediate_size=32, sliding_window=8)),
    "llama4": Spec("Llama4ForCausalLM", "Llama4TextConfig", text, dict(
        MOE, head_dim=8, num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=64,
        attention_chunk_size=8)),
    "deepseek_v3": Spec("DeepseekV3ForCausalLM", "DeepseekV3Config", text, dict(
        MOE, num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4,
        n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1, kv_lora_rank=16,
        q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8)),
    # state spaces
    "mamba": Spec("MambaForCausalLM", "MambaConfig", tokens, MAMBA),
    "mamba2": Spec("Mamba2ForCausalLM", "Mamba2Config", tokens, dict(
        vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
        num_heads=8, head_dim=8, n_groups=1, conv_kernel=4, chunk_size=8)),
    "falcon_mamba": Spec("FalconMambaForCausalLM", "FalconMambaConfig", tokens, MAMBA),
    "rwkv": Spec("RwkvForCausalLM", "RwkvConfig", tokens, dict(
        vocab_size=VOCAB, context_length=64, hidden_size=32, num_hidden_layers=2,
        attention_hidden_size=32, intermediate_size=64)),
    "recurrent_gemma": Spec("RecurrentGemmaForCausalLM", "RecurrentGemmaConfig", text, dict(
        DECODER, num_key_value_heads=1, lru_width=32, attention_window_size=8,
        conv1d_width=4, block_types=["recurrent", "attention"])),
    "lfm2": Spec("Lfm2ForCausalLM", "Lfm2Config", text, dict(
        DECODER, layer_types=["conv", "full_attention"])),
    "jamba": Spec("JambaForCausalLM", "JambaConfig", text, dict(
        MOE, num_experts=4, expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2,
        attn_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4)),
    "bamba": Spec("BambaForCausalLM", "BambaConfig", text, dict(
        DECODER, attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=1,
        mamba_d_state=8, mamba_expand=2, mamba_chunk_size=8)),
    # encoders
    "bert": Spec("BertModel", "BertConfig", text, ENCODER),
    "roberta": Spec("RobertaModel", "RobertaConfig", text, ENCODER),
    "xlm_roberta": Spec("XLMRobertaModel", "XLMRobertaConfig", text, ENCODER),
    "distilbert": Spec("DistilBertModel", "DistilBertConfig", text, dict(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
        max_position_embeddings=64)),
    "albert": Spec("AlbertModel", "AlbertConfig", text, dict(ENCODER, embedding_size=16)),
    "electra": Spec("ElectraModel", "ElectraConfig", text, dict(ENCODER, embedding_size=16)),
    "deberta": Spec("DebertaModel", "DebertaConfig", text, dict(
        ENCODER, relative_attention=True, pos_att_type=["c2p", "p2c"])),
    "deberta_v2": Spec("DebertaV2Model", "DebertaV2Config", text, dict(
        ENCODER, relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=8)),
    "mpnet": Spec("MPNetModel", "MPNetConfig", text, ENCODER),
    "camembert": Spec("CamembertModel", "CamembertConfig", text, ENCODER),
    "ernie": Spec("ErnieModel", "ErnieConfig", text, ENCODER),
    "data2vec_text": Spec("Data2VecTextModel", "Data2VecTextConfig", text, ENCODER),
    "megatron_bert": Spec("MegatronBertModel", "MegatronBertConfig", text, ENCODER),
    "roformer": Spec("RoFormerModel", "RoFormerConfig", text, dict(ENCODER, embedding_size=32)),
    "convbert": Spec("ConvBertModel", "ConvBertConfig", text, dict(
        ENCODER, embedding_size=32, head_ratio=2, conv_kernel_size=3)),
    "mobilebert": Spec("MobileBertModel", "MobileBertConfig", text, dict(
        ENCODER, embedding_size=16, intra_bottleneck_size=16,
        num_feedforward_networks=2)),
    "rembert": Spec("RemBertModel", "RemBertConfig", text, dict(
        ENCODER, input_embedding_size=16, output_embedding_size=16)),
    "esm": Spec("EsmModel", "EsmConfig", text, dict(
        ENCODER, position_embedding_type="rotary", pad_token_id=1, mask_token_id=2)),
    "funnel": Spec("FunnelModel", "FunnelConfig", text, dict(
        vocab_size=VOCAB, block_sizes=[1, 1], d_model=32, n_head=4, d_head=8, d_inner=64,
        num_decoder_layers=1)),
    "big_bird": Spec("BigBirdModel", "BigBirdConfig", text, dict(
        ENCODER, attention_type="original_full")),
    "longformer": Spec("LongformerModel", "LongformerConfig", text, dict(
        ENCODER, attention_window=4)),
    "canine": Spec("CanineModel", "CanineConfig", text, dict(
        ENCODER, num_hash_buckets=64, downsampling_rate=4)),
    "xlm": Spec("XLMModel", "XLMConfig", text, dict(
        vocab_size=VOCAB, emb_dim=32, n_layers=2, n_heads=4, max_position_embeddings=64)),
    "modernbert": Spec("ModernBertModel", "ModernBertConfig", text, dict(
        ENCODER, global_attn_every_n_layers=2, local_attention=8, pad_token_id=0)),
    # encoder-decoders
    "t5": Spec("T5Model", "T5Config", seq2seq, T5),
    "mt5": Spec("MT5Model", "MT5Config", seq2seq, T5),
    "bart": Spec("BartModel", "BartConfig", seq2seq, BART),
    "mbart": Spec("MBartModel", "MBartConfig", seq2seq, BART),
    "marian": Spec("MarianModel", "MarianConfig", seq2seq, dict(
        BART, pad_token_id=1, decoder_start_token_id=1)),
    "pegasus": Spec("PegasusModel", "PegasusConfig", seq2seq, BART),
    "m2m100": Spec("M2M100Model", "M2M100Config", seq2seq, BART),
    "blenderbot": Spec("BlenderbotModel", "BlenderbotConfig", seq2seq, BART),
    "longt5": Spec("LongT5Model", "LongT5Config", seq2seq, dict(
        T5, encoder_attention_type="transient-global", local_radius=2, global_block_size=4)),
    "switch": Spec("SwitchTransformersModel", "SwitchTransformersConfig", seq2seq, dict(
        T5, num_experts=4, expert_capacity=8, num_sparse_encoder_layers=1,
        num_sparse_decoder_layers=1)),
    "prophetnet": Spec("ProphetNetModel", "ProphetNetConfig", seq2seq, dict(
        vocab_size=VOCAB, hidden_size=32, num_encoder_layers=2, num_decoder_layers=2,
        num_encoder_attention_heads=4, num_decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, ngram=2, num_buckets=8,
        relative_max_distance=16)),
    "speech2text": Spec("Speech2TextModel", "Speech2TextConfig", features, dict(
        BART, max_source_positions=64, conv_channels=32, input_feat_per_channel=16)),
    "moonshine": Spec("MoonshineModel", "MoonshineConfig", speech, dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, encoder_num_hidden_layers=2,
        decoder_num_hidden_layers=2, encoder_num_attention_heads=4,
        decoder_num_attention_heads=4, max_position_embeddings=64)),
    "whisper": Spec("WhisperModel", "WhisperConfig", mel, dict(
        BART, num_mel_bins=16, max_source_positions=32, max_target_positions=32)),
    # vision
    "vit": Spec("ViTModel", "ViTConfig", image(32), VIT),
    "deit": Spec("DeiTModel", "DeiTConfig", image(32), VIT),
    "beit": Spec("BeitModel", "BeitConfig", image(32), dict(
        VIT, use_relative_position_bias=True)),
    "dinov2": Spec("Dinov2Model", "Dinov2Config", image(32), dict(VIT, mlp_ratio=2)),
    "swin": Spec("SwinModel", "SwinConfig", image(32), dict(
        image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4],
        window_size=4)),
    "convnext": Spec("ConvNextModel", "ConvNextConfig", image(64), dict(
        hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)),
    "resnet": Spec("ResNetModel", "ResNetConfig", image(64), dict(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")),
    "mobilenet_v2": Spec("MobileNetV2Model", "MobileNetV2Config", image(64), dict(
        image_size=64, depth_multiplier=0.35, initializer_range=0.2)),
    "efficientnet": Spec("EfficientNetModel", "EfficientNetConfig", image(64), dict(
        image_size=64, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320,
        initializer_range=0.3)),
    "regnet": Spec("RegNetModel", "RegNetConfig", image(64), dict(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8)),
    "segformer": Spec("SegformerModel", "SegformerConfig", image(64), dict(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2])),
    "swinv2": Spec("Swinv2Model", "Swinv2Config", image(32), dict(
        image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4],
        window_size=4)),
    "convnextv2": Spec("ConvNextV2Model", "ConvNextV2Config", image(64), dict(
        hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)),
    "mobilenet_v1": Spec("MobileNetV1Model", "MobileNetV1Config", image(64), dict(
        image_size=64, depth_multiplier=0.25, initializer_range=0.3)),
    "bit": Spec("BitModel", "BitConfig", image(64), dict(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_groups=4)),
    "poolformer": Spec("PoolFormerModel", "PoolFormerConfig", image(64), dict(
        hidden_sizes=[16, 32], depths=[1, 1], num_encoder_blocks=2, patch_sizes=[7, 3],
        strides=[4, 2], padding=[2, 1], mlp_ratio=2.0)),
    "levit": Spec("LevitModel", "LevitConfig", image(64), dict(
        image_size=64, hidden_sizes=[16, 32, 48], num_attention_heads=[2, 4, 6],
        key_dim=[8, 8, 8], depths=[1, 1, 1], mlp_ratio=[2, 2, 2], attention_ratio=[2, 2, 2],
        initializer_range=0.2)),
    "mobilevit": Spec("MobileViTModel", "MobileViTConfig", image(64), dict(
        image_size=64, hidden_sizes=[32, 40, 48], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
        num_attention_heads=2, initializer_range=0.2)),
    "focalnet": Spec("FocalNetModel", "FocalNetConfig", image(32), dict(
        image_size=32, patch_size=4, embed_dim=16, hidden_sizes=[16, 32], depths=[1, 1],
        focal_levels=[2, 2], focal_windows=[3, 3])),
    "pvt": Spec("PvtModel", "PvtConfig", image(64), dict(
        image_size=64, num_encoder_blocks=2, depths=[1, 1], sequence_reduction_ratios=[2, 1],
        hidden_sizes=[16, 32], patch_sizes=[4, 2], strides=[4, 2], num_attention_heads=[1, 2],
        mlp_ratios=[2, 2])),
    "glpn": Spec("GLPNForDepthEstimation", "GLPNConfig", image(64), dict(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
        decoder_hidden_size=16, initializer_range=0.1)),
    "dpt": Spec("DPTForDepthEstimation", "DPTConfig", image(32), dict(
        VIT, backbone_out_indices=[0, 1], neck_hidden_sizes=[16, 32], reassemble_factors=[4, 2],
        fusion_hidden_size=16, head_in_index=-1)),
    "yolos": Spec("YolosModel", "YolosConfig", image(32), dict(
        VIT, image_size=[32, 32], num_detection_tokens=4)),
    "data2vec_vision": Spec("Data2VecVisionModel", "Data2VecVisionConfig", image(32), dict(
        VIT, use_relative_position_bias=True)),
    "clip": Spec("CLIPModel", "CLIPConfig", image_text, dict(
        text_config=CLIP_TEXT, vision_config=VIT, projection_dim=16)),
    "clip_vision": Spec("CLIPVisionModel", "CLIPVisionConfig", image(32), VIT),
    "clip_text": Spec("CLIPTextModel", "CLIPTextConfig", text, CLIP_TEXT),
    "siglip_vision": Spec("SiglipVisionModel", "SiglipVisionConfig", image(32), VIT),
    "siglip_text": Spec("SiglipTextModel", "SiglipTextConfig", text, CLIP_TEXT),
    # audio
    "wav2vec2": Spec("Wav2Vec2Model", "Wav2Vec2Config", audio, SPEECH),
    "hubert": Spec("HubertModel", "HubertConfig", audio, SPEECH),
    "wavlm": Spec("WavLMModel", "WavLMConfig", audio, SPEECH),
    "data2vec_audio": Spec("Data2VecAudioModel", "Data2VecAudioConfig", audio, SPEECH),
    "sew": Spec("SEWModel", "SEWConfig", audio, dict(SPEECH, squeeze_factor=2)),
    "sew_d": Spec("SEWDModel", "SEWDConfig", audio, dict(
        SPEECH, squeeze_factor=2, position_buckets=16, max_position_embeddings=64)),
    "unispeech": Spec("UniSpeechModel", "UniSpeechConfig", audio, SPEECH),
    "unispeech_sat": Spec("UniSpeechSatModel", "UniSpeechSatConfig", audio, SPEECH),
    "wav2vec2_conformer": Spec("Wav2Vec2ConformerModel", "Wav2Vec2ConformerConfig", audio, dict(
        SPEECH, conv_depthwise_kernel_size=3)),
    "ast": Spec("ASTModel", "ASTConfig", spectrogram, dict(
        VIT, patch_size=16, frequency_stride=8, time_stride=8, max_length=64, num_mel_bins=32)),
    # time series
    "patchtst": Spec("PatchTSTModel", "PatchTSTConfig", series, dict(
        num_input_channels=3, context_length=32, patch_length=8, patch_stride=8,
        num_hidden_layers=2, d_model=32, num_attention_heads=4, ffn_dim=64)),
}


def missing(spec: Spec) -> str | None:
    """Why the installed transformers cannot build ``spec``, or None."""
    lacking = [name for name in (spec.model, spec.config) if not hasattr(T, name)]
    return f"transformers {T.__version__} has no {', '.join(lacking)}" if lacking else None


def randomize_batch_norms(model: torch.nn.Module) -> None:
    """Random statistics and scales for every batch norm: as built they hold mean 0 and
    variance 1 (nothing for a program to get wrong), and some transformers draw their scales
    from N(0, 0.02), which over a deep network takes the activations to exactly 0."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                if m.affine:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.normal_(0, 0.1)


def build(spec: Spec, attn: str) -> tuple[torch.nn.Module, tuple, str]:
    """(the wrapped model in eval mode, its example args, its attn_implementation): ``attn``
    where the model supports it, else eager."""
    config_cls, model_cls = getattr(T, spec.config), getattr(T, spec.model)
    if not getattr(model_cls, f"_supports_{attn}", attn == "eager"):
        attn = "eager"
    config = config_cls(**spec.kwargs, attn_implementation=attn)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    inputs = spec.inputs()
    model = First(model_cls(config), inputs).eval()
    randomize_batch_norms(model)
    return model, tuple(inputs.values()), attn


# -- the stages --------------------------------------------------------------------------------

def relative_error(got, want: torch.Tensor) -> float:
    """max |got - want| / max |want|, after checking that the shapes agree."""
    got = torch.as_tensor(np.asarray(got)) if not isinstance(got, torch.Tensor) else got
    if got.shape != want.shape:
        raise ValueError(f"output shape {tuple(got.shape)}, eager's {tuple(want.shape)}")
    return float((got.double() - want.double()).abs().max() / want.double().abs().max())


def gradient_error(model: torch.nn.Module, module: torch.nn.Module, args) -> float:
    """max |module's - eager's gradient| over every parameter, relative to the largest eager
    gradient of any (one scale for all: a key projection's bias has the gradient zero but
    for rounding), for one random weighting of the first output. A tied weight counts
    under whichever of its names the module keeps; one the module lacks is an inf."""
    weights, threads = None, torch.get_num_threads()
    for m in (model, module):
        m.zero_grad(set_to_none=True)
        # eager's reference on one thread: on two, torch's own backward gives MobileNet-v2's
        # 1x1 conv weights gradients 1.2% of the largest off a float64 run (one thread, and
        # the module on one or two, within 1.1e-6 of it)
        torch.set_num_threads(1 if m is model else threads)
        try:
            out = torch.utils._pytree.tree_leaves(m(*args))[0]
            if weights is None:
                weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
            (out.double() * weights).sum().backward()
        finally:
            torch.set_num_threads(threads)
    eager = dict(model.named_parameters(remove_duplicate=False))
    grads = [p.grad for p in eager.values() if p.grad is not None]
    scale = max((float(g.abs().max()) for g in grads), default=0.0) or 1.0
    ours = dict(module.named_parameters())
    kept: dict[int, torch.Tensor | None] = {}  # each eager tensor -> the module's gradient
    for name, param in eager.items():
        if param.grad is not None and kept.get(id(param)) is None:
            kept[id(param)] = ours[name].grad if name in ours else None
    worst = 0.0
    for param in {id(p): p for p in eager.values() if p.grad is not None}.values():
        got = kept[id(param)]
        if got is None:
            if param.grad.abs().max() > 0:
                return float("inf")
            continue
        worst = max(worst, float((got - param.grad).abs().max()) / scale)
    return worst


def onnx_output(prog, args) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(tdag.to_onnx(prog).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    if len(names) != len(args):
        raise ValueError(f"the file takes {len(names)} inputs, the model {len(args)}")
    return session.run(None, {n: a.numpy() for n, a in zip(names, args)})[0]


@dataclass
class Row:
    name: str
    attn: str = "-"
    nodes: int | None = None
    results: dict = field(default_factory=dict)  # stage -> "ok" or the exception
    torch_err: float | None = None
    grad_err: float | None = None
    onnx_err: float | None = None
    flops: object = None  # an int, or an expression in sizes data decides
    seconds: float = 0.0


def run_stage(row: Row, stage: str, fn) -> None:
    try:
        fn()
        row.results[stage] = "ok"
    except Exception as exc:  # one stage's failure is one cell of the table
        row.results[stage] = exc


@contextlib.contextmanager
def quiet():
    """Nothing printed: not transformers' warnings, nor the whole graph torch.export writes
    to stderr on some failures."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def check(name: str, spec: Spec, attn: str) -> Row:
    with quiet():
        return _check(name, spec, attn)


def _check(name: str, spec: Spec, attn: str) -> Row:
    row, start = Row(name), time.perf_counter()
    torch.manual_seed(0)
    try:
        model, args, row.attn = build(spec, attn)
        with torch.no_grad():
            want = model(*args)
    except Exception as exc:  # the config is wrong, or the class breaks under this torch
        row.results["build"] = exc
        row.seconds = time.perf_counter() - start
        return row
    made = {}  # what the stages made: the program, the module

    def capture():
        made["prog"] = tdag.from_torch(model, args)
        row.nodes = made["prog"].num_nodes

    def reified():
        made["module"] = tdag.to_torch(made["prog"])
        with torch.no_grad():
            row.torch_err = relative_error(made["module"](*args), want)

    def gradients():
        row.grad_err = gradient_error(model, made["module"], args)

    def onnx():
        row.onnx_err = relative_error(onnx_output(made["prog"], args), want)

    def cost():
        row.flops = tdag.cost(made["prog"]).flops
        tdag.memory(made["prog"])

    run_stage(row, "capture", capture)
    if "prog" in made:
        run_stage(row, "torch", reified)
        if "module" in made:
            run_stage(row, "state", lambda: made["module"].load_state_dict(model.state_dict()))
            run_stage(row, "grad", gradients)
        run_stage(row, "onnx", onnx)
        run_stage(row, "cost", cost)
    row.seconds = time.perf_counter() - start
    return row


# -- the table ---------------------------------------------------------------------------------

COLUMNS = (("model", "<18"), ("attn", "<5"), ("nodes", ">5"), *((s, ">18") for s in STAGES),
           ("torch err", ">10"), ("grad err", ">10"), ("onnx err", ">10"), ("flops", ">10"),
           ("s", ">6"))


def _cell(result) -> str:
    if result is None:
        return "-"
    return result if isinstance(result, str) else type(result).__name__


def _error(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1e}" + ("!" if not value <= TOLERANCE else "")


def _message(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _flops(flops) -> str:
    """``flops``, or where sizes data decides appear in it (the rows each expert takes) its
    value with those at zero and a +."""
    if flops is None:
        return "-"
    if isinstance(flops, int) or flops.is_Integer:
        return f"{int(flops):.2e}"
    return f"{float(flops.subs({s: 0 for s in flops.free_symbols})):.2e}+"


def line(row: Row) -> str:
    cells = (row.name, row.attn, "-" if row.nodes is None else str(row.nodes),
             *(_cell(row.results.get(s)) for s in STAGES), _error(row.torch_err),
             _error(row.grad_err), _error(row.onnx_err), _flops(row.flops),
             f"{row.seconds:.1f}")
    return "".join(format(c, a) + " " for c, (_, a) in zip(cells, COLUMNS)).rstrip()


def failures(row: Row, tracebacks: bool) -> list[str]:
    """A line per failed stage: its message, and with ``tracebacks`` the innermost frames of
    its traceback and of each exception it was raised from."""
    out = []
    for stage, result in row.results.items():
        if isinstance(result, BaseException):
            out.append(f"    {stage}: {_message(result)}")
            if tracebacks:
                out.extend("      " + t for t in "".join(
                    traceback.format_exception(result, limit=-FRAMES)).rstrip().splitlines())
    return out


def passed(row: Row) -> bool:
    return (all(row.results.get(s) == "ok" for s in STAGES)
            and row.torch_err <= TOLERANCE and row.grad_err <= TOLERANCE
            and row.onnx_err <= TOLERANCE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--list", action="store_true", help="print the model names and exit")
    parser.add_argument("--attn", choices=("eager", "sdpa"), default="eager",
                        help="attn_implementation where a model has it (else eager)")
    parser.add_argument("--traceback", action="store_true",
                        help="print the innermost frames of each failure's traceback")
    opts = parser.parse_args()
    if opts.list:
        print("\n".join(MODELS))
        return
    names = opts.only.split(",") if opts.only else list(MODELS)
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    T.logging.set_verbosity_error()  # its handler holds the real stderr, past quiet()
    print(f"transformers {T.__version__}, torch {torch.__version__}, onnxruntime "
          f"{ort.__version__}; batch {BATCH}, err: max |diff| / max |eager|, ! above "
          f"{TOLERANCE:g}")
    print("".join(format(t, a) + " " for t, a in COLUMNS).rstrip())
    rows, skipped = [], []
    for name in names:
        reason = missing(MODELS[name])
        if reason:
            skipped.append(name)
            print(f"{name:<18} skipped: {reason}", flush=True)
            continue
        rows.append(check(name, MODELS[name], opts.attn))
        print("\n".join([line(rows[-1]), *failures(rows[-1], opts.traceback)]), flush=True)
    clean = sum(passed(r) for r in rows)
    print(f"{clean}/{len(rows)} models pass every stage within {TOLERANCE:g}; "
          f"{len(skipped)} skipped; {sum(r.seconds for r in rows):.0f} s")


if __name__ == "__main__":
    main()
