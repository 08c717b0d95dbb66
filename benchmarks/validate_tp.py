"""Tensor parallelism against published runs: ``dlperf analyze --tp`` on the GPUs, model and
stack of each (issue #14; the scaling table, validation/published_scaling.csv, has no
tensor-parallel column). Thirteen sources (``SOURCES``; the mixture-of-experts ones,
megatron-moe, megatron-bridge-moe and megatron-bridge-qwen3, are described beside their
rows), each compared where its stack's own error cancels as far as it is common to the runs
compared (those with pipeline stages also check --pp):

``kempnerforge`` (-> results/tp-kempnerforge-h200.json, ~5 minutes).
Source: KempnerInstitute/KempnerForge, benchmarks/mfu_scaling/mfu_scaling_2026-04-05.md and
the script that ran it (benchmarks/mfu_scaling/mfu_bench.sh, commit 9f3f03a0): Llama 3 8B
(its "7B": dlperf's llama3-8b), 4,096 tokens, FSDP2 in bf16 (--precision fsdp), full
activation checkpointing, fused AdamW, torch.compile on, nodes of four H200 141 GB (NVLink
inside, InfiniBand between: ib-ndr assumed), tensor parallel with sequence parallelism inside
a node; torch.compile of the whole model (--fusion compile, since 2026-12-03). dlperf is slow
on this 2026 stack in absolute terms (the scaling table's kempnerforge-h200 rows: 0.59-0.61x
eager, see benchmarks/README.md for the compiled reading), so the measure here is relative:
each tensor-parallel run's tokens/s per GPU over the FSDP run on as many GPUs, measured and
predicted.

``megatron`` (-> results/tp-megatron-2020.json, ~1 minute).
Source: NVIDIA/Megatron-LM, README.md and images/{cases,scaling-mp}.png at commit 52819194
(2020-09-11): weak scaling of its GPT-2 from 1 to 8 GPUs of one node, the
model grown with the GPUs (1B: 24 layers of 1,920, 15 heads, on 1 GPU; 2B: 30 x 2,304, 18 heads,
TP 2; 4B: 36 x 3,072, 24 heads, TP 4; 8B: 42 x 4,096, 32 heads, TP 8; vocabulary 51,200,
1,024 tokens), the iteration time of batch 8 on a DGX-2 (V100 32 GB, NVSwitch) and of
batch 16 on a DGX A100 (A100 40 GB, NVSwitch), and of each case data parallel over 128
replicas of batch 16 (128 to 1,024 GPUs of DGX A100s: images/scaling-dp.png; InfiniBand HDR,
one NIC a GPU, as Selene's DGX A100s have). The stack: Megatron's original tensor
parallelism (all-reduces, no sequence parallelism: --no-sequence-parallel), --fp16 (the model in
fp16, fp32 master weights and Adam state: --precision fsdp), --checkpoint-activations per
layer, dropout 0.1, attention as matmuls and a softmax (--attention math). --precision fsdp
all-reduces the data-parallel gradients in fp32, twice the bytes of Megatron's fp16 ones
(--fp32-allreduce off): the 128-replica rows are charged that much more communication. Their
DDP runs beside the backward (dlperf's DDP): the 8B run's 2.2 GB of fp16 gradients a GPU take at
least 2 x 2.2 GB / 25 GB/s = 174 ms through its one HDR NIC, more than the 37 ms that 128
replicas added to the node's iteration, so they cannot have been all-reduced after it. The
README's TeraFLOP/s column is the model's FLOPs with the recompute, 96 B s l h^2 (1 + s/6h +
V/16lh) (Narayanan et al. 2021, arXiv 2104.04473, appendix: FLOPs with activation
recomputation), over the iteration time and the GPUs (``megatron_flops``; a test checks it
against every row of the table).
The README was committed beside "Various speed optimizations" (fused scale-mask-softmax,
bias+GeLU and bias+dropout+add, behind opt-in flags the README does not say were set), so the
absolute rate is a fused stack's; the measures are each TP=N run's model FLOP/s per GPU over
the TP=1 run's on the same system (``against_tp1``), and each 128-replica run's rate over the
same case's on one node (``against_one_node``), measured and predicted.

``megatron-2022`` (-> results/tp-megatron-2022.json, ~20 seconds).
Source: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(arXiv 2205.05198), Tables 3-5: a 22B GPT (48 layers of 6,144, 64 heads, vocabulary 51,200,
2,048 tokens) on TP=8 inside one node of 8 A100 80 GB, batch 4 in one micro-batch, no data or
pipeline parallelism. Table 4 times one transformer layer, forward and backward, five ways:
without and with sequence parallelism, with full recompute, with the paper's selective
recompute (the attention core: --activation-checkpointing selective-attention), and with
selective recompute and sequence parallelism; Table 5 the iteration with full recompute and
with the paper's method. dlperf's layer is a middle block's kernels plus its share of the
collectives (``layer_times``). Megatron-LM of 2022 overlaps the backward's all-reduce (or
reduce-scatter) with the weight-gradient GEMM (the paper's reason full recompute costs 39%,
not 33%) and, with sequence parallelism, all-gathers a layer's input again in the backward
beside the data-gradient GEMM rather than keep it: every run here is `--tp-impl megatron`,
which models both (since 2026-12-03; before, every collective was exposed and the gathered
input kept), and `--fusion megatron`, its fused scale-mask-softmax and bias+dropout+add (on
by default in Megatron-LM since 2021-01; also since 2026-12-03). The measures are each
layer's time over the baseline's (Table 4's overhead column) and the paper's method over
full recompute, measured and predicted, and the absolute iteration times.

``narayanan-2021`` (-> results/tp-narayanan-2021.json, ~40 seconds).
Source: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (arXiv 2104.04473), Table 2's PTD-parallel rows: GPT-3 175B on TP=8 x 12 stages
and the 530B on TP=8 x 35 stages, micro-batches of one 2,048-token sequence, global batch
1,536 and 2,240, 384 to 2,240 A100 80 GB on Selene, as teraFLOP/s per GPU by the FLOP count
above. The stack of 2021: no sequence parallelism, full recompute, fused kernels (--fusion
megatron), every tensor-parallel collective between dependent kernels (--tp-impl torch: the
asynchronous backward came in 2021-09), the
scatter/gather send between stages (1/8 of the activations a rank: dlperf's --pp sends), the
gradient all-reduce after the backward (--no-overlap). The schedule is not named for these
rows; they run 1F1B here (Megatron's default; the interleaved schedule needs a flag): the
measured fall from the fewest replicas to the most (8% and 7%) is about what 1F1B's bubble
grows by (8-9%) as the micro-batches a pipeline fall from 384 to 96 (175B) and from 1,120 to
280 (530B), where an interleaved schedule of three chunks would grow by 3%. Measures: each
run's rate, and each model's rate at more replicas over its rate at the fewest
(``against_fewest_replicas``). Held out beside them (``readme``, not in the track record,
its GPU not stated): Megatron-LM's README example of the same stack, the 175B on 1,024 A100s
at TP=8 x 16 stages, ~32 s an iteration (``MEGATRON_README_2021``), on both A100 presets.

``megatron-core-2024`` (-> results/tp-megatron-core-2024.json, ~5 minutes).
Source: NVIDIA/Megatron-LM README.md and images/model_table.png at commit f2e5db402c
(2024-07-15, Megatron-Core r0.8.0): nine GPTs of 1.7B to 462B parameters (vocabulary 131,072,
4,096 tokens; the parameter counts are those of a 4h GeLU MLP and an untied output layer),
weak scaled over 48 data-parallel replicas of TP 1-8 and PP 1-16, 48 to 6,144 H100s, as
teraFLOP/s per GPU by Megatron-Core's own count (``megatron_core_flops``). The README names
the stack's overlaps: --overlap-grad-reduce and --overlap-param-gather (which need the
distributed optimizer: --distributed-optimizer), --tp-comm-overlap (TransformerEngine's
userbuffers: --tp-impl te) and the pipeline's. Not published, so run both ways each: the
micro-batch size of the rows without pipeline stages (one sequence, or all of a replica's four
in one micro-batch) and the pipelined rows' schedule (1F1B, or interleaved at one block a
chunk). The attention share is TransformerEngine's cuDNN kernel's (``MCORE_ATTENTION``).

``llama3-405b`` (-> results/tp-llama3-405b.json, ~4 minutes).
Source: Grattafiori et al., "The Llama 3 Herd of Models" (arXiv 2407.21783), section 3.3 and
Table 4 (the same figures on Meta's SC'24 slides): Llama 3 405B (dlperf's llama3-405b) in
BF16 on H100 SXM, 8 a server on NVLink, RoCE at 400 Gb/s between GPUs, TP 8 x PP 16, 16M
tokens a step, teraFLOP/s per GPU: 430 on 8,192 GPUs at 8K tokens (64 data-parallel groups of
32 sequences), 400 on 16,384 (128 of 16), 380 on 16,384 at 128K with all-gather context
parallelism over 16 GPUs (8 groups of 16). The paper's pipeline: the interleaved schedule,
one block fewer on the first and the last stage, whose first and last chunk hold only the
embedding and the output layer with the loss (so one block a chunk, V = 8:
--pp-first-layers 7 --pp-last-layers 7), asynchronous transfers, no activation
checkpointing at 8K; FSDP keeping the weights gathered through the step (the distributed
optimizer's traffic), FP32 gradients reduce-scattered in FP32 (--precision fsdp). Not
published, so run both ways: the micro-batch size (1 or 2 sequences), and the stack (Meta's
own: "eager", PyTorch's tensor parallelism with every collective exposed and the Hopper
presets' attention; "overlapped", the Megatron-Core 2024 reading above), and the FLOP count
(the causal half of the attention or the whole matrix: ``llama3_flops_per_token``). Measures:
each row's rate, 16,384 GPUs over 8,192 at 8K (the bubble grows as each group's micro-batches
halve), and 128K with context parallelism over 8K on 16,384 GPUs; and each row's memory a GPU
(the run at 8K fit in 80 GB without recompute).

``megatron-bridge-fp8`` (-> results/tp-megatron-bridge-fp8.json, ~6 minutes).
Source: NVIDIA-NeMo/Megatron-Bridge, docs/performance-summary-archive.md at commit 067f987d
(2026-08-11), its DGX-H100 rows of Llama 3 8B and 70B and Llama 3.1 405B pre-training in FP8
with current scaling ("FP8-CS": TransformerEngine's Float8CurrentScaling, --fp8 current),
8,192 tokens, micro-batch 1, Tokens / sec / GPU: 8B on the 8 GPUs of one node, sharded by
Megatron-FSDP (the table's FSDP 8: --strategy fsdp), global batch 128 (16 micro-batches a
GPU) in 25.11 (14,451); 70B on 64 GPUs, TP 4 x PP 8 interleaved over 5 virtual stages (data
parallel over 2), global batch 128 in the 25.11 container (1,602) and 256 in 26.02-26.04.01
(1,621-1,664); 405B on 1,024 GPUs, TP 8 x PP 8 interleaved over 8 virtual stages x CP 2
(data parallel over 8), global batch 512 in 25.11 (292) and 1,536 in 26.02-26.06 (311-328).
The recipes (src/megatron/bridge/perf_recipes/llama/h100/*.py and recipes/llama/h100/
llama3.py at that commit): Megatron-Core on TransformerEngine (--tp-impl te, the fused
kernels of models/fused.py), the gradients reduced in BF16 (perf_recipes/_common.py's
_benchmark_common turns grad_reduce_in_fp32 off, as every release's scripts/performance
config did before it: --reduce-dtype bf16); the 70B and 405B with --tp-comm-overlap
(userbuffers), sequence parallelism, the distributed optimizer overlapping its reduce-scatter
and gather, no recompute (the 8B recipe at that commit, of a later container than its row,
recomputes 5 of its 32 blocks; the row does not say: run without). The 405B's pipeline split
accounts for the embedding and the loss (one block fewer on the first and last stage:
--pp-first-layers 15 --pp-last-layers 15); the 70B's 26.x recipe moves one block from the
last chunk to a middle one ("Et*2|(t*2|)*34,t*3|(t*2|)*3,tL": --pp-layout, stages of 10, 10,
10, 11, 10, 10, 10 and 9 blocks); its 25.11 row's layout is not published: run on even
stages of 10 blocks (the last also runs the output layer: slow by up to that layer's share).
DGX H100: NVLink 4 inside, eight NDR 400 Gb/s NICs between. Attention is cuDNN's through TE, as in megatron-core-2024
(``MCORE_ATTENTION``; each row is also saved at the preset's share and at cuDNN's own). No
BF16 run of these configurations is published: each row also saves dlperf's BF16 prediction
of it, for the FP8 gain dlperf predicts. The same table's DGX-B200 rows of 25.11 run on the
b200 preset at its own shares (no reading of a 2025 stack's Blackwell attention is
published), their FP8 GEMMs of any layout (no transposes: models/fp8.py): 8B on 8 GPUs, data
parallel with the distributed optimizer (FSDP 0), micro-batch 2, 8 micro-batches (30,624);
405B on 128 GPUs, TP 4 x PP 8 x 8 virtual x CP 2 (data parallel over 2), 32 micro-batches
(661).

``megatron-bridge-mxfp8`` (-> results/tp-megatron-bridge-mxfp8.json, ~1 minute).
Held out (no parameter was fitted to it). Source: the same tables' Llama 3 70B and Llama 3.1
405B rows in MXFP8 ("FP8-MX": TransformerEngine's MXFP8BlockScaling, --fp8 mxfp8) on GB300s
and GB200s, 26.02 to 26.06 (``BRIDGE_MXFP8`` gives each row, its containers and its config):
70B on 64 GPUs at TP 1 (GB300) or TP 2 (GB200) x PP 4 x 5 virtual stages, 405B on 256 at TP 2
x PP 8 x CP 2 (GB300) or TP 4 x PP 16 (GB200). Each row is also run with per-tensor current
scaling and in BF16 on the same layout (no published run of these layouts in those precisions).

``torchtitan-async-tp`` (-> results/tp-torchtitan-async.json, ~1 minute).
Source: pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (the PyTorch
team, June 2025; torch 38410cf9, torchtitan 820504e): Llama 3.1 70B on 256 H100s, FSDP 32 x
TP 8, local batch 16, full activation checkpointing; Llama 3.1 8B on 64, FSDP 8 x TP 8, local
batch 12, per-op selective checkpointing; both 8,192 tokens (the llama3 tomls), torch.compile
(torchtitan's per-block compile and its compiled loss: --fusion compile-blocks --loss fused),
FSDP2 in BF16 with FP32 reduction (--precision fsdp), tokens/s per GPU with vanilla tensor
parallelism (--tp-impl torch: 597.3 and 4,378) and with async TP (--tp-impl torch-async:
652.4 and 4,809.4), and the same with torchao's float8 layers (--fp8 tensorwise: 809.8 and
942.4, 5,078.1 and 5,570.1; --fp8 rowwise: 599.6 and 624.8, 3,708.5 and 3,914.9; the tomls'
float8 settings: FSDP gathers the weights in BF16, the output layer left out). Grand Teton
hosts: the 96 GB HBM2e H100 at 500 W of the scaling table's torchtitan rows (flag hbm2e-500w
there), run on the h100-sxm preset, so the absolute rates carry that GPU's gap (1.09x on the
scaling table's compiled 8-GPU torchtitan row); the measure is async over vanilla on one GPU,
model, recipe and batch, where it cancels. The table notes that its vanilla-TP rowwise rate
is low for a reason being fixed (pytorch/torchtitan#1207): those rows are kept, not fitted.
Beside the table, the same team's runs of 70B on 128 GPUs (FSDP 16 x TP 8, otherwise the
same) three months before (pytorch/pytorch#149990, 2025-03-25: BF16 598 and 673, tensorwise
820 and 950 tokens/s per GPU, vanilla and async; its rowwise figures are cut short there).

``megatron-deepspeed`` (-> results/tp-megatron-deepspeed.json, ~25 seconds).
Megatron-DeepSpeed: DeepSpeed's pipeline engine and data parallelism around Megatron-LM's
tensor-parallel layers, two runs of it. BLOOM-176B (bigscience-workshop/bigscience,
train/tr11-176B-ml/README.md at commit e726b159 and tr11-176B-ml.slurm at 003b2505, its
48-node version (the latest has 24): the slurm script's TP 4 x PP 12 x DP 8 on 384 A100
80 GB of Jean Zay, four 100 Gb/s Omni-Path links a node, micro-batches of 2, global batch 2,048, bf16 with DeepSpeed's BF16_Optimizer at ZeRO stage 0,
full recompute, the stages of 5, 6, ..., 6, 5 blocks the README lists; the README's log line
at the first epoch's end, 104.70 s an iteration). Megatron-Turing NLG 530B (Smith et al.,
arXiv 2201.11990, section 2.4, as quoted by cli99/llm-analysis): TP 8 x PP 35, global batch
1,920 on 280, 350 and 420 DGX A100 80 GB nodes, 60.1, 50.2 and 44.4 s an iteration; its
micro-batch (one sequence here) and precision path are not in the quote. Each run is read
twice: as DeepSpeed's BF16_Optimizer runs it (--deepspeed-bf16: each micro-batch's gradients
cast and added into an fp32 buffer, that buffer all-reduced after the flush, the update
sharded, the bf16 parameters gathered after it) and as Megatron-LM's own optimizer of 2021
(narayanan-2021's stack). Measures: each run's rate, and MT-NLG's rate per GPU at 350 and 420
nodes over 280 nodes'; and bigscience's own timing of a 181B model at ZeRO stage 0 (the
BF16_Optimizer) over stage 1 (``PREQUEL``), measured and predicted.

Each row runs the CLI (`dlperf analyze ... --json`).
Usage: python benchmarks/validate_tp.py [kempnerforge|megatron|megatron-2022|narayanan-2021|
megatron-core-2024|llama3-405b|megatron-bridge-fp8|torchtitan-async-tp|megatron-deepspeed]
[OUT.json]
(default: every source, each to its file in benchmarks/results/)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/tp-kempnerforge-h200.json"
MEGATRON_OUT = ROOT / "benchmarks/results/tp-megatron-2020.json"
MEGATRON22_OUT = ROOT / "benchmarks/results/tp-megatron-2022.json"
NARAYANAN_OUT = ROOT / "benchmarks/results/tp-narayanan-2021.json"
MCORE24_OUT = ROOT / "benchmarks/results/tp-megatron-core-2024.json"
BASE = ["analyze", "llama3-8b", "--device", "h200", "--seq-len", "4096", "--dtype", "bf16",
        "--precision", "fsdp", "--train", "--activation-checkpointing", "full",
        "--optimizer", "adamw", "--gpus-per-node", "4", "--interconnect", "nvlink4-h200,ib-ndr",
        "--fusion", "compile", "--top", "1",
        # its scripts/train.py: F.cross_entropy on the BF16 logits, outside the compiled model
        "--loss", "half",
        # its torch 2.11.0+cu128 and cuDNN 9.19 (uv.lock at 01b461a): SDPA runs cuDNN's
        # attention on Hopper (the scaling table's kempnerforge-h200 rows say why)
        "--attention-kernel", "cudnn"]
# (run, GPUs, tp, strategy, batch, micro-batches, measured tokens/s over all GPUs), as
# mfu_bench.sh ran them (experiments 02, 03, 04, 05, 06, 07, 10, 12)
RUNS = (
    ("FSDP=2", 2, 1, "fsdp", 2, 4, 18728),
    ("TP=2", 2, 2, "fsdp", 4, 2, 13163),
    ("FSDP=4", 4, 1, "fsdp", 4, 2, 38983),
    ("TP=4", 4, 4, "fsdp", 4, 2, 25135),
    ("TP=2+FSDP=2", 4, 2, "fsdp", 4, 2, 25980),
    ("TP=4+FSDP=2", 8, 4, "fsdp", 4, 2, 44299),
    ("TP=4+FSDP=4", 16, 4, "fsdp", 4, 2, 82988),
    ("TP=4+FSDP=8", 32, 4, "fsdp", 4, 2, 155917),
)


def paired(rows: list[dict], key, is_base) -> list[tuple[dict, dict]]:
    """(row, its base) for each row that is not a base, where some base (``is_base``) has the
    same ``key``: the runs each comparison below divides by."""
    bases = {key(r): r for r in rows if is_base(r)}
    return [(r, bases[key(r)]) for r in rows if not is_base(r) and key(r) in bases]


def relative(rows: list[dict]) -> list[dict]:
    """Each tensor-parallel row's tokens/s per GPU over the FSDP row on as many GPUs (when the
    table has one), measured and predicted, and predicted over measured."""
    out = []
    for r, base in paired(rows, lambda r: r["gpus"], lambda r: r["tp"] == 1):
        measured = r["measured_per_gpu"] / base["measured_per_gpu"]
        predicted = r["predicted_per_gpu"] / base["predicted_per_gpu"]
        out.append({"run": r["run"], "against": base["run"], "measured": measured,
                    "predicted": predicted, "ratio": predicted / measured})
    return out


# Megatron-LM's weak-scaling cases (images/cases.png): layers, hidden size, heads, TP
MEGATRON_CASES = {"1B": (24, 1920, 15, 1), "2B": (30, 2304, 18, 2), "4B": (36, 3072, 24, 4),
                  "8B": (42, 4096, 32, 8)}
MEGATRON_VOCAB, MEGATRON_SEQ = 51200, 1024
# (system, device preset, interconnects, batch per replica, data-parallel replicas,
# {case: (iteration ms, TeraFLOP/s per GPU)}) as images/scaling-mp.png (one node) and
# images/scaling-dp.png (128 replicas: 128 to 1,024 GPUs of DGX A100s, batch 2,048) give them
MEGATRON_SYSTEMS = (
    ("DGX-2 (V100)", "v100-sxm2", "nvlink2-dgx2", 8, 1,
     {"1B": (1121, 71.9), "2B": (1093, 64.2), "4B": (1238, 58.5), "8B": (1407, 52.2)}),
    ("DGX A100", "a100-40gb", "nvlink3-a100", 16, 1,
     {"1B": (1076, 149.8), "2B": (1026, 136.8), "4B": (1162, 124.7), "8B": (1343, 109.3)}),
    ("DGX A100 x 128 replicas", "a100-40gb", "nvlink3-a100,ib-hdr", 16, 128,
     {"1B": (1153, 139.8), "2B": (1101, 127.5), "4B": (1242, 116.7), "8B": (1380, 106.5)}),
)
MEGATRON_ARGS = ["analyze", "gpt2", "--vocab", str(MEGATRON_VOCAB), "--seq-len",
                 str(MEGATRON_SEQ), "--dtype", "fp16", "--precision", "fsdp", "--train",
                 "--activation-checkpointing", "full", "--optimizer", "adamw", "--attention",
                 "math", "--dropout", "0.1", "--top", "1"]


def megatron_flops(layers: int, hidden: int, batch: int, seq: int = MEGATRON_SEQ,
                   vocab: int = MEGATRON_VOCAB) -> float:
    """FLOPs of one iteration of Megatron's GPT with full activation recompute, as Megatron
    counts them (Narayanan et al. 2021, arXiv 2104.04473): 96 B s l h^2 (1 + s / 6h +
    V / 16lh)."""
    return 96 * batch * seq * layers * hidden ** 2 * (
        1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def against_tp1(rows: list[dict]) -> list[dict]:
    """Each TP=N row's model FLOP/s per GPU over the TP=1 row's of the same system (Megatron's
    weak scaling, in FLOPs), measured and predicted, and predicted over measured."""
    out = []
    for r, one in paired(rows, lambda r: r["system"], lambda r: r["tp"] == 1):
        per_gpu = r["model_flops"] / r["tp"]
        measured = per_gpu / r["measured_step_s"] / (one["model_flops"] / one["measured_step_s"])
        predicted = (per_gpu / r["predicted_step_s"]
                     / (one["model_flops"] / one["predicted_step_s"]))
        out.append({"system": r["system"], "run": r["run"], "against": one["run"],
                    "measured": measured, "predicted": predicted, "ratio": predicted / measured})
        if "predicted_fused_step_s" in r:  # both steps with Megatron's fused kernels
            fused = (per_gpu / r["predicted_fused_step_s"]
                     / (one["model_flops"] / one["predicted_fused_step_s"]))
            out[-1]["ratio_fused"] = fused / measured
    return out


def against_one_node(rows: list[dict]) -> list[dict]:
    """Each data-parallel row's rate per GPU over the same case's on one node of the same
    GPU (its model-parallel group alone), measured and predicted: the data-parallel scaling."""
    out = []
    for r, one in paired(rows, lambda r: (r["case"], r["device"]), lambda r: r["replicas"] == 1):
        measured = one["measured_step_s"] / r["measured_step_s"]
        predicted = one["predicted_step_s"] / r["predicted_step_s"]
        out.append({"system": r["system"], "run": r["run"], "against": one["system"],
                    "measured": measured, "predicted": predicted, "ratio": predicted / measured})
    return out


def _analyze(args: list[str], tmp: str, whole: bool = False) -> dict:
    """`dlperf analyze ARGS --json`: the requested scale of its scale-out (``whole``: the
    whole result)."""
    from contextlib import redirect_stdout
    from io import StringIO

    from dlperf.cli import main as cli
    from dlperf.hardware.efficiency import DEFAULT_ATTENTION_KERNEL

    if "--attention-kernel" not in args:
        # a published run's stack, not the torch installed here: where a source says no
        # other kernel, its SDPA ran FlashAttention-2 (these runs predate cuDNN's coming
        # first on Hopper, torch 2.11; efficiency.sdpa_kernel)
        args = args + ["--attention-kernel", DEFAULT_ATTENTION_KERNEL]
    path = Path(tmp) / "r.json"
    with redirect_stdout(StringIO()):
        code = cli(args + ["--json", str(path)])
    if code != 0:
        raise SystemExit(f"dlperf {' '.join(args)} exited {code}")
    result = json.loads(path.read_text())
    return result if whole else result["scale_out"]["at_requested_scale"]


def kempnerforge(out: Path) -> None:
    from tqdm import tqdm

    from dlperf.provenance import save_result

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for run, gpus, tp, strategy, batch, accum, measured in tqdm(RUNS, desc="kempnerforge"):
            here = _analyze(BASE + ["--gpus", str(gpus), "--tp", str(tp), "--strategy",
                                    strategy, "--batch-size", str(batch), "--grad-accum",
                                    str(accum)], tmp)
            tensor = here["communication"].get("tensor_parallel") or {}
            predicted = here["per_gpu_samples_per_s"] * 4096
            rows.append({"run": run, "gpus": gpus, "tp": tp, "strategy": strategy,
                         "batch": batch, "grad_accum": accum,
                         "measured_per_gpu": measured / gpus, "predicted_per_gpu": predicted,
                         "ratio": predicted / (measured / gpus),
                         "tp_exposed_s": tensor.get("exposed_s", 0.0),
                         "exposed_comm_s": here["exposed_comm_s"], "step_s": here["step_s"]})
    pairs = relative(rows)
    for r in rows:
        print(f"{r['run']:12s} {r['gpus']:3d} GPUs: measured {r['measured_per_gpu']:8,.0f} "
              f"tokens/s per GPU, predicted {r['predicted_per_gpu']:8,.0f} ({r['ratio']:.2f}x)")
    for p in pairs:
        print(f"{p['run']:12s} / {p['against']}: measured {p['measured']:.3f}, predicted "
              f"{p['predicted']:.3f} ({p['ratio']:.2f}x)")
    save_result(out, "validate-tp", {"args": BASE, "runs": [list(r) for r in RUNS]},
                {"rows": rows, "tp_over_fsdp": pairs})
    print(f"Wrote {out}")


def megatron(out: Path) -> None:
    from tqdm import tqdm

    from dlperf.provenance import save_result

    runs = [(system, device, node, batch, replicas, case, *published)
            for system, device, node, batch, replicas, cases in MEGATRON_SYSTEMS
            for case, published in cases.items()]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for system, device, node, batch, replicas, case, ms, tflops in tqdm(runs,
                                                                            desc="megatron"):
            layers, hidden, heads, tp = MEGATRON_CASES[case]
            args = MEGATRON_ARGS + ["--layers", str(layers), "--d-model", str(hidden),
                                    "--heads", str(heads), "--batch-size", str(batch),
                                    "--device", device, "--interconnect", node,
                                    "--gpus", str(tp * replicas)]
            if tp > 1:
                args += ["--tp", str(tp), "--no-sequence-parallel"]
            result = _analyze(args, tmp, whole=True)
            here = result["scale_out"]["at_requested_scale"]
            tensor = here["communication"].get("tensor_parallel") or {}
            step = here["step_s"]
            # the same run with Megatron's fused scale-mask-softmax and bias+dropout+add
            # (opt-in flags at this commit, which the README does not say were set)
            fused = _analyze(args + ["--fusion", "megatron"], tmp)["step_s"]
            tokens = batch * MEGATRON_SEQ / tp  # per GPU per iteration
            rows.append({"system": system, "case": case, "run": f"{case} TP={tp}",
                         "device": device, "interconnect": node, "tp": tp,
                         "replicas": replicas, "gpus": tp * replicas, "batch": batch,
                         "model_flops": megatron_flops(layers, hidden, batch),
                         "published_tflops_per_gpu": tflops,
                         "measured_step_s": ms / 1000, "predicted_step_s": step,
                         "measured_per_gpu": tokens / (ms / 1000),
                         "predicted_per_gpu": tokens / step, "ratio": ms / 1000 / step,
                         "tp_exposed_s": tensor.get("exposed_s", 0.0),
                         "exposed_comm_s": here["exposed_comm_s"],
                         "straggler_s": here["straggler_s"], "predicted_fused_step_s": fused,
                         "predicted_single_rank_s": here["single_gpu_step_s"]})
    pairs, data_parallel = against_tp1(rows), against_one_node(rows)
    for r in rows:
        print(f"{r['system']:23s} {r['run']:8s}: measured {r['measured_step_s'] * 1000:6,.0f} ms, "
              f"predicted {r['predicted_step_s'] * 1000:6,.0f} ms (rate {r['ratio']:.2f}x; "
              f"tensor-parallel all-reduces {r['tp_exposed_s'] * 1000:4.0f} ms)")
    for p in pairs:
        print(f"{p['system']:23s} {p['run']:8s} / {p['against']}: measured {p['measured']:.3f}, "
              f"predicted {p['predicted']:.3f} ({p['ratio']:.2f}x; with --fusion megatron "
              f"{p['ratio_fused']:.2f}x)")
    for p in data_parallel:
        print(f"{p['run']:8s} on 128 replicas / on {p['against']}: measured "
              f"{p['measured']:.3f}, predicted {p['predicted']:.3f} ({p['ratio']:.2f}x)")
    save_result(out, "validate-tp-megatron",
                {"args": MEGATRON_ARGS, "cases": MEGATRON_CASES,
                 "systems": [list(s) for s in MEGATRON_SYSTEMS]},
                {"rows": rows, "tp_over_tp1": pairs, "data_parallel_over_one_node": data_parallel})
    print(f"Wrote {out}")


def megatron_gpt_args(layers: int, hidden: int, heads: int, gpus: int, pp: int = 1,
                      virtual: int = 1, micro_batches: int = 1, batch: int = 1,
                      impl: str = "megatron", device: str = "a100-80gb",
                      dtype: str = "bf16") -> list[str]:
    """`dlperf analyze` for one of Megatron's GPTs of 2021-22 (vocabulary 51,200, 2,048 tokens,
    mixed precision, explicit attention, dropout 0.1, A100 80 GB on Selene): TP=8 in each
    node, ``pp`` stages (``virtual`` chunks each), ``micro_batches`` of ``batch`` sequences,
    data parallel over what is left with the all-reduce after the backward, as the papers ran
    it, with Megatron's fused scale-mask-softmax and bias+dropout+add (on by default since
    2021-01: --fusion megatron); ``impl``: the tensor-parallel implementation, "megatron" from
    Megatron-LM's asynchronous backward (2021-09) on, "torch" (every collective exposed)
    before it; ``device`` and ``dtype`` where a run says otherwise (--fp16)."""
    return ["analyze", "gpt2", "--layers", str(layers), "--d-model", str(hidden), "--heads",
            str(heads), "--vocab", "51200", "--seq-len", "2048", "--batch-size", str(batch),
            "--grad-accum", str(micro_batches), "--dtype", dtype, "--precision", "fsdp",
            "--train", "--optimizer", "adamw", "--attention", "math", "--dropout", "0.1",
            "--device", device, "--interconnect", "nvlink3-a100,ib-hdr", "--gpus",
            str(gpus), "--tp", "8", "--pp", str(pp), "--pp-virtual", str(virtual),
            "--tp-impl", impl, "--fusion", "megatron", "--no-overlap", "--top", "1"]


# Korthikanti et al. 2022 (arXiv 2205.05198), Table 3: the 22B GPT (48 layers of 6,144, 64
# heads, vocabulary 51,200, 2,048 tokens) on TP=8 in one node of 8 A100 80 GB (NVSwitch), no
# data or pipeline parallelism, batch 4 in one micro-batch, mixed precision
MEGATRON22_ARGS = megatron_gpt_args(48, 6144, 64, gpus=8, batch=4)
# Table 4, one transformer layer (ms): (experiment, sequence parallel, recompute policy or None,
# forward, backward)
MEGATRON22_LAYER = (
    ("baseline, no recompute", False, None, 7.7, 11.9),
    ("sequence parallelism", True, None, 7.2, 11.8),
    ("baseline with (full) recompute", False, "full", 7.7, 19.5),
    ("selective recompute", False, "selective-attention", 7.7, 13.2),
    ("selective + sequence", True, "selective-attention", 7.2, 13.1),
)
# Table 5, one iteration (s): full recompute without sequence parallelism, and the paper's
# method (sequence parallel, selective recompute): the 3rd and 5th experiments above
MEGATRON22_ITERATION = {"baseline with (full) recompute": 1.42, "selective + sequence": 1.10}
# Tables 3 and 5, the pipelined models: (model, layers, hidden, heads, pipeline stages,
# virtual stages (Megatron's interleaved schedule for 175B and 530B, "m = 3"), GPUs, batch =
# micro-batches of 1, iteration s with full recompute, with the paper's method); and 530B on
# 8 replicas (2,240 GPUs, batch 2,240), section 6.3: 39.15 s, its gradient all-reduce "not
# overlapped" with the backward
MEGATRON22_PIPELINED = (
    ("175B", 96, 12288, 96, 8, 3, 64, 64, 18.13, 13.75),
    ("530B", 105, 20480, 128, 35, 3, 280, 280, 49.05, 37.83),
    ("1T", 128, 25600, 160, 64, 1, 512, 512, 94.42, 71.49),
    ("530B x 8 replicas", 105, 20480, 128, 35, 3, 2240, 280, None, 39.15),
)
# the two ways each ran: full recompute without sequence parallelism, and the paper's
MEGATRON22_WAYS = (("full recompute", ["--activation-checkpointing", "full",
                                       "--no-sequence-parallel"]),
                   ("selective + sequence", ["--activation-checkpointing",
                                             "selective-attention"]))


def layer_times(result: dict, layers: int, block: str = "blocks.1") -> tuple[float, float]:
    """One block's predicted forward and backward (dgrad, wgrad and any recompute) in seconds,
    its kernels plus its share of the tensor-parallel collectives of the ``layers`` blocks: a
    block makes two in the forward (an all-reduce after each split region, or an all-gather
    and a reduce-scatter around it with sequence parallelism, i.e. twice as many calls of the
    same bytes), two in the backward and, fully recomputed, two more in the replay
    (scaling.tensor_parallel_collectives). Under Megatron's implementation the backward's
    calls at its two column-parallel layers run beside their GEMMs: of those the block pays
    its 2 / (2 L + 1) share of what the micro-batch's leave exposed."""
    phases = {"forward": 0.0, "backward": 0.0}
    recomputed = False
    for k in result["layers"]:
        if k["module"].startswith(block + "."):
            phases["forward" if k["phase"] == "forward" else "backward"] += k["predicted_time_s"]
            recomputed |= k["phase"] == "recompute" and k["op"] in ("mm", "addmm")
    here = result["scale_out"]["at_requested_scale"]
    tp = here["communication"]["tensor_parallel"]
    # one micro-batch's, all of one size
    each = tp["busy_s"] / here["grad_accum"] / tp["collectives_per_micro_batch"]
    calls = 2 * (2 if tp["sequence_parallel"] else 1)  # per split-region pair, per pass
    # the backward's calls beside the GEMMs: both of the pair's without sequence parallelism
    # (the all-reduces), one of it with (the reduce-scatter; the all-gather stays between
    # dependent kernels); the re-gathers are more calls beside them
    beside = (0 if not tp["beside_gemms"] else calls if not tp["sequence_parallel"]
              else calls // 2)
    left = (tp["exposed_s"] / here["grad_accum"]
            - (tp["collectives_per_micro_batch"] - tp["beside_gemms"]) * each)
    return (phases["forward"] + calls * each,
            phases["backward"] + (calls - beside) * each + calls * each * recomputed
            + left * 2 / (2 * layers + 1))


def megatron2022(out: Path) -> None:
    from tqdm import tqdm

    from dlperf.provenance import save_result

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, sp, policy, fwd, bwd in tqdm(MEGATRON22_LAYER, desc="megatron 2022"):
            args = MEGATRON22_ARGS + ([] if sp else ["--no-sequence-parallel"]) + (
                ["--activation-checkpointing", policy] if policy else [])
            result = _analyze(args, tmp, whole=True)
            here = result["scale_out"]["at_requested_scale"]
            p_fwd, p_bwd = layer_times(result, 48)
            iteration = MEGATRON22_ITERATION.get(name)
            rows.append({"experiment": name, "sequence_parallel": sp, "recompute": policy,
                         "measured_forward_s": fwd / 1000, "measured_backward_s": bwd / 1000,
                         "predicted_forward_s": p_fwd, "predicted_backward_s": p_bwd,
                         "layer_ratio": (fwd + bwd) / 1000 / (p_fwd + p_bwd),
                         "measured_iteration_s": iteration,
                         "predicted_iteration_s": here["step_s"],
                         "memory_per_gpu_bytes": (here.get("memory_per_gpu") or {}).get(
                             "total_bytes")})
    base = rows[0]
    measured_base = base["measured_forward_s"] + base["measured_backward_s"]
    predicted_base = base["predicted_forward_s"] + base["predicted_backward_s"]
    for r in rows:  # Table 4's overhead column: each layer time over the baseline's
        r["measured_over_baseline"] = (r["measured_forward_s"] + r["measured_backward_s"]
                                       ) / measured_base
        r["predicted_over_baseline"] = (r["predicted_forward_s"] + r["predicted_backward_s"]
                                        ) / predicted_base
    full, present = (next(r for r in rows if r["experiment"] == n)
                     for n in MEGATRON22_ITERATION)
    speedup = {"measured": full["measured_iteration_s"] / present["measured_iteration_s"],
               "predicted": full["predicted_iteration_s"] / present["predicted_iteration_s"]}
    iterations = [{"model": "22B", "way": way, "gpus": 8, "pp": 1,
                   "measured_iteration_s": r["measured_iteration_s"],
                   "predicted_iteration_s": r["predicted_iteration_s"]}
                  for way, r in (("full recompute", full), ("selective + sequence", present))]
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(m, way, extra) for m in MEGATRON22_PIPELINED for way, extra in MEGATRON22_WAYS
                if (m[8] if way == "full recompute" else m[9]) is not None]
        for (model, layers, hidden, heads, pp, virtual, gpus, micro, full_s, present_s), way, \
                extra in tqdm(runs, desc="megatron 2022, pipelined"):
            result = _analyze(megatron_gpt_args(layers, hidden, heads, gpus, pp, virtual,
                                                micro)
                              + extra, tmp, whole=True)
            here = result["scale_out"]["at_requested_scale"]
            pipe = here["communication"]["pipeline"]
            # one micro-batch's activations of the whole model on a rank, as dlperf counts
            # them and, for the paper's method, as its equation 6 does: 34 s b h L / t bytes
            # (Megatron keeps a sequence-parallel layer's input split and gathers it again in
            # the backward, as --tp-impl megatron does)
            activations = result["memory"]["activations_bytes"]
            paper = 34 * 2048 * hidden * layers // 8 if way != "full recompute" else None
            iterations.append({
                "model": model, "way": way, "gpus": gpus, "pp": pp, "virtual": virtual,
                "micro_batches": micro,
                "measured_iteration_s": full_s if way == "full recompute" else present_s,
                "predicted_iteration_s": here["step_s"], "bubble_s": pipe["bubble_s"],
                "p2p_s": pipe["p2p_s"], "exposed_comm_s": here["exposed_comm_s"],
                "tied_embedding_allreduce_s": pipe["tied_embedding_allreduce_s"],
                "memory_per_gpu_bytes": (here.get("memory_per_gpu") or {}).get("total_bytes"),
                "activations_bytes": activations, "paper_activations_bytes": paper})
    for r in iterations:
        r["ratio"] = r["measured_iteration_s"] / r["predicted_iteration_s"]  # rate, pred/meas
    pairs = paired(iterations, lambda r: r["model"], lambda r: r["way"] == "full recompute")
    speedups = [{"model": r["model"], "measured": full["measured_iteration_s"]
                 / r["measured_iteration_s"],
                 "predicted": full["predicted_iteration_s"] / r["predicted_iteration_s"]}
                for r, full in pairs]
    for r in iterations:
        print(f"{r['model']:18s} {r['way']:21s}: iteration measured "
              f"{r['measured_iteration_s']:6.2f} s, predicted {r['predicted_iteration_s']:6.2f} s "
              f"(rate {r['ratio']:.2f}x)")
    for x in speedups:
        print(f"{x['model']:18s} the paper's method over full recompute: measured "
              f"{x['measured']:.3f}x, predicted {x['predicted']:.3f}x")
    for r in rows:
        print(f"{r['experiment']:32s} layer: measured {r['measured_forward_s'] * 1e3:4.1f} + "
              f"{r['measured_backward_s'] * 1e3:4.1f} ms, predicted "
              f"{r['predicted_forward_s'] * 1e3:4.1f} + {r['predicted_backward_s'] * 1e3:4.1f} "
              f"ms; over the baseline measured {r['measured_over_baseline']:.3f}, predicted "
              f"{r['predicted_over_baseline']:.3f}"
              + (f"; iteration measured {r['measured_iteration_s']:.2f} s, predicted "
                 f"{r['predicted_iteration_s']:.2f} s" if r["measured_iteration_s"] else ""))
    print(f"the paper's method over full recompute: measured {speedup['measured']:.3f}x, "
          f"predicted {speedup['predicted']:.3f}x")
    save_result(out, "validate-tp-megatron-2022",
                {"args": MEGATRON22_ARGS, "layer": [list(r) for r in MEGATRON22_LAYER],
                 "iteration": MEGATRON22_ITERATION,
                 "pipelined": [list(r) for r in MEGATRON22_PIPELINED],
                 "ways": [[w, a] for w, a in MEGATRON22_WAYS]},
                {"rows": rows, "speedup": speedup, "iterations": iterations,
                 "speedups": speedups})
    print(f"Wrote {out}")


# Narayanan et al. 2021 (arXiv 2104.04473), Table 2, PTD parallelism: GPT-3 175B (96 x 12,288,
# 96 heads) on TP=8 x 12 stages and the 530B (105 x 20,480, 128 heads) on TP=8 x 35 stages,
# micro-batches of one sequence of 2,048, batch 1,536 and 2,240, data parallel over 4-16 and
# 2-8 replicas: (model, layers, hidden, heads, stages, batch, GPUs, teraFLOP/s per GPU)
NARAYANAN_PTD = (
    ("175B", 96, 12288, 96, 12, 1536, 384, 153), ("175B", 96, 12288, 96, 12, 1536, 768, 149),
    ("175B", 96, 12288, 96, 12, 1536, 1536, 141),
    ("530B", 105, 20480, 128, 35, 2240, 560, 171), ("530B", 105, 20480, 128, 35, 2240, 1120, 167),
    ("530B", 105, 20480, 128, 35, 2240, 2240, 159),
)


# The same stack's own example, held out of everything above: Megatron-LM's README ("GPT-3
# Example"): "With full global batch size of 1536 on 1024 A100 GPUs, each iteration takes
# around 32 seconds resulting in 138 teraFLOPs per GPU", for examples/pretrain_gpt3_175B.sh
# (NVIDIA/Megatron-LM at commit 090e141c: the 175B on 128 nodes, TP=8 x 16 stages of 6 blocks,
# micro-batches of one 2,048-token sequence, batch 1,536, --fp16, --checkpoint-activations,
# the 20.12 container: the 2021 stack above). The README does not say which A100: it is run
# on the 80 GB preset (Table 2's Selene) and on the 40 GB one (the DGX A100 of late 2020).
# (model, layers, hidden, heads, stages, batch, GPUs, teraFLOP/s per GPU, iteration s)
MEGATRON_README_2021 = ("175B", 96, 12288, 96, 16, 1536, 1024, 138, 32.0)
README_DEVICES = ("a100-80gb", "a100-40gb")


def against_fewest_replicas(rows: list[dict]) -> list[dict]:
    """Each model's rate per GPU at more replicas over its rate at the fewest, measured and
    predicted, and predicted over measured: what the bubble (fewer micro-batches a pipeline
    as the replicas share the batch) and the data-parallel all-reduce cost as GPUs grow."""
    fewest = {}
    for r in rows:
        fewest[r["model"]] = min(fewest.get(r["model"], r["replicas"]), r["replicas"])
    out = []
    for r, base in paired(rows, lambda r: r["model"],
                          lambda r: r["replicas"] == fewest[r["model"]]):
        measured = r["measured_tflops"] / base["measured_tflops"]
        predicted = r["predicted_tflops"] / base["predicted_tflops"]
        out.append({"model": r["model"], "gpus": r["gpus"], "against_gpus": base["gpus"],
                    "measured": measured, "predicted": predicted,
                    "ratio": predicted / measured})
    return out


def narayanan2021(out: Path) -> None:
    from tqdm import tqdm

    from dlperf.provenance import save_result

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, layers, hidden, heads, pp, batch, gpus, tflops in tqdm(
                NARAYANAN_PTD, desc="narayanan 2021"):
            replicas = gpus // (8 * pp)
            # the paper's stack: no sequence parallelism, every layer recomputed, 1F1B, and
            # Megatron-LM before its asynchronous backward (2021-09): every collective exposed
            here = _analyze(megatron_gpt_args(layers, hidden, heads, gpus, pp, 1,
                                              batch // replicas, impl="torch")
                            + ["--activation-checkpointing", "full", "--no-sequence-parallel"],
                            tmp)
            flops = megatron_flops(layers, hidden, batch, seq=2048) / gpus
            pipe = here["communication"]["pipeline"]
            rows.append({"model": model, "gpus": gpus, "replicas": replicas, "pp": pp,
                         "micro_batches": batch // replicas, "measured_tflops": tflops,
                         "predicted_tflops": flops / here["step_s"] / 1e12,
                         "measured_step_s": flops / (tflops * 1e12),
                         "predicted_step_s": here["step_s"], "bubble_s": pipe["bubble_s"],
                         "p2p_s": pipe["p2p_s"], "exposed_comm_s": here["exposed_comm_s"]})
        model, layers, hidden, heads, pp, batch, gpus, tflops, step = MEGATRON_README_2021
        replicas = gpus // (8 * pp)
        readme = []
        for device in README_DEVICES:
            here = _analyze(megatron_gpt_args(layers, hidden, heads, gpus, pp, 1,
                                              batch // replicas, impl="torch", device=device,
                                              dtype="fp16")  # the script's --fp16
                            + ["--activation-checkpointing", "full", "--no-sequence-parallel"],
                            tmp)
            flops = megatron_flops(layers, hidden, batch, seq=2048) / gpus
            readme.append({"model": model, "device": device, "gpus": gpus, "pp": pp,
                           "replicas": replicas, "micro_batches": batch // replicas,
                           "measured_tflops": tflops, "measured_step_s": step,
                           "predicted_tflops": flops / here["step_s"] / 1e12,
                           "predicted_step_s": here["step_s"],
                           "ratio": step / here["step_s"],
                           "bubble_s": here["communication"]["pipeline"]["bubble_s"],
                           "memory_per_gpu_bytes": here["memory_per_gpu"]["total_bytes"]})
    for r in rows:
        r["ratio"] = r["predicted_tflops"] / r["measured_tflops"]
    scaling = against_fewest_replicas(rows)
    for r in rows:
        print(f"{r['model']} on {r['gpus']:5,d} GPUs ({r['micro_batches']:4d} micro-batches): "
              f"measured {r['measured_tflops']:.0f} TFLOP/s a GPU, predicted "
              f"{r['predicted_tflops']:.0f} ({r['ratio']:.2f}x; bubble {r['bubble_s']:.1f} s "
              f"of {r['predicted_step_s']:.1f})")
    for x in scaling:
        print(f"{x['model']} on {x['gpus']:5,d} / {x['against_gpus']:,d} GPUs: measured "
              f"{x['measured']:.3f}, predicted {x['predicted']:.3f} ({x['ratio']:.2f}x)")
    for r in readme:
        print(f"Megatron-LM's README, {r['model']} on {r['gpus']:,d} {r['device']}: measured "
              f"{r['measured_step_s']:.0f} s an iteration ({r['measured_tflops']} TFLOP/s a "
              f"GPU), predicted {r['predicted_step_s']:.1f} s ({r['predicted_tflops']:.0f}; "
              f"{r['ratio']:.2f}x the rate)")
    save_result(out, "validate-tp-narayanan-2021",
                {"runs": [list(r) for r in NARAYANAN_PTD], "schedule": "1F1B",
                 "recompute": "full", "sequence_parallel": False,
                 "readme_run": list(MEGATRON_README_2021), "readme_devices": README_DEVICES},
                {"rows": rows, "scaling": scaling, "readme": readme})
    print(f"Wrote {out}")


# Megatron-Core r0.8.0 on H100s (NVIDIA/Megatron-LM README.md and images/model_table.png,
# commit f2e5db402c, 2024-07-15): GPTs of vocabulary 131,072 and 4,096 tokens, weak scaled
# from 48 to 6,144 GPUs with data parallel over 48 replicas: (model, heads, hidden, layers,
# TP, PP, GPUs, batch, teraFLOP/s per GPU)
MCORE_2024 = (
    ("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8), ("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9),
    ("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1), ("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6),
    ("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7),
    ("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
    ("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
    ("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
    ("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9),
)
MCORE_VOCAB, MCORE_SEQ, MCORE_REPLICAS = 131072, 4096, 48
# The README's strong scaling of "the standard GPT-3 model" (the table's 177B) at batch 1,152
# "from 96 H100 GPUs to 4608 GPUs ... a reduction in MFU from 47% to 42%" (MFU: teraFLOP/s per
# GPU over the H100's 989.4, as the table's column is): (GPUs, MFU). The split is not given;
# run as the table's 177B (TP 8 x PP 6, interleaved at one block a chunk), data parallel over
# 2 and 96 replicas
MCORE_STRONG = ((96, 0.47), (4608, 0.42))
H100_BF16_PEAK = 989.4e12
# Fused attention on this stack: TransformerEngine's cuDNN flash attention. The Hopper presets'
# share (hardware/efficiency.py, 0.187) is a 2023 stack's, whose kernels that file explains by
# FlashAttention-2's speed on Hopper; the FlashAttention-3 paper (Shah et al., arXiv
# 2407.08608, figure 5) times both kernels on one H100 SXM5 in BF16, head size 128 (every
# model here), causal, 4,096 tokens: cuDNN 518 TFLOP/s, FlashAttention-2 319. The share used
# here is the preset's scaled by that ratio, chosen before any row was run; the saved file
# also has each row at the preset's share and at cuDNN's own 518 / 989.4 of the peak.
MCORE_ATTENTION = round(0.187 * 518 / 319, 3)  # 0.304
MCORE_ATTENTION_BOUNDS = (0.187, round(518 / 989.4, 3))


def megatron_core_flops(layers: int, hidden: int, batch: int, seq: int = MCORE_SEQ,
                        vocab: int = MCORE_VOCAB) -> float:
    """FLOPs of one iteration as Megatron-Core r0.8 counts them for its MFU
    (megatron/training/training.py ``num_floating_point_operations``, no recompute): for
    multi-head attention and a 4h GeLU MLP, 12 B s L h^2 (2 + s/h + 4 + V / 2Lh) =
    72 B s L h^2 (1 + s / 6h + V / 12Lh)."""
    return 72 * batch * seq * layers * hidden ** 2 * (
        1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))


def megatron_bucket_mib(replicas: int) -> float:
    """Megatron-Core's gradient bucket in MiB: max(40M, 1M x replicas) fp32 parameters
    (its DDP's bucket_size default)."""
    return max(40_000_000, 1_000_000 * replicas) * 4 / 2**20


def mcore_args(layers: int, hidden: int, heads: int, tp: int, pp: int, gpus: int, batch: int,
               virtual: int = 1, micro: int = 1, attention: float = MCORE_ATTENTION
               ) -> list[str]:
    """`dlperf analyze` for one row of Megatron-Core's 2024 table, as its README says it ran
    (bf16, the distributed optimizer with its gradient reduce-scatter and parameter gather
    overlapped, --tp-comm-overlap: --tp-impl te, sequence parallel, the interleaved
    schedule's transfers overlapped) and as Megatron-Core's
    defaults are (learned positions, LayerNorm, biases, dropout 0.1 with its fused kernels,
    untied output layer, gradient buckets of max(40M, 1M x replicas) fp32 parameters, no
    recompute), in micro-batches of ``micro`` sequences (the table does not say)."""
    replicas = gpus // (tp * pp)
    bucket_mib = megatron_bucket_mib(replicas)
    return (["analyze", "gpt2", "--layers", str(layers), "--d-model", str(hidden), "--heads",
             str(heads), "--vocab", str(MCORE_VOCAB), "--seq-len", str(MCORE_SEQ),
             "--untie-embeddings", "--batch-size", str(micro), "--grad-accum",
             str(batch // replicas // micro), "--dtype", "bf16", "--precision", "fsdp",
             "--train", "--optimizer", "adamw", "--dropout", "0.1", "--fusion", "megatron",
             "--device", "h100-sxm", "--efficiency", f"attention={attention}",
             "--interconnect", "nvlink4-h100,ib-ndr", "--gpus", str(gpus),
             "--distributed-optimizer", "--bucket-cap-mb", f"{bucket_mib:.1f}", "--top", "1"]
            + (["--tp", str(tp), "--tp-impl", "te"] if tp > 1 else [])
            + (["--pp", str(pp), "--pp-virtual", str(virtual)] if pp > 1 else [])
            # Megatron-Core overlaps the interleaved schedule's transfers by default
            + (["--pp-overlap-p2p"] if virtual > 1 else []))


def mcore_variants(row: tuple) -> list[tuple[int, int]]:
    """The (virtual stages, micro-batch size) each row runs with, where the table is silent:
    a row without pipeline stages with micro-batches of one sequence and with one micro-batch
    of all its replica's sequences; a pipelined row (micro-batches of one) with 1F1B and with
    Megatron's interleaved schedule at one block a chunk (the smallest bubble it allows)."""
    _, _, _, layers, tp, pp, gpus, batch, _ = row
    if pp == 1:
        return [(1, 1), (1, batch // (gpus // tp))]
    return [(1, 1), (layers // pp, 1)]


def megatron_core_2024(out: Path) -> None:
    """Each row's teraFLOP/s per GPU, predicted over measured, in each of its variants
    (``mcore_variants``), with the attention share chosen (``MCORE_ATTENTION``) and, to show
    how much rides on it, the preset's and cuDNN's own."""
    from tqdm import tqdm

    from dlperf.provenance import save_result

    rows = []
    runs = [(r, v) for r in MCORE_2024 for v in mcore_variants(r)]
    with tempfile.TemporaryDirectory() as tmp:
        for (model, heads, hidden, layers, tp, pp, gpus, batch, tflops), (virtual, micro) in \
                tqdm(runs, desc="megatron-core 2024"):
            flops = megatron_core_flops(layers, hidden, batch) / gpus
            row = {"model": model, "gpus": gpus, "tp": tp, "pp": pp, "virtual": virtual,
                   "micro_batch": micro,
                   "micro_batches": batch // (gpus // (tp * pp)) // micro,
                   "measured_tflops": tflops, "measured_step_s": flops / (tflops * 1e12)}
            for label, share in (("", MCORE_ATTENTION),
                                 ("_preset_attention", MCORE_ATTENTION_BOUNDS[0]),
                                 ("_cudnn_attention", MCORE_ATTENTION_BOUNDS[1])):
                here = _analyze(mcore_args(layers, hidden, heads, tp, pp, gpus, batch, virtual,
                                           micro, share), tmp)
                row[f"predicted_tflops{label}"] = flops / here["step_s"] / 1e12
                row[f"ratio{label}"] = row[f"predicted_tflops{label}"] / tflops
                if label:
                    continue
                comm = here["communication"]
                tp_comm = comm.get("tensor_parallel") or {}
                row.update(predicted_step_s=here["step_s"],
                           tp_exposed_s=tp_comm.get("exposed_s", 0.0),
                           tp_busy_s=tp_comm.get("busy_s", 0.0),
                           bubble_s=(comm.get("pipeline") or {}).get("bubble_s", 0.0),
                           dp_reduce_s=comm.get("comm_s", 0.0),
                           dp_param_gather_s=comm.get("param_gather_s", 0.0),
                           exposed_comm_s=here["exposed_comm_s"],
                           memory_per_gpu_bytes=(here.get("memory_per_gpu") or {}).get(
                               "total_bytes"),
                           fits=(here.get("memory_per_gpu") or {}).get("fits"))
            rows.append(row)
    # the reading the data allow (benchmarks/README.md): one micro-batch a replica without
    # stages, the interleaved schedule with them
    consistent = [r for r in rows if (r["micro_batches"] == 1 if r["pp"] == 1
                                      else r["virtual"] > 1)]
    strong = []
    with tempfile.TemporaryDirectory() as tmp:
        model, heads, hidden, layers, tp, pp, _, batch, _ = MCORE_2024[6]
        for gpus, mfu in tqdm(MCORE_STRONG, desc="megatron-core 2024, strong scaling"):
            here = _analyze(mcore_args(layers, hidden, heads, tp, pp, gpus, batch,
                                       layers // pp), tmp)
            flops = megatron_core_flops(layers, hidden, batch) / gpus
            strong.append({"model": model, "gpus": gpus, "replicas": gpus // (tp * pp),
                           "micro_batches": batch // (gpus // (tp * pp)),
                           "measured_mfu": mfu,
                           "predicted_mfu": flops / here["step_s"] / H100_BF16_PEAK,
                           "predicted_step_s": here["step_s"],
                           "exposed_comm_s": here["exposed_comm_s"],
                           "bubble_s": here["communication"]["pipeline"]["bubble_s"]})
    fall = {"measured": strong[-1]["measured_mfu"] / strong[0]["measured_mfu"],
            "predicted": strong[-1]["predicted_mfu"] / strong[0]["predicted_mfu"]}
    for x in strong:
        print(f"177B strong scaling on {x['gpus']:5,d} GPUs ({x['micro_batches']} micro-batches "
              f"a replica): MFU measured {x['measured_mfu']:.0%}, predicted "
              f"{x['predicted_mfu']:.1%}; exposed communication {x['exposed_comm_s']:.2f} s, "
              f"bubble {x['bubble_s']:.2f} s of {x['predicted_step_s']:.2f}")
    print(f"MFU at {strong[-1]['gpus']:,} over {strong[0]['gpus']} GPUs: measured "
          f"{fall['measured']:.3f}, predicted {fall['predicted']:.3f}")
    for r in rows:
        print(f"{r['model']:5s} TP{r['tp']} PP{r['pp']:<2d} V{r['virtual']:<2d} x{r['micro_batches']:<2d}"
              f" of {r['micro_batch']} on {r['gpus']:5,d} GPUs: measured "
              f"{r['measured_tflops']:.0f} TFLOP/s a GPU, predicted {r['predicted_tflops']:.0f} "
              f"({r['ratio']:.2f}x; attention as the preset {r['ratio_preset_attention']:.2f}x, "
              f"as cuDNN alone {r['ratio_cudnn_attention']:.2f}x); TP exposed "
              f"{r['tp_exposed_s'] * 1e3:.0f} of {r['tp_busy_s'] * 1e3:.0f} ms, all exposed "
              f"{r['exposed_comm_s']:.2f} s, bubble {r['bubble_s']:.2f} s of "
              f"{r['predicted_step_s']:.2f}")
    save_result(out, "validate-tp-megatron-core-2024",
                {"runs": [list(r) for r in MCORE_2024], "attention": MCORE_ATTENTION,
                 "attention_bounds": list(MCORE_ATTENTION_BOUNDS),
                 "args_32b": mcore_args(48, 7168, 56, 8, 1, 384, 192),
                 "strong_scaling": [list(x) for x in MCORE_STRONG]},
                {"rows": rows, "consistent": consistent, "strong_scaling": strong,
                 "strong_scaling_fall": fall})
    print(f"Wrote {out}")


# Llama 3 405B's pre-training (arXiv 2407.21783, section 3.3.2 and Table 4; the same figures
# on Meta's SC'24 slides): BF16 on H100 SXM (80 GB, 700 W), 8 a server on NVLink, RoCE at
# 400 Gb/s between GPUs (section 3.3.1), TP 8, PP 16, 16M tokens a step: (row, GPUs, CP,
# tokens a sequence, data-parallel groups, sequences a group a step, teraFLOP/s a GPU)
LLAMA3_405B = (
    ("8K on 8,192 GPUs", 8192, 1, 8192, 64, 32, 430.0),
    ("8K on 16,384 GPUs", 16384, 1, 8192, 128, 16, 400.0),
    ("128K, CP 16, on 16,384 GPUs", 16384, 16, 131072, 8, 16, 380.0),
)
# 126 blocks of 16,384, 128 heads of 128, 8 K/V heads, SwiGLU of 53,248, vocabulary 128,256,
# untied: dlperf's llama3-405b preset
LLAMA3_LAYERS, LLAMA3_DIM, LLAMA3_VOCAB = 126, 16384, 128256
LLAMA3_BLOCK_PARAMS = (2 * LLAMA3_DIM ** 2 + 2 * LLAMA3_DIM * 8 * 128 + 3 * LLAMA3_DIM * 53248
                       + 2 * LLAMA3_DIM)  # 3,187,703,808 a block
# the two readings of the stack the paper leaves open (not chosen after the rows were run):
# "eager": PyTorch's tensor parallelism with every collective exposed (--tp-impl torch),
# torchtitan's unfused kernels and the Hopper presets' FlashAttention-2 share; "overlapped":
# the Megatron-Core 2024 reading (--tp-impl te: its overlapped collectives and its fused
# RMSNorm, SwiGLU and rotary kernels, models/fused.py; cuDNN's attention share
# MCORE_ATTENTION, chosen for that source)
LLAMA3_STACKS = {"eager": ["--tp-impl", "torch"],
                 "overlapped": ["--tp-impl", "te", "--efficiency",
                                f"attention={MCORE_ATTENTION}"]}
LLAMA3_OUT = ROOT / "benchmarks/results/tp-llama3-405b.json"


def llama3_flops_per_token(seq: int, causal: bool) -> float:
    """A token's training FLOPs in Llama 3 405B: 6 per weight it multiplies (the blocks' and
    the output layer's; the input embedding is a lookup) plus the attention's scores and
    values, 6 L d s for the causal half the kernels compute or 12 L d s for the whole matrix
    (PaLM's count, Chowdhery et al. 2022, appendix B). The paper does not say which its
    TFLOPs use; at 8K the two differ by 4%, at 128K by 40%."""
    weights = LLAMA3_LAYERS * LLAMA3_BLOCK_PARAMS + LLAMA3_VOCAB * LLAMA3_DIM + LLAMA3_DIM
    return 6 * weights + (6 if causal else 12) * LLAMA3_LAYERS * LLAMA3_DIM * seq


def llama3_args(gpus: int, cp: int, seq: int, sequences: int, micro: int, stack: str
                ) -> list[str]:
    """`dlperf analyze` for one row of Llama 3's Table 4 as section 3.3.2 describes the run:
    BF16 with FP32 gradients and their reduce-scatter in FP32 (--precision fsdp), FSDP that
    keeps the gathered weights through the step (ZeRO-2: the distributed optimizer's
    reduce-scatter and gather, once a step), the interleaved schedule with one block a chunk
    and one block fewer on the first and the last stage (16 x 8 - 2 = 126), its
    point-to-point transfers asynchronous (--pp-overlap-p2p), no activation checkpointing at
    8K, all-gather context parallelism inside TP x CP = 128 GPUs; ``micro`` sequences a
    micro-batch (the paper does not say)."""
    return (["analyze", "llama3-405b", "--train", "--dtype", "bf16", "--precision", "fsdp",
             "--optimizer", "adamw", "--device", "h100-sxm", "--seq-len", str(seq),
             "--batch-size", str(micro), "--grad-accum", str(sequences // micro),
             "--gpus", str(gpus), "--tp", "8", "--pp", "16", "--pp-virtual", "8",
             "--pp-first-layers", "7", "--pp-last-layers", "7", "--pp-overlap-p2p",
             "--distributed-optimizer", "--interconnect", "nvlink4-h100,roce-400g",
             "--top", "1"]
            + (["--cp", str(cp), "--cp-comm", "allgather"] if cp > 1 else [])
            + LLAMA3_STACKS[stack])


def llama3_405b(out: Path) -> None:
    """Each row's teraFLOP/s per GPU under both counts (``llama3_flops_per_token``), in each
    stack reading and micro-batch size, and the two measures the stack's own speed cancels
    in: 16,384 GPUs over 8,192 at 8K (the same count), and 128K with CP over 8K on 16,384
    GPUs (the same GPUs, groups and micro-batches; under each count)."""
    from tqdm import tqdm

    from dlperf.provenance import save_result

    rows = []
    runs = [(r, stack, micro) for r in LLAMA3_405B for stack in LLAMA3_STACKS
            for micro in (1, 2)]
    with tempfile.TemporaryDirectory() as tmp:
        for (label, gpus, cp, seq, groups, sequences, tflops), stack, micro in tqdm(
                runs, desc="llama 3 405b"):
            whole = _analyze(llama3_args(gpus, cp, seq, sequences, micro, stack), tmp,
                             whole=True)
            here = whole["scale_out"]["at_requested_scale"]
            tokens = here["per_gpu_samples_per_s"] * seq
            comm = here["communication"]
            row = {"row": label, "gpus": gpus, "cp": cp, "seq": seq,
                   "data_parallel": groups, "stack": stack, "micro_batch": micro,
                   "micro_batches": sequences // micro, "measured_tflops": tflops,
                   "predicted_tokens_per_s_per_gpu": tokens,
                   "predicted_step_s": here["step_s"],
                   "bubble_s": comm["pipeline"]["bubble_s"],
                   "fill_stages": comm["pipeline"]["fill_stages"],
                   "tp_exposed_s": comm["tensor_parallel"]["exposed_s"],
                   "cp_exposed_s": (comm.get("context_parallel") or {}).get("exposed_s", 0.0),
                   "exposed_comm_s": here["exposed_comm_s"],
                   "straggler_s": here["straggler_s"],
                   "memory_per_gpu_bytes": (here.get("memory_per_gpu") or {}).get(
                       "total_bytes"),
                   # what the memory above is made of (scaling.memory_per_gpu's parts);
                   # the stage's gradients, held whole in FP32, among them
                   "memory_parts_bytes": {
                       k: v for k, v in (here.get("memory_per_gpu") or {}).items()
                       if k.endswith("_bytes") and k != "total_bytes"},
                   "gradient_bytes_per_gpu": comm["gradient_bytes"],
                   # one micro-batch's saved activations a block on one rank (the whole
                   # model's capture over its blocks): what the memory above is made of
                   "activations_bytes_per_block": whole["memory"]["activations_bytes"]
                   / LLAMA3_LAYERS}
            for count, causal in (("causal", True), ("full", False)):
                predicted = tokens * llama3_flops_per_token(seq, causal) / 1e12
                row[f"predicted_tflops_{count}"] = predicted
                row[f"ratio_{count}"] = predicted / tflops
            rows.append(row)
    relative = []
    for stack in LLAMA3_STACKS:
        for micro in (1, 2):
            a, b, c = (next(r for r in rows if r["row"] == x[0] and r["stack"] == stack
                            and r["micro_batch"] == micro) for x in LLAMA3_405B)
            for count in ("causal", "full"):
                relative.append({
                    "stack": stack, "micro_batch": micro, "count": count,
                    "measure": "16,384 over 8,192 GPUs at 8K",
                    "measured": b["measured_tflops"] / a["measured_tflops"],
                    "predicted": b[f"predicted_tflops_{count}"] / a[f"predicted_tflops_{count}"]})
                relative.append({
                    "stack": stack, "micro_batch": micro, "count": count,
                    "measure": "128K with CP 16 over 8K, 16,384 GPUs",
                    "measured": c["measured_tflops"] / b["measured_tflops"],
                    "predicted": c[f"predicted_tflops_{count}"] / b[f"predicted_tflops_{count}"]})
    for x in relative:
        x["ratio"] = x["predicted"] / x["measured"]
    for r in rows:
        print(f"{r['row']:28s} {r['stack']:10s} micro {r['micro_batch']} x{r['micro_batches']:<2d}"
              f": measured {r['measured_tflops']:.0f} TFLOP/s a GPU, predicted "
              f"{r['predicted_tflops_causal']:.0f} causal ({r['ratio_causal']:.2f}x), "
              f"{r['predicted_tflops_full']:.0f} full ({r['ratio_full']:.2f}x); bubble "
              f"{r['bubble_s']:.2f} s, TP {r['tp_exposed_s']:.2f} s, CP {r['cp_exposed_s']:.2f} s"
              f" of {r['predicted_step_s']:.2f}; "
              f"{r['memory_per_gpu_bytes'] / 2**30:.1f} GiB a GPU")
    for x in relative:
        if x["count"] == "causal" or "CP" in x["measure"]:
            print(f"{x['measure']} ({x['stack']}, micro {x['micro_batch']}, {x['count']}): "
                  f"measured {x['measured']:.3f}, predicted {x['predicted']:.3f} "
                  f"({x['ratio']:.2f}x)")
    save_result(out, "validate-tp-llama3-405b",
                {"runs": [list(r) for r in LLAMA3_405B], "stacks": LLAMA3_STACKS,
                 "args_8k": llama3_args(8192, 1, 8192, 32, 1, "eager"),
                 "args_cp": llama3_args(16384, 16, 131072, 16, 1, "eager")},
                {"rows": rows, "relative": relative})
    print(f"Wrote {out}")


# the 26.x recipe's pipeline_model_parallel_layout for the 70B (--pp-layout)
BRIDGE_70B_LAYOUT = "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
# Megatron-Bridge's DGX-H100 FP8-CS rows (the module docstring): (label, model, GPUs, TP, PP,
# virtual stages, CP, first/last stage blocks (or a --pp-layout) or None, micro-batches a
# step per replica,
# [(container, tokens/s per GPU, model TFLOP/s per GPU)], and where not the H100 rows'
# default (h100-sxm, micro-batch 1, ddp): device, micro-batch, strategy); the 8B H100 row
# shards the model with Megatron-FSDP over the 8 GPUs of a node (its table's FSDP 8:
# --strategy fsdp) where the others run the distributed optimizer
BRIDGE_FP8 = (
    ("8B, 8 GPUs, GBS 128, FSDP", "llama3-8b", 8, 1, 1, 1, 1, None, 16,
     [("25.11", 14451, 744)], "h100-sxm", 1, "fsdp"),
    ("70B, 64 GPUs, GBS 128", "llama3-70b", 64, 4, 8, 5, 1, None, 64,
     [("25.11", 1602, 719)]),
    ("70B, 64 GPUs, GBS 256", "llama3-70b", 64, 4, 8, 5, 1, BRIDGE_70B_LAYOUT, 128,
     [("26.02", 1621, 728), ("26.02.01", 1639, 736), ("26.04", 1633, 734),
      ("26.04.01", 1664, 731)]),
    ("405B, 1,024 GPUs, GBS 512", "llama3-405b", 1024, 8, 8, 8, 2, 15, 64,
     [("25.11", 292, 737)]),
    ("405B, 1,024 GPUs, GBS 1,536", "llama3-405b", 1024, 8, 8, 8, 2, 15, 192,
     [("26.02", 311, 784), ("26.04.01", 328, 827), ("26.06", 326, 822)]),
    # DGX-B200 (the same table, 25.11): Blackwell's FP8 GEMMs take any layout (no transposes)
    ("8B, 8 B200s, MBS 2, GBS 128", "llama3-8b", 8, 1, 1, 1, 1, None, 8,
     [("25.11", 30624, 1576)], "b200", 2, "ddp"),
    ("405B, 128 B200s, GBS 64", "llama3-405b", 128, 4, 8, 8, 2, 15, 32,
     [("25.11", 661, 1667)], "b200", 1, "ddp"),
    # DGX-GB200 (25.11): v0.2.0 gives the GB200 the B200's config (LLAMA3_8B_GB200_FP8_CS_BASE_
    # CONFIG: micro-batch 2, full-iteration CUDA graphs), so the two rows differ in the GPU only
    ("8B, 8 GB200s, MBS 2, GBS 128", "llama3-8b", 8, 1, 1, 1, 1, None, 8,
     [("25.11", 31508, 1622)], "gb200", 2, "ddp"),
    # DGX-GB300 (25.11), held out: v0.2.0's LLAMA3_8B_GB300_FP8_CS_BASE_CONFIG runs micro-batch
    # 4 (the table's MBS column says 2, its GA 8; the code's GA is 4) with the same CUDA graphs;
    # the same dense FP8 peak as the GB200's, at 1,400 W instead of 1,200 W
    ("8B, 8 GB300s, MBS 4, GBS 128", "llama3-8b", 8, 1, 1, 1, 1, None, 4,
     [("25.11", 37556, 1933)], "gb300", 4, "ddp"),
    # DGX-GB300 and DGX-GB200, 256 GPUs (26.02-26.06), held out: the 405B's V2 configs (the
    # same from v0.3.0 to v0.4.2, LLAMA31_405B_PRETRAIN_CONFIG_GB{3,2}00_FP8_CS_V2): TP 4, CP 1,
    # 4 virtual stages, micro-batch 1, on PP 8 (GB300) or PP 16 (GB200), the embedding and the
    # loss counted as a block each in the split (account_for_embedding/loss_in_pipeline_split:
    # 128 over 8 stages leaves 15 blocks on the ends, over 16 stages 7); 26.02.01's GB300 row
    # ran TP 2 CP 2 and is left out
    ("405B, 256 GB300s, GBS 1,536", "llama3-405b", 256, 4, 8, 4, 1, 15, 192,
     [("26.02", 988, 2495), ("26.04", 1036, 2615), ("26.04.01", 1024, 2617),
      ("26.06", 1048, 2646)], "gb300", 1, "ddp"),
    ("405B, 256 GB200s, GBS 1,536", "llama3-405b", 256, 4, 16, 4, 1, 7, 384,
     [("26.02", 793, 2004), ("26.02.01", 818, 2063), ("26.04", 842, 2126),
      ("26.04.01", 864, 2144), ("26.06", 843, 2129)], "gb200", 1, "ddp"),
)
# each device's interconnect (DGX H100 and DGX B200: NVLink inside, eight 400 Gb/s NDR NICs
# between) and attention shares; the B200 rows run at the preset's shares (no 2025 reading of
# cuDNN's Blackwell attention is published), the H100 rows at three (BRIDGE_ATTENTION)
BRIDGE_INTERCONNECT = {"h100-sxm": "nvlink4-h100,ib-ndr", "b200": "nvlink5-b200,ib-ndr",
                       "gb200": "nvlink5-nvl72,ib-ndr",
                       # Blackwell Ultra systems: one 800 Gb/s ConnectX-8 a GPU
                       "b300": "nvlink5-b300,ib-xdr", "gb300": "nvlink5-nvl72,ib-xdr"}
BRIDGE_OUT = ROOT / "benchmarks/results/tp-megatron-bridge-fp8.json"
# the attention shares each row is run at: cuDNN's through TE as read for Megatron-Core 2024
# (the headline), the Hopper presets', cuDNN's own fraction of the peak
BRIDGE_ATTENTION = {"mcore": MCORE_ATTENTION, "preset": MCORE_ATTENTION_BOUNDS[0],
                    "cudnn": MCORE_ATTENTION_BOUNDS[1]}
BRIDGE_ATTENTION_B200 = {"mcore": None}  # the headline: the preset's own shares


def bridge_args(model: str, gpus: int, tp: int, pp: int, virtual: int, cp: int,
                ends: int | str | None, micro_batches: int, fp8: bool,
                attention: float | None, device: str = "h100-sxm", micro: int = 1,
                strategy: str = "ddp", recipe: str = "current") -> list[str]:
    """`dlperf analyze` for one of Megatron-Bridge's H100 rows (``BRIDGE_FP8``), in FP8 with
    current scaling (or ``recipe``: ``BRIDGE_MXFP8``'s mxfp8) or, for the predicted gain, in
    BF16; its gradients reduced in BF16, as
    every release's performance config for Llama sets it (grad_reduce_in_fp32 off in
    scripts/performance/configs/llama3/ at v0.2.0, llama/ from v0.3.0 to v0.5.1)."""
    sharded = ["--strategy", "fsdp"] if strategy == "fsdp" else [
        "--distributed-optimizer"] if tp == pp == 1 else [
        "--tp", str(tp), "--pp", str(pp), "--pp-virtual", str(virtual), "--pp-overlap-p2p",
        "--distributed-optimizer"]
    return (["analyze", model, "--train", "--dtype", "bf16", "--precision", "fsdp",
             "--optimizer", "adamw", "--device", device, "--seq-len", "8192",
             "--batch-size", str(micro), "--grad-accum", str(micro_batches), "--gpus", str(gpus)]
            + sharded + ["--reduce-dtype", "bf16"] + ["--interconnect", BRIDGE_INTERCONNECT[device], "--tp-impl", "te",
                         "--top", "1",
                         # its Llama recipes' cross_entropy_loss_fusion with the "te" impl
                         # (src/megatron/bridge/recipes/llama/llama3.py): TE's one-pass loss
                         "--loss", "fused"]
            + (["--efficiency", f"attention={attention}"] if attention is not None else [])
            + (["--pp-layout", ends] if isinstance(ends, str) else
               ["--pp-first-layers", str(ends), "--pp-last-layers", str(ends)] if ends else [])
            + (["--cp", str(cp)] if cp > 1 else [])
            + (["--fp8", recipe] if fp8 else []))


def megatron_bridge_fp8(out: Path) -> None:
    """Each row's tokens/s per GPU predicted in FP8 at the three attention shares, and in BF16
    at the headline one, against the published rates (each container's, and their median)."""
    import statistics

    from tqdm import tqdm

    from dlperf.provenance import save_result

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for (label, model, gpus, tp, pp, virtual, cp, ends, micro, measured, *where) in tqdm(
                BRIDGE_FP8, desc="megatron-bridge fp8"):
            device, batch, strategy = where or ("h100-sxm", 1, "ddp")
            shares = BRIDGE_ATTENTION if device == "h100-sxm" else BRIDGE_ATTENTION_B200
            runs = {}
            for name, share in shares.items():
                whole = _analyze(bridge_args(model, gpus, tp, pp, virtual, cp, ends, micro,
                                             True, share, device, batch, strategy), tmp,
                                 whole=True)
                runs[f"fp8_{name}"] = whole["scale_out"]["at_requested_scale"]
                if name == "mcore":  # one rank's kernels: a block's time, the output layer's
                    kernels = whole["layers"]
                    blocks = {k["module"].split(".")[1] for k in kernels
                              if k["module"].startswith("blocks.")}
                    block_s = sum(k["predicted_time_s"] for k in kernels
                                  if k["module"].startswith("blocks.")) / len(blocks)
                    output_s = sum(k["predicted_time_s"] for k in kernels
                                   if k["module"].split(".")[0] in ("ln_f", "head", "loss"))
            runs["bf16_mcore"] = _analyze(bridge_args(model, gpus, tp, pp, virtual, cp, ends,
                                                      micro, False, shares["mcore"], device,
                                                      batch, strategy), tmp)
            if isinstance(ends, str):  # the same on even stages: what the layout is worth
                runs["fp8_mcore_even_stages"] = _analyze(bridge_args(
                    model, gpus, tp, pp, virtual, cp, None, micro, True, shares["mcore"],
                    device, batch, strategy), tmp)
            rate = statistics.median(m[1] for m in measured)
            row = {"row": label, "device": device, "model": model, "gpus": gpus, "tp": tp,
                   "pp": pp, "micro_batch": batch,
                   "virtual": virtual, "cp": cp, "micro_batches": micro,
                   "measured": [{"container": c, "tokens_per_s_per_gpu": t,
                                 "model_tflops_per_gpu": f} for c, t, f in measured],
                   "measured_tokens_per_s_per_gpu": rate}
            for key, here in runs.items():
                tokens = here["per_gpu_samples_per_s"] * 8192  # (samples: sequences)
                comm = here["communication"]
                row[key] = {"predicted_tokens_per_s_per_gpu": tokens, "ratio": tokens / rate,
                            "step_s": here["step_s"],
                            "bubble_s": (comm.get("pipeline") or {}).get("bubble_s", 0.0),
                            "tp_exposed_s": (comm.get("tensor_parallel") or {}).get(
                                "exposed_s", 0.0),
                            "cp_exposed_s": (comm.get("context_parallel") or {}).get(
                                "exposed_s", 0.0),
                            "exposed_comm_s": here["exposed_comm_s"],
                            "straggler_s": here["straggler_s"],
                            "memory_per_gpu_bytes": (here.get("memory_per_gpu") or {}).get(
                                "total_bytes")}
            # a block's predicted forward and backward on one rank, and the output layer's
            # (its norm, GEMMs and loss) in blocks: what the last stage runs beside its blocks
            row["block_s"], row["output_layer_blocks"] = block_s, output_s / block_s
            row["predicted_fp8_gain"] = (row["fp8_mcore"]["predicted_tokens_per_s_per_gpu"]
                                         / row["bf16_mcore"]["predicted_tokens_per_s_per_gpu"])
            rows.append(row)
            print(f"{label:28s} measured {rate:,.0f} tokens/s a GPU "
                  f"({min(m[1] for m in measured):,}-{max(m[1] for m in measured):,}); FP8 "
                  f"predicted {row['fp8_mcore']['predicted_tokens_per_s_per_gpu']:,.0f} "
                  f"({row['fp8_mcore']['ratio']:.2f}x"
                  + (f"; attention at the preset's share {row['fp8_preset']['ratio']:.2f}x, "
                     f"at cuDNN's {row['fp8_cudnn']['ratio']:.2f}x" if "fp8_cudnn" in row else "")
                  + ")"
                  f"; BF16 predicted {row['bf16_mcore']['predicted_tokens_per_s_per_gpu']:,.0f}"
                  f" (FP8 gain {row['predicted_fp8_gain']:.2f}x); "
                  f"{row['fp8_mcore']['memory_per_gpu_bytes'] / 2**30:.1f} GiB a GPU")
    save_result(out, "validate-tp-megatron-bridge-fp8",
                {"rows": [list(r) for r in BRIDGE_FP8], "attention": BRIDGE_ATTENTION,
                 "args_8b": bridge_args(*BRIDGE_FP8[0][1:9], True, MCORE_ATTENTION,
                                        *BRIDGE_FP8[0][10:]),
                 "args_70b": bridge_args(*BRIDGE_FP8[1][1:9], True, MCORE_ATTENTION),
                 "args_405b": bridge_args(*BRIDGE_FP8[3][1:9], True, MCORE_ATTENTION),
                 "args_8b_b200": bridge_args(*BRIDGE_FP8[5][1:9], True, None,
                                             *BRIDGE_FP8[5][10:])},
                {"rows": rows, "cudnn_attention": BRIDGE_ATTENTION["cudnn"]})
    print(f"Wrote {out}")


# Megatron-Bridge's Llama 3 rows in MXFP8 (TE's MXFP8BlockScaling, "FP8-MX") on GB300s and
# GB200s, held out (no parameter was fitted to them): docs/performance-summary.md and
# -archive.md's 26.02 to 26.06 tables, whose V2 configs are the same from v0.3.0 to v0.5.0
# (scripts/performance/configs/llama/: LLAMA3_70B_PRETRAIN_CONFIG_GB{3,2}00_FP8_MX_V2, GBS 256,
# TP 1 (GB300) or 2 (GB200), PP 4, 5 virtual stages, an even split (the 70B recipe's layout
# None); LLAMA31_405B_PRETRAIN_CONFIG_GB300_FP8_MX_V2, TP 2 PP 8 CP 2, 4 virtual stages, and
# _GB200_FP8_MX_V2, TP 4 PP 16, 8 virtual stages, GBS 1,536, the embedding and the loss a
# block each in the split (15 blocks on the end stages of 8, 7 of 16, as ``BRIDGE_FP8``'s
# 405B rows); micro-batch 1, TE's tensor-parallel overlap, no CUDA graphs, no recomputation).
# 26.02.01's 70B GB300 row (micro-batch 2, no virtual stages) is not its release's config
# and is left out. (label, model, GPUs, TP, PP, virtual stages, CP, end-stage blocks or
# None, micro-batches a step per replica, [(container, tokens/s a GPU, model TFLOP/s a GPU)],
# device)
BRIDGE_MXFP8 = (
    ("70B MXFP8, 64 GB300s, TP 1 PP 4", "llama3-70b", 64, 1, 4, 5, 1, None, 16,
     [("26.02", 4596, 2064), ("26.04", 4742, 2131), ("26.04.01", 4864, 2186)], "gb300"),
    ("70B MXFP8, 64 GB200s, TP 2 PP 4", "llama3-70b", 64, 2, 4, 5, 1, None, 32,
     [("26.02", 3613, 1623), ("26.02.01", 3837, 1724), ("26.04", 3828, 1721),
      ("26.04.01", 3712, 1664)], "gb200"),
    ("405B MXFP8, 256 GB300s, TP 2 PP 8 CP 2", "llama3-405b", 256, 2, 8, 4, 2, 15, 192,
     [("26.02", 931, 2349), ("26.02.01", 949, 2394), ("26.04", 968, 2443),
      ("26.04.01", 960, 2453), ("26.06", 952, 2403)], "gb300"),
    ("405B MXFP8, 256 GB200s, TP 4 PP 16", "llama3-405b", 256, 4, 16, 8, 1, 7, 384,
     [("26.02", 786, 1983), ("26.02.01", 775, 1957), ("26.04", 793, 2002),
      ("26.04.01", 800, 1994), ("26.06", 783, 1976)], "gb200"),
)
BRIDGE_MXFP8_OUT = ROOT / "benchmarks/results/tp-megatron-bridge-mxfp8.json"


def megatron_bridge_mxfp8(out: Path) -> None:
    """Each ``BRIDGE_MXFP8`` row's tokens/s a GPU predicted in MXFP8 (the headline), and on
    the same layout with per-tensor current scaling and in BF16, against the published rates
    (each container's, and their median), with the tensor-parallel time left exposed, the
    pipeline's bubble and the memory a GPU."""
    import statistics

    from tqdm import tqdm

    from dlperf.provenance import save_result

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for (label, model, gpus, tp, pp, virtual, cp, ends, micro, measured,
             device) in tqdm(BRIDGE_MXFP8, desc="megatron-bridge mxfp8", unit="row"):
            rate = statistics.median(m[1] for m in measured)
            row = {"row": label, "device": device, "model": model, "gpus": gpus, "tp": tp,
                   "pp": pp, "virtual": virtual, "cp": cp, "micro_batches": micro,
                   "measured": [{"container": c, "tokens_per_s_per_gpu": t,
                                 "model_tflops_per_gpu": f} for c, t, f in measured],
                   "measured_tokens_per_s_per_gpu": rate}
            for key, fp8, recipe in (("mxfp8", True, "mxfp8"), ("fp8_current", True, "current"),
                                     ("bf16", False, "current")):
                here = _analyze(bridge_args(model, gpus, tp, pp, virtual, cp, ends, micro, fp8,
                                            None, device, 1, "ddp", recipe), tmp)
                tokens = here["per_gpu_samples_per_s"] * 8192  # (samples: sequences)
                comm = here["communication"]
                row[key] = {"predicted_tokens_per_s_per_gpu": tokens, "ratio": tokens / rate,
                            "step_s": here["step_s"],
                            "tp_exposed_s": (comm.get("tensor_parallel") or {}).get(
                                "exposed_s", 0.0),
                            "bubble_s": (comm.get("pipeline") or {}).get("bubble_s", 0.0),
                            "exposed_comm_s": here["exposed_comm_s"],
                            "memory_gib": here["memory_per_gpu"]["total_bytes"] / 2**30}
            row["predicted_mx_over_current"] = (row["mxfp8"]["predicted_tokens_per_s_per_gpu"]
                                                / row["fp8_current"][
                                                    "predicted_tokens_per_s_per_gpu"])
            rows.append(row)
            print(f"{label:40s} measured {rate:,.0f} tokens/s a GPU "
                  f"({min(m[1] for m in measured):,}-{max(m[1] for m in measured):,}); "
                  f"MXFP8 predicted {row['mxfp8']['predicted_tokens_per_s_per_gpu']:,.0f} "
                  f"({row['mxfp8']['ratio']:.2f}x; per-tensor FP8 "
                  f"{row['fp8_current']['ratio']:.2f}x, BF16 {row['bf16']['ratio']:.2f}x); "
                  f"{row['mxfp8']['memory_gib']:.0f} GiB a GPU")
    save_result(out, "validate-tp-megatron-bridge-mxfp8",
                {"source": "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md and "
                           "performance-summary-archive.md (NeMo 26.02-26.06 containers), "
                           "configs from scripts/performance/configs/llama/ at v0.3.0-v0.5.0",
                 "rows": [list(r) for r in BRIDGE_MXFP8],
                 "args": [bridge_args(*r[1:9], True, None, r[10], 1, "ddp", "mxfp8")
                          for r in BRIDGE_MXFP8]},
                {"rows": rows})
    print(f"Wrote {out}")


ASYNC_TP_OUT = ROOT / "benchmarks/results/tp-torchtitan-async.json"
# (model, GPUs, local batch, activation checkpointing, {(float8 recipe or None, tp impl):
# measured tokens/s per GPU})
ASYNC_TP_RUNS = (
    ("llama3-70b", 256, 16, "full",
     {(None, "torch"): 597.3, (None, "torch-async"): 652.4,
      ("tensorwise", "torch"): 809.8, ("tensorwise", "torch-async"): 942.4,
      ("rowwise", "torch"): 599.6, ("rowwise", "torch-async"): 624.8}),
    ("llama3-8b", 64, 12, "selective-op",
     {(None, "torch"): 4378.0, (None, "torch-async"): 4809.4,
      ("tensorwise", "torch"): 5078.1, ("tensorwise", "torch-async"): 5570.1,
      ("rowwise", "torch"): 3708.5, ("rowwise", "torch-async"): 3914.9}),
    # the same stack three months before, on 128 GPUs (FSDP 16 x TP 8): pytorch/pytorch#149990
    # (2025-03-25, a torch nightly); its rowwise rows are not all given, so not run
    ("llama3-70b", 128, 16, "full",
     {(None, "torch"): 598.0, (None, "torch-async"): 673.0,
      ("tensorwise", "torch"): 820.0, ("tensorwise", "torch-async"): 950.0}),
)


def async_tp_args(model: str, gpus: int, batch: int, checkpointing: str, impl: str,
                  recipe: str | None = None) -> list[str]:
    return ["analyze", model, "--device", "h100-sxm", "--seq-len", "8192", "--dtype", "bf16",
            "--precision", "fsdp", "--train", "--batch-size", str(batch), "--gpus", str(gpus),
            "--tp", "8", "--tp-impl", impl, "--strategy", "fsdp",
            "--activation-checkpointing", checkpointing, "--fusion", "compile-blocks",
            "--loss", "fused", "--interconnect", "nvlink4-h100,ib-ndr", "--top", "1"] + (
                ["--fp8", recipe] if recipe else [])


def torchtitan_async_tp(out: Path) -> None:
    from tqdm import tqdm

    from dlperf.provenance import save_result

    rows, speedups, float8 = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [(run, key) for run in ASYNC_TP_RUNS for key in run[4]]
        by_key = {}
        for (model, gpus, batch, checkpointing, measured), (recipe, impl) in tqdm(
                jobs, desc="torchtitan-async-tp"):
            here = _analyze(async_tp_args(model, gpus, batch, checkpointing, impl, recipe), tmp)
            tensor = here["communication"]["tensor_parallel"]
            predicted = here["per_gpu_samples_per_s"] * 8192
            tokens = measured[recipe, impl]
            row = {"model": model, "gpus": gpus, "tp": 8, "batch": batch, "fp8": recipe,
                   "tp_impl": impl, "measured_per_gpu": tokens,
                   "predicted_per_gpu": predicted, "ratio": predicted / tokens,
                   "tp_busy_s": tensor["busy_s"], "tp_exposed_s": tensor["exposed_s"],
                   "step_s": here["step_s"]}
            rows.append(row)
            by_key[model, gpus, recipe, impl] = row
    for model, gpus, _, _, measured in ASYNC_TP_RUNS:
        for recipe in (None, "tensorwise", "rowwise"):
            if (recipe, "torch") not in measured:
                continue
            vanilla = by_key[model, gpus, recipe, "torch"]
            fused = by_key[model, gpus, recipe, "torch-async"]
            m = fused["measured_per_gpu"] / vanilla["measured_per_gpu"]
            p = fused["predicted_per_gpu"] / vanilla["predicted_per_gpu"]
            speedups.append({"model": model, "gpus": gpus, "fp8": recipe, "measured": m,
                             "predicted": p, "ratio": p / m})
            if recipe is None:
                continue
            for impl in ("torch", "torch-async"):  # what float8 gains over BF16, same TP
                f8, bf16 = by_key[model, gpus, recipe, impl], by_key[model, gpus, None, impl]
                m = f8["measured_per_gpu"] / bf16["measured_per_gpu"]
                p = f8["predicted_per_gpu"] / bf16["predicted_per_gpu"]
                float8.append({"model": model, "gpus": gpus, "fp8": recipe, "tp_impl": impl,
                               "measured": m, "predicted": p, "ratio": p / m})
    for r in rows:
        print(f"{r['model']:10s} {r['gpus']:3d} GPUs {r['fp8'] or 'bf16':10s} {r['tp_impl']:11s}: "
              f"measured {r['measured_per_gpu']:7,.1f} tokens/s per GPU, predicted "
              f"{r['predicted_per_gpu']:7,.1f} ({r['ratio']:.2f}x)")
    for p in speedups:
        print(f"{p['model']:10s} {p['gpus']:3d} {p['fp8'] or 'bf16':10s} async over vanilla: "
              f"measured {p['measured']:.3f}, predicted {p['predicted']:.3f} "
              f"({p['ratio']:.2f}x)")
    for p in float8:
        print(f"{p['model']:10s} {p['gpus']:3d} {p['fp8']:10s} over bf16 ({p['tp_impl']}): "
              f"measured {p['measured']:.3f}, predicted {p['predicted']:.3f} "
              f"({p['ratio']:.2f}x)")
    save_result(out, "validate-tp-torchtitan-async",
                {"runs": [[m, g, b, c, [[r, i, t] for (r, i), t in ts.items()]]
                          for m, g, b, c, ts in ASYNC_TP_RUNS],
                 "args": async_tp_args("MODEL", 0, 0, "AC", "IMPL", "RECIPE")},
                {"rows": rows, "async_over_vanilla": speedups, "float8_over_bf16": float8})
    print(f"Wrote {out}")


# Megatron-DeepSpeed (DeepSpeed's pipeline engine and data parallelism around Megatron-LM's
# tensor-parallel layers). BLOOM-176B (bigscience-workshop/bigscience, train/tr11-176B-ml/
# README.md at commit e726b159, tr11-176B-ml.slurm at 003b2505, its 48-node version; the
# README's 149.77 TFLOP/s are Megatron's count over 384 GPUs): 70 layers of 14,336, 112 heads,
# vocabulary padded to 250,880, 2,048 tokens, ALiBi (no position table: its learned one here
# is 29M parameters of 176B), bf16, TP 4 x PP 12 x DP 8 on 384 A100 80 GB (48 Jean Zay nodes,
# 4 Omni-Path links of 100 Gb/s each), micro-batches of 2 sequences, global batch 2,048 (128
# micro-batches a replica), --checkpoint-activations, dropout 0.1 (Megatron's default, kept),
# ZeRO stage 0 with DeepSpeed's BF16_Optimizer, the stages split as "[embed | 5 blocks], 6,
# ..., 6, [5 blocks | embed]" ('type:transformer|embedding'). The log line at the end of the
# first epoch: iteration 85,376, "elapsed time per iteration (s): 104.70 | global batch size:
# 2048 | ... | TFLOPs: 149.77". (run, layers, hidden, heads, vocabulary, tp, pp, first and
# last stage's blocks, GPUs, micro-batch, global batch, iteration s)
BLOOM = (("BLOOM-176B", 70, 14336, 112, 250880, 4, 12, 5, 384, 2, 2048, 104.70),)
# Megatron-Turing NLG 530B (Smith et al., arXiv 2201.11990, section 2.4, as cli99/llm-analysis
# examples/megatron-turing-nlg/README.md quotes it): the 530B GPT (105 layers of 20,480, 128
# heads; vocabulary 51,200 here, as Megatron pads GPT-2's), 2,048 tokens, TP 8 x PP 35 on DGX
# A100 80 GB nodes of Selene (HDR InfiniBand), global batch 1,920, iteration 60.1, 50.2 and
# 44.4 s on 280, 350 and 420 nodes, "126, 121 and 113 teraFLOP/s per GPU" (Megatron's count
# with recompute, ``megatron_flops``, gives 125.7, 120.4 and 113.5). The micro-batch and the
# precision path are not in what is quoted: micro-batches of one sequence (Narayanan et al.'s
# for this model) and two readings of the stack, DeepSpeed's BF16_Optimizer and Megatron-LM's
# own of 2021 (narayanan-2021's). (GPUs, iteration s, teraFLOP/s per GPU)
MT_NLG = ((2240, 60.1, 126), (2800, 50.2, 121), (3360, 44.4, 113))
# bigscience's own timing of the two stacks before BLOOM's run (train/tr11-176B-ml/
# chronicles-prequel.md at commit 053adafe, "Trying with ZeRO_STAGE=0/1"): a 181B model (72
# layers of 14,336, 64 heads, vocabulary 250k: 250,880 here) on 48 nodes, TP 8 x PP 12 x DP 4,
# micro-batches of 2, batch 2,048, the second iteration of each run: ZeRO stage 0 (the
# BF16_Optimizer's branch) 137.34 s, stage 1 (DeepSpeed's master) 120.29 s. Its stages' split
# is not stated (run even: 6 blocks each) nor stage 1's precision path (read as Megatron's
# distributed optimizer: --distributed-optimizer). (layers, hidden, heads, tp, pp, GPUs,
# micro-batch, batch, stage 0 s, stage 1 s)
PREQUEL = (72, 14336, 64, 8, 12, 384, 2, 2048, 137.34, 120.29)
MEGATRON_DEEPSPEED_OUT = ROOT / "benchmarks/results/tp-megatron-deepspeed.json"


def megatron_deepspeed_args(layers: int, hidden: int, heads: int, vocab: int, tp: int, pp: int,
                            gpus: int, micro: int, micro_batches: int, network: str,
                            deepspeed: bool = True) -> list[str]:
    """`dlperf analyze` for a Megatron-DeepSpeed GPT of 2021-22: bf16 with fp32 master weights,
    Megatron's tensor parallelism of then (every collective between dependent kernels, no
    sequence parallelism), its fused softmax and bias+dropout+add, explicit attention, every
    layer recomputed, DeepSpeed's 1F1B pipeline (its activations sent 1/tp a rank, as
    DeepSpeed partitions them over the tensor-parallel ranks), the data-parallel reduction
    after the flush; ``deepspeed``: as DeepSpeed's BF16_Optimizer runs it (--deepspeed-bf16),
    else as Megatron-LM's own optimizer of 2021 (fp32 gradients all-reduced)."""
    return (["analyze", "gpt2", "--layers", str(layers), "--d-model", str(hidden), "--heads",
             str(heads), "--vocab", str(vocab), "--seq-len", "2048", "--batch-size", str(micro),
             "--grad-accum", str(micro_batches), "--dtype", "bf16", "--precision", "fsdp",
             "--train", "--optimizer", "adamw", "--attention", "math", "--dropout", "0.1",
             "--device", "a100-80gb", "--interconnect", f"nvlink3-a100,{network}", "--gpus",
             str(gpus), "--tp", str(tp), "--pp", str(pp), "--tp-impl", "torch", "--fusion",
             "megatron", "--no-overlap", "--activation-checkpointing", "full",
             "--no-sequence-parallel", "--top", "1"]
            + (["--deepspeed-bf16"] if deepspeed else []))


def megatron_deepspeed(out: Path) -> None:
    from tqdm import tqdm

    from dlperf.provenance import save_result

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for run, layers, hidden, heads, vocab, tp, pp, edge, gpus, micro, batch, step in BLOOM:
            replicas = gpus // (tp * pp)
            for deepspeed in (True, False):
                here = _analyze(megatron_deepspeed_args(
                    layers, hidden, heads, vocab, tp, pp, gpus, micro,
                    batch // (replicas * micro), "opa-100-jeanzay", deepspeed)
                    + ["--pp-first-layers", str(edge), "--pp-last-layers", str(edge)], tmp)
                measured = batch * 2048 / step / gpus
                predicted = here["per_gpu_samples_per_s"] * 2048
                rows.append({"run": run, "reading": "deepspeed-bf16" if deepspeed
                             else "megatron-2021", "gpus": gpus, "tp": tp, "pp": pp,
                             "micro_batch": micro, "micro_batches": batch // (replicas * micro),
                             "measured_tokens_per_gpu": measured,
                             "predicted_tokens_per_gpu": predicted,
                             "measured_step_s": step, "predicted_step_s": here["step_s"],
                             "ratio": predicted / measured,
                             "memory_per_gpu_bytes": here["memory_per_gpu"]["total_bytes"],
                             **_deepspeed_parts(here)})
        for (gpus, step, tflops), deepspeed in tqdm(
                [(r, d) for r in MT_NLG for d in (True, False)], desc="mt-nlg"):
            micro_batches = 1920 // (gpus // (8 * 35))
            here = _analyze(megatron_deepspeed_args(105, 20480, 128, 51200, 8, 35, gpus, 1,
                                                    micro_batches, "ib-hdr", deepspeed), tmp)
            flops = megatron_flops(105, 20480, 1920, seq=2048) / gpus
            rows.append({"run": "MT-NLG 530B", "reading": "deepspeed-bf16" if deepspeed
                         else "megatron-2021", "gpus": gpus, "tp": 8, "pp": 35,
                         "micro_batch": 1, "micro_batches": micro_batches,
                         "measured_tflops": tflops, "predicted_tflops": flops / here["step_s"]
                         / 1e12, "measured_step_s": step, "predicted_step_s": here["step_s"],
                         "ratio": step / here["step_s"],
                         "memory_per_gpu_bytes": here["memory_per_gpu"]["total_bytes"],
                         **_deepspeed_parts(here)})
        layers, hidden, heads, tp, pp, gpus, micro, batch, zero0, zero1 = PREQUEL
        args = megatron_deepspeed_args(layers, hidden, heads, 250880, tp, pp, gpus, micro,
                                       batch // (gpus // (tp * pp) * micro), "opa-100-jeanzay",
                                       deepspeed=False)
        steps = [_analyze(args + [flag], tmp)["step_s"]
                 for flag in ("--deepspeed-bf16", "--distributed-optimizer")]
        prequel = {"run": "181B, ZeRO stage 0 over stage 1", "gpus": gpus,
                   "measured_s": [zero0, zero1], "predicted_s": steps,
                   "measured": zero0 / zero1, "predicted": steps[0] / steps[1],
                   "ratio": steps[0] / steps[1] / (zero0 / zero1)}
    scaling = []
    for reading in ("deepspeed-bf16", "megatron-2021"):
        mt = [r for r in rows if r["run"] == "MT-NLG 530B" and r["reading"] == reading]
        for r in mt[1:]:  # each scale's rate per GPU over 280 nodes', as the batch is shared
            measured = mt[0]["measured_step_s"] * mt[0]["gpus"] / (r["measured_step_s"]
                                                                   * r["gpus"])
            predicted = mt[0]["predicted_step_s"] * mt[0]["gpus"] / (r["predicted_step_s"]
                                                                     * r["gpus"])
            scaling.append({"reading": reading, "gpus": r["gpus"], "against_gpus": mt[0]["gpus"],
                            "measured": measured, "predicted": predicted,
                            "ratio": predicted / measured})
    for r in rows:
        print(f"{r['run']:12s} {r['gpus']:5,d} GPUs, {r['reading']:14s}: measured "
              f"{r['measured_step_s']:6.1f} s a step, predicted {r['predicted_step_s']:6.1f} "
              f"({r['ratio']:.2f}x the rate; DeepSpeed's accumulation "
              f"{r['accumulate_s']:.1f} s, bubble {r['bubble_s']:.1f} s)")
    for x in scaling:
        print(f"MT-NLG {x['reading']:14s} {x['gpus']:,d} / {x['against_gpus']:,d} GPUs: "
              f"measured {x['measured']:.3f}, predicted {x['predicted']:.3f} ({x['ratio']:.2f}x)")
    print(f"181B, ZeRO stage 0 over stage 1: measured {prequel['measured']:.3f} "
          f"({zero0} / {zero1} s), predicted {prequel['predicted']:.3f} "
          f"({steps[0]:.1f} / {steps[1]:.1f} s)")
    save_result(out, "validate-tp-megatron-deepspeed",
                {"bloom": [list(r) for r in BLOOM], "mt_nlg": [list(r) for r in MT_NLG],
                 "prequel": list(PREQUEL),
                 "args": megatron_deepspeed_args(0, 0, 0, 0, 0, 0, 0, 0, 0, "NETWORK")},
                {"rows": rows, "scaling": scaling, "prequel": prequel})
    print(f"Wrote {out}")


def _deepspeed_parts(here: dict) -> dict:
    """Where a Megatron-DeepSpeed step's time goes beyond its kernels."""
    comm = here["communication"]
    return {"accumulate_s": (comm.get("deepspeed_bf16") or {}).get("accumulate_s", 0.0),
            "bubble_s": comm["pipeline"]["bubble_s"], "data_parallel_s": comm["exposed_s"],
            "param_gather_s": comm.get("param_gather_exposed_s", 0.0),
            "tensor_parallel_s": comm["tensor_parallel"]["exposed_s"],
            "exposed_comm_s": here["exposed_comm_s"]}


# Megatron-Core's MoE README (megatron/core/transformer/moe/README.md at NVIDIA/Megatron-LM
# 022bcb5a): "With MCore v0.9, we've achieved remarkable performance of 468 TFLOPS for Mixtral
# 8X7B bf16 training", and its "Reference Best Parallel Mapping" of MCore v0.8 for Mixtral
# 8x7B (dropless, all-to-all dispatcher, BF16): 64 GPUs, 4,096 tokens, TP 1, EP 8, PP 4, VP
# 8, micro-batch 1, batch 256; 8 x H100 80GB HBM3 a node, NVLink 4, InfiniBand 8 x 400 Gb/s;
# the PyTorch 24.09 container with TransformerEngine 1.11. The README does not say that the
# 468 was measured at this mapping, nor whether its "VP 8" is eight virtual stages of one
# block each (Megatron's virtual pipeline size) or stages of eight blocks (its example's
# --num-layers-per-virtual-pipeline-stage 8, no interleaving): both are run. The example's
# other arguments: --moe-grouped-gemm --moe-permute-fusion, the distributed optimizer with
# --overlap-grad-reduce --overlap-param-gather, no recompute.
MOE_OUT = ROOT / "benchmarks/results/tp-megatron-moe.json"
MIXTRAL_TFLOPS = 468.0
MIXTRAL_RUN = {"gpus": 64, "seq": 4096, "ep": 8, "pp": 4, "batch": 256, "micro": 1}


def mixtral_flops_per_token(seq: int = 4096) -> float:
    """FLOPs of a Mixtral 8x7B token as Megatron-Core counts them for its TFLOPS
    (megatron/training/training.py ``num_floating_point_operations``, no recompute): 12 L h^2
    x ((1 + kv groups / heads + s / h) (attention) + ffn / h x top-k x 3/2 (SwiGLU experts)
    + V / 2Lh (output layer)), per token."""
    layers, hidden, groups, heads, ffn, topk, vocab = 32, 4096, 8, 32, 14336, 2, 32000
    return 12 * layers * hidden ** 2 * ((1 + groups / heads + seq / hidden)
                                        + ffn / hidden * topk * 1.5
                                        + vocab / (2 * layers * hidden))


def mixtral_args(virtual: int, attention: float) -> list[str]:
    """`dlperf analyze` for the README's Mixtral 8x7B mapping, as the README's example runs
    it (``MIXTRAL_RUN``): bf16 with fp32 master weights, TransformerEngine's fused kernels
    (--tp-impl te at TP 1), the distributed optimizer with gradient buckets of max(40M, 1M x
    replicas) fp32 parameters, and ``virtual`` stages a GPU (with the interleaved schedule's
    transfers overlapped, Megatron-Core's default)."""
    r = MIXTRAL_RUN
    replicas = r["gpus"] // r["pp"]
    bucket_mib = megatron_bucket_mib(replicas)
    return (["analyze", "mixtral-8x7b", "--device", "h100-sxm", "--seq-len", str(r["seq"]),
             "--batch-size", str(r["micro"]),
             "--grad-accum", str(r["batch"] // replicas // r["micro"]), "--dtype", "bf16",
             "--precision", "fsdp", "--train", "--optimizer", "adamw", "--tp-impl", "te",
             "--efficiency", f"attention={attention}", "--interconnect", "nvlink4-h100,ib-ndr",
             "--gpus", str(r["gpus"]), "--ep", str(r["ep"]), "--pp", str(r["pp"]),
             "--pp-virtual", str(virtual), "--distributed-optimizer", "--bucket-cap-mb",
             f"{bucket_mib:.1f}", "--top", "1"]
            + (["--pp-overlap-p2p"] if virtual > 1 else []))


def megatron_moe(out: Path) -> None:
    """The README's Mixtral 8x7B TFLOPS per GPU, predicted over measured, with each reading
    of its "VP 8" and the attention shares of ``megatron_core_2024`` (the one chosen for
    Megatron-Core's 2024 stack, the preset's and cuDNN's own)."""
    from tqdm import tqdm

    from dlperf.provenance import save_result

    flops = mixtral_flops_per_token(MIXTRAL_RUN["seq"])
    layers_per_stage = 32 // MIXTRAL_RUN["pp"]
    runs = [(v, a) for v in (1, layers_per_stage)
            for a in (MCORE_ATTENTION, *MCORE_ATTENTION_BOUNDS)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for virtual, attention in tqdm(runs, desc="Mixtral 8x7B", unit="run"):
            here = _analyze(mixtral_args(virtual, attention), tmp)
            tokens = here["per_gpu_samples_per_s"] * MIXTRAL_RUN["seq"]
            comm = here["communication"]
            rows.append({"virtual": virtual, "attention": attention,
                         "predicted_tokens_per_s_per_gpu": tokens,
                         "predicted_tflops": tokens * flops / 1e12,
                         "ratio": tokens * flops / 1e12 / MIXTRAL_TFLOPS,
                         "step_s": here["step_s"], "limited_by": here["limited_by"],
                         "alltoall_exposed_s": comm["expert_parallel"]["exposed_s"],
                         "bubble_s": comm["pipeline"]["bubble_s"],
                         "exposed_comm_s": here["exposed_comm_s"],
                         "memory_gib": here["memory_per_gpu"]["total_bytes"] / 2**30})
    for r in rows:
        print(f"VP {r['virtual']}, attention {r['attention']}: "
              f"{r['predicted_tflops']:.0f} TFLOP/s predicted, {r['ratio']:.2f}x the "
              f"README's {MIXTRAL_TFLOPS:.0f}")
    save_result(out, "validate-tp-megatron-moe",
                {"source": "NVIDIA/Megatron-LM megatron/core/transformer/moe/README.md at "
                           "022bcb5a: 468 TFLOPS, Mixtral 8x7B, MCore v0.9; mapping of MCore "
                           "v0.8", "run": MIXTRAL_RUN, "measured_tflops": MIXTRAL_TFLOPS,
                 "flops_per_token": flops, "args": mixtral_args(1, MCORE_ATTENTION)},
                {"rows": rows})


# Megatron-Bridge's published gpt-oss-120b pretraining rates (NVIDIA-NeMo/Megatron-Bridge
# docs/performance-summary-archive.md, the only BF16 mixture of experts it runs on H100s and
# B200s; "we force-balance the token distribution among experts and all benchmarks are
# token-dropless"): (label, device, GPUs, pipeline stages, expert-parallel size, micro-batch,
# global batch, container, tokens/s a GPU, model TFLOP/s a GPU). The mappings are the
# release's own configs (scripts/performance/configs/gpt_oss/: v0.3.0 for the 26.02 container,
# whose table they match column for column; v0.2.0 for 25.11, whose table's MBS, GA and EP
# columns contradict its code: the H100 row says MBS 4 GA 2 where the code runs MBS 1 over
# PP 4 (GA 32), the B200 row EP 8 where the code runs EP 64), all with TP 1, no virtual
# stages, --recompute-modules layernorm moe_act, the distributed optimizer, TE's fused
# cross-entropy, 4,096 tokens; DGX H100 and DGX B200: eight GPUs on NVLink, one 400 Gb/s NDR
# NIC each (BRIDGE_INTERCONNECT). Its gradients are reduced in BF16 (grad_reduce_in_fp32
# off in both releases' gpt_oss_llm_pretrain.py: --reduce-dtype bf16), and its router is
# forced to balance the tokens (moe_router_force_load_balancing), as dlperf routes them.
# Two rows keep every all-to-all on NVLink: 26.04.01's B200s at EP 8 (v0.4.2's config, the
# 26.04.01 release: EP 8 in the node, the plain all-to-all dispatcher since the cherry-pick
# of #3614 took HybridEP out; 26.04's row ran HybridEP and is left out), and 26.02's GB200s
# at EP 64 (v0.3.0's config: EP 64, MBS 4, no all-to-all overlap until v0.4.0), taken to be 64
# of one NVL72 rack's 72 GPUs, whose NVLink joins them all (the table does not say; at EP 64
# the B200s' all-to-alls cross InfiniBand and ran at half the GB200s' rate). The H100 row's
# config is unchanged through 26.04.01, and its rate with it (5,810-5,984 tokens/s in the
# 26.02.01, 26.04 and 26.04.01 tables).
GPT_OSS_ROWS = (
    ("26.02: 64 H100s, PP 4 EP 8, GBS 1,280", "h100-sxm", 64, 4, 8, 1, 1280, "26.02", 5993, 163),
    ("26.02: 64 B200s, EP 64, GBS 1,280", "b200", 64, 1, 64, 4, 1280, "26.02", 8047, 219),
    ("25.11: 64 H100s, PP 4 EP 8, GBS 512", "h100-sxm", 64, 4, 8, 1, 512, "25.11", 5630, 153),
    ("25.11: 64 B200s, EP 64, GBS 512", "b200", 64, 1, 64, 4, 512, "25.11", 8213, 223),
    ("26.04.01: 64 B200s, EP 8, GBS 1,280", "b200", 64, 1, 8, 4, 1280, "26.04.01", 13568, 369),
    ("26.02: 64 GB200s, EP 64 in one NVL72, GBS 1,280", "gb200", 64, 1, 64, 4, 1280, "26.02",
     15784, 428),
    # Blackwell Ultra, held out (no parameter was fitted to them): v0.3.0's configs for the
    # GB300 and the B300 are the GB200's and the B200's EP 64 and micro-batch 4 without the
    # recomputation (no recompute_modules) and with TransformerEngine's CUDA graphs of the
    # attention, router and dispatch preprocessing (not modelled: a share of the launches);
    # the DGX B300's NICs are ConnectX-8s, 800 Gb/s a GPU (BRIDGE_INTERCONNECT)
    ("26.02: 64 GB300s, EP 64 in one NVL72, GBS 1,280", "gb300", 64, 1, 64, 4, 1280, "26.02",
     19412, 527, None),
    ("26.02: 64 B300s, EP 64, GBS 1,280", "b300", 64, 1, 64, 4, 1280, "26.02", 8359, 228,
     None),
)
# what each row recomputes (Megatron-Core's --recompute-modules) unless it says otherwise
GPT_OSS_RECOMPUTE = "layernorm,moe_act"
# The B300 row's all-to-alls cross the network, whose NICs the table does not give: the DGX
# B300's ConnectX-8s run 800 Gb/s (its headline run), but a cluster may run them at 400 Gb/s,
# the B200 rows' rate; what the row comes out at on such NICs is saved beside it
GPT_OSS_NIC_ALTERNATIVE = {"b300": "nvlink5-b300,ib-ndr"}
GPT_OSS_OUT = ROOT / "benchmarks/results/tp-megatron-bridge-moe.json"


def bridge_moe_args(model: str, device: str, gpus: int, pp: int, ep: int, micro: int,
                    batch: int, attention: float | None, recompute: str | None = None,
                    interconnect: str | None = None) -> list[str]:
    """`dlperf analyze` for one of Megatron-Bridge's mixture-of-experts rows, as its perf
    recipes run them: BF16 with FP32 master weights and optimizer state, gradients in
    Megatron-Core's BF16 buckets (grad_reduce_in_fp32 off), the distributed optimizer, TE's
    fused kernels and cross-entropy, 4,096 tokens, ``recompute`` the modules recomputed
    (None: none), ``attention`` the fused attention's share (None: the preset's),
    ``interconnect`` the --interconnect (None: the system's, ``BRIDGE_INTERCONNECT``)."""
    replicas = gpus // pp
    return (["analyze", model, "--device", device, "--train", "--dtype", "bf16",
             "--precision", "fsdp", "--optimizer", "adamw", "--tp-impl", "te", "--loss",
             "fused", "--batch-size", str(micro), "--grad-accum",
             str(batch // replicas // micro), "--gpus", str(gpus), "--ep", str(ep),
             "--interconnect", interconnect or BRIDGE_INTERCONNECT[device],
             "--distributed-optimizer",
             "--reduce-dtype", "bf16",
             "--bucket-cap-mb", f"{megatron_bucket_mib(replicas):.1f}", "--top", "1"]
            + (["--activation-checkpointing", "modules", "--recompute-modules", recompute]
               if recompute else [])
            + (["--pp", str(pp)] if pp > 1 else [])
            + (["--efficiency", f"attention={attention}"] if attention is not None else []))


def gpt_oss_args(device: str, gpus: int, pp: int, ep: int, micro: int, batch: int,
                 attention: float | None, recompute: str | None = GPT_OSS_RECOMPUTE,
                 interconnect: str | None = None) -> list[str]:
    """`dlperf analyze` for one of Megatron-Bridge's gpt-oss-120b rows (``GPT_OSS_ROWS``):
    ``bridge_moe_args``, recomputing the norms and the experts' activation unless
    ``recompute`` says otherwise."""
    return bridge_moe_args("gpt-oss-120b", device, gpus, pp, ep, micro, batch, attention,
                           recompute, interconnect)


def _moe_reading(here: dict, rate: float) -> dict:
    """One mixture-of-experts prediction (``_analyze``'s scale) against the measured ``rate``
    (tokens/s a GPU, 4,096-token sequences): the rate and ratio, the step and where its
    all-to-alls, bubble, exposed communication and wait went, and the memory a GPU."""
    tokens = here["per_gpu_samples_per_s"] * 4096
    comm = here["communication"]
    return {"predicted_tokens_per_s_per_gpu": tokens, "ratio": tokens / rate,
            "step_s": here["step_s"], "limited_by": here["limited_by"],
            "alltoall_exposed_s": comm["expert_parallel"]["exposed_s"],
            "alltoall_each_s": comm["expert_parallel"]["alltoall_s"],
            "bubble_s": (comm.get("pipeline") or {}).get("bubble_s", 0.0),
            "exposed_comm_s": here["exposed_comm_s"], "straggler_s": here["straggler_s"],
            "memory_gib": here["memory_per_gpu"]["total_bytes"] / 2**30}


def megatron_bridge_moe(out: Path) -> None:
    """Each gpt-oss-120b row's tokens/s a GPU, predicted over measured: on H100s at the three
    attention shares of ``megatron_bridge_fp8`` (the headline Megatron-Core's), on B200s at
    the preset's; with the all-to-alls, the pipeline's bubble and the step's parts."""
    from tqdm import tqdm

    from dlperf.hardware.interconnect import get_interconnect
    from dlperf.provenance import save_result

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, device, gpus, pp, ep, micro, batch, container, rate, tflops, *own in tqdm(
                GPT_OSS_ROWS, desc="megatron-bridge gpt-oss", unit="row"):
            recompute = own[0] if own else GPT_OSS_RECOMPUTE
            shares = BRIDGE_ATTENTION if device == "h100-sxm" else BRIDGE_ATTENTION_B200
            node = get_interconnect(BRIDGE_INTERCONNECT[device].split(",")[0])
            row = {"row": label, "device": device, "gpus": gpus, "pp": pp, "ep": ep,
                   "micro_batch": micro, "global_batch": batch, "container": container,
                   "measured_tokens_per_s_per_gpu": rate, "measured_model_tflops": tflops,
                   "recompute": recompute,
                   # whether the all-to-alls leave the NVLink domain (EP ranks are adjacent)
                   "alltoall_over": "nvlink" if ep <= node.gpus else "network"}
            for name, share in shares.items():
                row[name] = _moe_reading(_analyze(gpt_oss_args(
                    device, gpus, pp, ep, micro, batch, share, recompute), tmp), rate)
            if device in GPT_OSS_NIC_ALTERNATIVE and row["alltoall_over"] == "network":
                row["at_400g_nics"] = {
                    "interconnect": GPT_OSS_NIC_ALTERNATIVE[device],
                    **_moe_reading(_analyze(gpt_oss_args(
                        device, gpus, pp, ep, micro, batch, None, recompute,
                        GPT_OSS_NIC_ALTERNATIVE[device]), tmp), rate)}
            rows.append(row)
            head = row["mcore"]
            print(f"{label:40s} measured {rate:,} tokens/s a GPU; predicted "
                  f"{head['predicted_tokens_per_s_per_gpu']:,.0f} ({head['ratio']:.2f}x"
                  + (f"; {row['preset']['ratio']:.2f}-{row['cudnn']['ratio']:.2f}x over the "
                     "attention shares" if "cudnn" in row else "") + f"); all-to-alls "
                  f"{head['alltoall_exposed_s']:.2f} s of a {head['step_s']:.2f} s step"
                  + (f"; on 400 Gb/s NICs {row['at_400g_nics']['ratio']:.2f}x"
                     if "at_400g_nics" in row else ""))
    save_result(out, "validate-tp-megatron-bridge-moe",
                {"source": "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md "
                           "(25.11, 26.02 and 26.04.01 NeMo containers), configs from "
                           "scripts/performance/configs/gpt_oss/ at v0.2.0, v0.3.0 and v0.4.2",
                 "rows": [list(r) for r in GPT_OSS_ROWS], "attention": BRIDGE_ATTENTION,
                 "args_h100": gpt_oss_args(*GPT_OSS_ROWS[0][1:7], BRIDGE_ATTENTION["mcore"]),
                 "args_b200": gpt_oss_args(*GPT_OSS_ROWS[1][1:7], None),
                 "args_gb300": gpt_oss_args(*GPT_OSS_ROWS[6][1:7], None, GPT_OSS_ROWS[6][10])},
                {"rows": rows})
    print(f"Wrote {out}")


# Megatron-Bridge's Qwen3-30B-A3B on two DGX H100s in FP8, held out (no parameter was fitted
# to it): docs/performance-summary-archive.md's 26.04, 26.04.01 and 26.06 tables (Qwen3_30B_
# a3B, DGX-H100: 16 GPUs, FP8, GBS 1,024, MBS 1, TP 1 PP 1 EP 16), whose config is the same
# from v0.4.0 to v0.5.1 (scripts/performance/configs/qwen/qwen3_workload_base_configs.py,
# QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1: EP 16, moe_a2a_overlap off, HybridEP's flex
# dispatcher, no CUDA graphs; qwen3_llm_pretrain.py: FP8 with current scaling on every block,
# first_last_layers_bf16 off, no recomputation, grad_reduce_in_fp32 off, the router forced to
# balance; recipes/qwen/qwen3_moe.py: TE's fused cross-entropy, the distributed optimizer).
# The 26.02.01 row (PP 2, 12 virtual stages, EP 8, DeepEP with the all-to-all overlapped,
# 9,058 tokens/s) and the 25.09-26.02 ones run the overlap and are left out; the 235B's H100
# rows run tensor parallelism beside EP, not modelled.
# The Blackwell rows, in MXFP8 on one node of 8 (EP 8, GBS 512, HybridEP, TP 1 PP 1): the
# 26.02.01, 26.04 and 26.04.01 tables, whose configs are the same from v0.3.1 to v0.4.2
# (QWEN3_30B_A3B_PRETRAIN_CONFIG_{GB300,GB200,B300,B200}_FP8_MX_V1: micro-batch 8 on the
# Blackwell Ultra parts, 4 on the others; TE's CUDA graphs of the router and the dispatch's
# preprocessing, and on the B200 of the attention, not modelled; everything else as the H100
# row). 26.06's run a fused grouped MLP (cuteDSL), full-iteration CUDA graphs, the all-to-all
# overlapped and FP8 attention: left out, as is 26.02's B200 row (micro-batch 1).
# (label, preset, device, GPUs, PP, EP, micro-batch, global batch, dispatcher,
#  [(container, tokens/s a GPU, model TFLOP/s a GPU)])
QWEN3_ROWS = (
    ("Qwen3-30B-A3B FP8, 16 H100s, EP 16, GBS 1,024", "qwen3-30b-a3b", "h100-sxm", 16, 1, 16,
     1, 1024, "hybridep", [("26.04", 8901, 205), ("26.04.01", 8960, 206), ("26.06", 8826, 203)]),
    ("Qwen3-30B-A3B MXFP8, 8 GB300s, EP 8, MBS 8", "qwen3-30b-a3b", "gb300", 8, 1, 8, 8, 512,
     "hybridep", [("26.02.01", 30411, 700), ("26.04", 31470, 724), ("26.04.01", 31744, 729)]),
    ("Qwen3-30B-A3B MXFP8, 8 GB200s, EP 8, MBS 4", "qwen3-30b-a3b", "gb200", 8, 1, 8, 4, 512,
     "hybridep", [("26.02.01", 26373, 607), ("26.04", 26032, 599), ("26.04.01", 26112, 599)]),
    ("Qwen3-30B-A3B MXFP8, 8 B300s, EP 8, MBS 8", "qwen3-30b-a3b", "b300", 8, 1, 8, 8, 512,
     "hybridep", [("26.02.01", 29454, 678), ("26.04", 30553, 703), ("26.04.01", 30720, 704)]),
    ("Qwen3-30B-A3B MXFP8, 8 B200s, EP 8, MBS 4", "qwen3-30b-a3b", "b200", 8, 1, 8, 4, 512,
     "hybridep", [("26.02.01", 26695, 614), ("26.04", 26859, 618), ("26.04.01", 27136, 619)]),
)
# each system's FP8 recipe in those tables: FP8 with current scaling on Hopper, MXFP8 on
# Blackwell
QWEN3_RECIPE = {"h100-sxm": "current"}
QWEN3_OUT = ROOT / "benchmarks/results/tp-megatron-bridge-qwen3.json"


def qwen3_args(row: tuple, attention: float | None, fp8: bool = True,
               dispatcher: str | None = None, recipe: str | None = None) -> list[str]:
    """`dlperf analyze` for one of ``QWEN3_ROWS``: ``bridge_moe_args`` in the system's FP8
    recipe (``QWEN3_RECIPE``, or ``recipe``; TE's, on the experts' grouped GEMMs too) unless
    ``fp8`` is off, and the row's dispatcher unless ``dispatcher`` names another."""
    _, model, device, gpus, pp, ep, micro, batch, own, _ = row
    recipe = recipe or QWEN3_RECIPE.get(device, "mxfp8")
    return (bridge_moe_args(model, device, gpus, pp, ep, micro, batch, attention)
            + ["--ep-dispatcher", dispatcher or own] + (["--fp8", recipe] if fp8 else []))


def megatron_bridge_qwen3(out: Path) -> None:
    """Each Qwen3 row's tokens/s a GPU, predicted over measured (each container's rate and
    their median): in FP8 at the three attention shares of ``megatron_bridge_fp8`` (the
    headline Megatron-Core's), and at the headline share with the plain all-to-all dispatcher
    (what the node's deduplication is worth) and in BF16 (the gain FP8 is predicted to
    give)."""
    import statistics

    from tqdm import tqdm

    from dlperf.provenance import save_result

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for row in tqdm(QWEN3_ROWS, desc="megatron-bridge qwen3", unit="row"):
            label, model, device, gpus, pp, ep, micro, batch, dispatcher, published = row
            rate = statistics.median(r[1] for r in published)
            result = {"row": label, "model": model, "device": device, "gpus": gpus, "pp": pp,
                      "ep": ep, "micro_batch": micro, "global_batch": batch,
                      "dispatcher": dispatcher,
                      "published": [{"container": c, "tokens_per_s_per_gpu": t,
                                     "model_tflops": f} for c, t, f in published],
                      "measured_tokens_per_s_per_gpu": rate}
            shares = BRIDGE_ATTENTION if device == "h100-sxm" else BRIDGE_ATTENTION_B200
            headline = shares["mcore"]
            runs = {name: qwen3_args(row, share) for name, share in shares.items()}
            runs["alltoall"] = qwen3_args(row, headline, dispatcher="alltoall")
            runs["bf16"] = qwen3_args(row, headline, fp8=False)
            if device != "h100-sxm":  # MXFP8 against per-tensor FP8 on the same GPUs
                runs["fp8_current"] = qwen3_args(row, headline, recipe="current")
            for name, args in runs.items():
                reading = _moe_reading(_analyze(args, tmp), rate)
                tokens = reading["predicted_tokens_per_s_per_gpu"]
                result[name] = {**reading, "ratios_by_container": {c: tokens / t
                                                                   for c, t, _ in published}}
            result["predicted_fp8_gain"] = (result["mcore"]["predicted_tokens_per_s_per_gpu"]
                                            / result["bf16"]["predicted_tokens_per_s_per_gpu"])
            rows.append(result)
            head = result["mcore"]
            print(f"{label}: measured {rate:,} tokens/s a GPU (median of {len(published)}); "
                  f"predicted {head['predicted_tokens_per_s_per_gpu']:,.0f} "
                  f"({head['ratio']:.2f}x"
                  + (f"; {result['preset']['ratio']:.2f}-{result['cudnn']['ratio']:.2f}x over "
                     "the attention shares" if "cudnn" in result else "") + f"); all-to-alls "
                  f"{head['alltoall_exposed_s']:.2f} s of a {head['step_s']:.2f} s step; with "
                  f"the plain all-to-all {result['alltoall']['ratio']:.2f}x; FP8 predicted "
                  f"{result['predicted_fp8_gain']:.2f}x BF16")
    save_result(out, "validate-tp-megatron-bridge-qwen3",
                {"source": "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md "
                           "(26.02.01, 26.04, 26.04.01 and 26.06 NeMo containers), configs "
                           "from scripts/performance/configs/qwen/ at v0.3.1-v0.5.1",
                 "rows": [list(r) for r in QWEN3_ROWS], "attention": BRIDGE_ATTENTION,
                 "args": [qwen3_args(r, BRIDGE_ATTENTION["mcore"] if r[2] == "h100-sxm" else None)
                          for r in QWEN3_ROWS]},
                {"rows": rows})
    print(f"Wrote {out}")


SOURCES = {"kempnerforge": (kempnerforge, OUT), "megatron": (megatron, MEGATRON_OUT),
           "megatron-2022": (megatron2022, MEGATRON22_OUT),
           "narayanan-2021": (narayanan2021, NARAYANAN_OUT),
           "megatron-core-2024": (megatron_core_2024, MCORE24_OUT),
           "llama3-405b": (llama3_405b, LLAMA3_OUT),
           "megatron-bridge-fp8": (megatron_bridge_fp8, BRIDGE_OUT),
           "megatron-bridge-mxfp8": (megatron_bridge_mxfp8, BRIDGE_MXFP8_OUT),
           "torchtitan-async-tp": (torchtitan_async_tp, ASYNC_TP_OUT),
           "megatron-deepspeed": (megatron_deepspeed, MEGATRON_DEEPSPEED_OUT),
           "megatron-moe": (megatron_moe, MOE_OUT),
           "megatron-bridge-moe": (megatron_bridge_moe, GPT_OSS_OUT),
           "megatron-bridge-qwen3": (megatron_bridge_qwen3, QWEN3_OUT)}


def main(argv: list[str]) -> int:
    if argv and argv[0] not in SOURCES:
        raise SystemExit(f"validate_tp.py: unknown source {argv[0]!r}: name one of "
                         f"{', '.join(SOURCES)}, or none for all")
    names = argv[:1] or list(SOURCES)
    for name in names:
        run, default = SOURCES[name]
        run(Path(argv[1]) if len(argv) > 1 else default)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
