"""BERT encoders with the SQuAD question-answering head or the masked-LM pre-training head, as
NVIDIA's DeepLearningExamples trains them (PyTorch/LanguageModeling/BERT, modeling.py +
run_squad.py / run_pretraining.py): post-LayerNorm layers, eager attention (Q Kᵀ as a batched
matmul, scale, additive mask, softmax, dropout, times V), a tanh-approximated GELU, dropout 0.1
after the embeddings, on the attention probabilities and after each projection; then a 2-way
span classifier over every position (SQuAD) or the vocabulary's logits for every position
(pre-training, the 2020 reference's criterion).

Written for analysis (and it trains): published BERT throughputs (sequences/s; SQuAD at
sequence length 384, pre-training at 128 and 512) are measured with this kernel sequence, so
dlperf predicts them from the same graph. The attention mask is built from the token ids (id 0 is padding), as the
original computes it from ``input_mask``: (1 - mask) x -10000, in the model's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class BertConfig:
    layers: int = 12
    d_model: int = 768
    heads: int = 12
    ffn: int = 3072
    vocab: int = 30522  # bert-*-uncased's WordPiece vocabulary
    max_positions: int = 512
    type_vocab: int = 2
    dropout: float = 0.1
    seq_len: int = 384  # run_squad.py's --max_seq_length default

    def __post_init__(self):
        for name in ("layers", "d_model", "heads", "ffn", "vocab", "max_positions", "seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"BERT {name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.heads:
            raise ValueError(f"BERT d_model ({self.d_model}) must be divisible by heads "
                             f"({self.heads})")


# run_pretraining.py's phase 1 (--max_seq_length 128; phase 2 runs 512)
PRETRAIN_SEQ_LEN = 128

# bert_configs/base.json and large.json of the reference implementation
CONFIGS = {"bert-base": BertConfig(),
           "bert-large": BertConfig(layers=24, d_model=1024, heads=16, ffn=4096)}


class SelfAttention(nn.Module):
    """Sequence-first, as the reference: x [T, B, C]; heads folded into the batch of two
    batched matmuls, so Q, K and V are read in place (no copies) and only the context is
    made contiguous once."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.d_model // cfg.heads
        self.query = nn.Linear(cfg.d_model, cfg.d_model)
        self.key = nn.Linear(cfg.d_model, cfg.d_model)
        self.value = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        t, b, c = x.shape
        bh = b * self.heads
        q = self.query(x).view(t, bh, self.head_dim).transpose(0, 1)  # [BH, T, D]
        k = self.key(x).view(t, bh, self.head_dim).permute(1, 2, 0)  # [BH, D, T]
        v = self.value(x).view(t, bh, self.head_dim).transpose(0, 1)  # [BH, T, D]
        scores = torch.bmm(q, k).view(b, self.heads, t, t) / math.sqrt(self.head_dim) + mask
        probs = self.dropout(F.softmax(scores, dim=-1)).view(bh, t, t)
        return torch.bmm(probs, v).transpose(0, 1).contiguous().view(t, b, c)


class Layer(nn.Module):
    """Post-LN: x = LN(x + drop(W_o attn(x))); x = LN(x + drop(W_2 gelu(W_1 x)))."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = SelfAttention(cfg)
        self.attention_out = nn.Linear(cfg.d_model, cfg.d_model)
        self.attention_norm = nn.LayerNorm(cfg.d_model, eps=1e-12)
        self.intermediate = nn.Linear(cfg.d_model, cfg.ffn)
        self.act = nn.GELU(approximate="tanh")
        self.output = nn.Linear(cfg.ffn, cfg.d_model)
        self.output_norm = nn.LayerNorm(cfg.d_model, eps=1e-12)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.dropout(self.attention_out(self.attention(x, mask))))
        return self.output_norm(x + self.dropout(self.output(self.act(self.intermediate(x)))))


class Encoder(nn.Module):
    """Embeddings (word + position + token type, LayerNorm, dropout) and the layers: token ids
    [B, T] -> hidden states [B, T, C]."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.word = nn.Embedding(cfg.vocab, cfg.d_model)
        self.position = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.token_type = nn.Embedding(cfg.type_vocab, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=1e-12)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        if t > self.cfg.max_positions:
            raise ValueError(f"sequence length {t} exceeds BERT's {self.cfg.max_positions} "
                             "positions")
        positions = torch.arange(t, device=ids.device)
        x = self.word(ids) + self.position(positions) + self.token_type(torch.zeros_like(ids))
        x = self.dropout(self.norm(x))
        # [B, 1, 1, T] additive mask in the activations' dtype: 0 for tokens, -10000 for padding
        mask = (ids == 0).to(x.dtype)[:, None, None, :] * -10000.0
        x = x.transpose(0, 1)  # [T, B, C] through the encoder, as the reference
        for layer in self.layers:
            x = layer(x, mask)
        return x.transpose(0, 1).contiguous()


class BertForPreTraining(nn.Module):
    """token ids [B, T] -> masked-LM logits [B, T, vocab] over every position, as the 2020
    reference computes them (run_pretraining.py's BertPretrainingCriterion takes a
    cross-entropy over all [B x T, vocab] logits, ignoring the unmasked labels; later versions
    gather the masked positions first, which the SQuAD model's cost stands in for). The head:
    dense C x C, GELU, LayerNorm, then the word embeddings transposed (tied, as the
    reference's BertLMPredictionHead) plus a bias. The next-sentence head (the pooler's
    C x C on the first token and a 2-way linear: under 0.1% of the step) is left out, so the
    logits are the one output the default loss differentiates."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.transform = nn.Linear(cfg.d_model, cfg.d_model)
        self.act = nn.GELU(approximate="tanh")
        self.transform_norm = nn.LayerNorm(cfg.d_model, eps=1e-12)
        self.decoder_bias = nn.Parameter(torch.zeros(cfg.vocab))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.transform_norm(self.act(self.transform(self.encoder(ids))))
        return F.linear(x, self.encoder.word.weight, self.decoder_bias)


class BertForQuestionAnswering(nn.Module):
    """token ids [B, T] -> span logits [B, 2, T] (start and end scores for every position; the
    default loss is then the reference's two cross-entropies over T). The reference's pooler
    (a [B, C] linear + tanh that SQuAD does not use) is left out: well under 0.1% of a step."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.qa_outputs = nn.Linear(cfg.d_model, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.qa_outputs(self.encoder(ids)).transpose(1, 2)
