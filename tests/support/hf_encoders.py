"""Encoders of transformers shared by the re-batching tests (tests/refine/test_rebatch.py,
tests/refine/test_strip_batch.py): a wrapper that keeps one tensor out, random token ids, and a
tiny Whisper encoder (random weights, nothing downloaded); and the one-layer BERT file the
com.microsoft op tests hand to onnxruntime's optimizer and quantizer.
"""
from __future__ import annotations

import warnings

import torch
import transformers as T


class LastHidden(torch.nn.Module):
    """A transformers model with one tensor out: its last hidden state (of its positional
    inputs: ids or features, and an attention mask where given)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *inputs):
        return self.model(*inputs).last_hidden_state


def tokens(b):
    """A batch of ``b`` random sequences of 7 token ids below 100."""
    return (torch.randint(0, 100, (b, 7)),)


def whisper_encoder():
    """(a two-layer Whisper encoder, batch -> its example args)."""
    config = T.WhisperConfig(vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=1,
                             encoder_attention_heads=2, decoder_attention_heads=2,
                             encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
                             max_source_positions=16, max_target_positions=16, pad_token_id=0,
                             bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    # the encoder reads 2 * max_source_positions frames of num_mel_bins features
    return T.WhisperModel(config).get_encoder(), lambda b: (torch.randn(b, 8, 32),)


def one_layer_bert_file(path) -> dict:
    """A one-layer BERT (hidden 32, 2 heads) exported by torch.onnx (legacy, opset 17) to
    ``path``, inputs ``input_ids`` and ``attention_mask``; its feeds (a batch of one, the
    last two positions masked)."""
    torch.manual_seed(20)
    bert = T.BertModel(T.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=64,
                                    max_position_embeddings=16)).eval()
    ids, mask = torch.randint(0, 64, (1, 8)), torch.tensor([[1] * 6 + [0] * 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(LastHidden(bert), (ids, mask), str(path), dynamo=False,
                          opset_version=17, input_names=["input_ids", "attention_mask"])
    return {"input_ids": ids, "attention_mask": mask}
