"""The built-in BERT (DeepLearningExamples' SQuAD model): its math, its size, and its capture."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dlperf.analysis.capture import capture
from dlperf.analysis.costs import record_costs
from dlperf.models.bert import CONFIGS, BertConfig, BertForQuestionAnswering
from dlperf.models.registry import build_model

SMALL = BertConfig(layers=2, d_model=64, heads=4, ffn=128, vocab=100, seq_len=16)


def _batch_first_reference(m: BertForQuestionAnswering, ids: torch.Tensor) -> torch.Tensor:
    """The same weights through plain batch-first multi-head attention (eval: no dropout)."""
    b, t = ids.shape
    e = m.encoder
    x = e.norm(e.word(ids) + e.position(torch.arange(t)) + e.token_type(torch.zeros_like(ids)))
    mask = (ids == 0).to(x.dtype)[:, None, None, :] * -10000.0
    for layer in e.layers:
        a = layer.attention

        def heads(y):
            return y.view(b, t, a.heads, a.head_dim).transpose(1, 2)

        scores = heads(a.query(x)) @ heads(a.key(x)).transpose(-1, -2) / math.sqrt(a.head_dim)
        ctx = (torch.softmax(scores + mask, -1) @ heads(a.value(x))).transpose(1, 2)
        x = layer.attention_norm(x + layer.attention_out(ctx.reshape(b, t, -1)))
        x = layer.output_norm(x + layer.output(layer.act(layer.intermediate(x))))
    return m.qa_outputs(x).transpose(1, 2)


def test_sequence_first_attention_equals_batch_first_in_float64():
    torch.manual_seed(0)
    m = BertForQuestionAnswering(SMALL).double().eval()
    ids = torch.randint(1, 100, (3, 16))
    ids[:, -5:] = 0  # padding: masked out of every attention row
    out = m(ids)
    assert out.shape == (3, 2, 16)
    torch.testing.assert_close(out, _batch_first_reference(m, ids), rtol=1e-12, atol=1e-12)


def test_bert_large_has_the_published_parameter_count():
    # Embeddings 30522*1024 + 512*1024 + 2*1024 + LayerNorm 2*1024 = 31,782,912; a layer:
    # QKV 3*(1024^2 + 1024) + out 1024^2 + 1024 + LN 2048 + FFN 1024*4096 + 4096 + 4096*1024 +
    # 1024 + LN 2048 = 12,596,224, x 24 = 302,309,376; encoder 334,092,288 = Hugging Face's
    # bert-large-uncased (335,141,888) without its 1,049,600-parameter pooler; + QA head 2,050.
    model, inp = build_model("bert-large")
    assert sum(p.numel() for p in model.parameters()) == 334_092_288 + 2_050
    assert inp.shape == (384,) and inp.dtype == torch.long and inp.kind == "tokens"
    assert build_model("bert_base")[0].cfg == CONFIGS["bert-base"]


@pytest.mark.parametrize("head", ["squad", "pretraining"])
def test_bert_gemm_flops_match_torch_flop_counter_forward_and_backward(head):
    # the pre-training head's B*T x C x vocab decoder (tied weights) counted as torch counts it
    from dlperf.models.bert import BertForPreTraining

    torch.manual_seed(0)
    m = (BertForQuestionAnswering if head == "squad" else BertForPreTraining)(SMALL)
    ids = torch.randint(1, 100, (2, 16))
    with FlopCounterMode(display=False) as counter:
        m(ids).float().sum().backward()
    cap = capture(m, (ids,), train=True, loss_fn=lambda out: out.float().sum())
    ours = sum(c.flops for r in cap.records for c in record_costs(r) or [] if c.kind == "gemm")
    assert ours == counter.get_total_flops() > 0


def test_dropout_is_the_fused_cuda_kernel_and_attention_is_two_bmms():
    import dlperf

    m, _ = build_model("bert-base")
    a = dlperf.analyze(m, (2, 128), device="a100-80gb", dtype="fp16", precision="half",
                       input_dtype=torch.long, optimizer="adamw")
    ops = [p.cost.op for p in a.predictions if p.cost.phase == "forward"]
    # per layer: attention probs, after the attention projection and after the FFN; + embeddings
    assert ops.count("native_dropout") == 3 * 12 + 1 and "bernoulli_" not in ops
    assert ops.count("bmm") == 2 * 12
    # model.half(): every GEMM in fp16, nothing cast per op
    assert {p.cost.dtype for p in a.predictions if p.cost.kind == "gemm"} == {"fp16"}
    assert a.totals()["tokens_per_s"] == pytest.approx(a.totals()["samples_per_s"] * 128)


def test_sequence_longer_than_the_position_table_is_refused_in_one_line():
    import dlperf
    from dlperf.errors import DlperfError

    with pytest.raises(DlperfError, match="exceeds BERT's 512 positions"):
        dlperf.analyze("bert-base", (1, 600), input_dtype=torch.long)


def test_pretraining_head_scores_every_token_with_the_tied_word_embeddings_in_float64():
    # run_pretraining.py of 2020: logits [B, T, vocab] = LN(gelu(W h + b)) Eᵀ + bias over every
    # position, E the word embeddings (one tensor: the head adds no vocab x C matrix)
    from dlperf.models.bert import BertForPreTraining

    torch.manual_seed(0)
    m = BertForPreTraining(SMALL).double().eval()
    ids = torch.randint(1, 100, (3, 16))
    out = m(ids)
    assert out.shape == (3, 16, 100)
    h = m.encoder(ids)
    expected = m.transform_norm(m.act(m.transform(h))) @ m.encoder.word.weight.T + m.decoder_bias
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    # the word embeddings get gradient from the head too: id 0 is never looked up here, yet
    # its row has one
    out.sum().backward()
    assert m.encoder.word.weight.grad[0].abs().sum() > 0


def test_bert_large_pretrain_has_the_published_parameter_count():
    # Hugging Face's BertForPreTraining (bert-large-uncased) holds 336,226,108: the encoder
    # 334,092,288 + pooler 1,049,600 + MLM transform 1,024^2 + 1,024 = 1,049,600 + LayerNorm
    # 2,048 + decoder bias 30,522 + NSP 2,050. Without the pooler and the NSP head:
    # 336,226,108 - 1,049,600 - 2,050 = 335,174,458 (the decoder's weight is the tied embedding)
    model, inp = build_model("bert-large-pretrain")
    assert sum(p.numel() for p in model.parameters()) == 335_174_458
    assert inp.shape == (128,) and inp.dtype == torch.long and inp.kind == "tokens"
    assert build_model("bert_base_pretrain")[0].cfg == CONFIGS["bert-base"]


def test_pretraining_loss_is_a_cross_entropy_over_the_vocabulary_for_every_token():
    # the default loss takes its log-softmax over [B*T, vocab]: 2 x 16 rows of 100
    from dlperf.models.bert import BertForPreTraining

    m = BertForPreTraining(SMALL)
    ids = torch.randint(1, 100, (2, 16))
    full = capture(m, (ids,), train=True)
    softmax = [r for r in full.records if r.op == "_log_softmax" and r.phase == "forward"]
    assert softmax and tuple(softmax[0].inputs[0].shape) == (32, 100)
