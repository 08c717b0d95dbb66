"""`dlperf analyze MODEL`: per-layer roofline, forward and backward, on one or more devices;
with --measure, measured beside predicted."""

from __future__ import annotations

from dlperf.analysis.gemm import ELEMENT_BYTES, state_element_bytes
from dlperf.cli.common import (batch_size_arg, new_console, nonnegative_int, output_file,
                               positive_float, positive_int)
from dlperf.errors import DlperfError
from dlperf.hardware.efficiency import ATTENTION_KERNELS, parse_overrides
from dlperf.hardware.track_record import HOST_DECODE
from dlperf.models.loss_forms import LOSSES


def add_parser(sub) -> None:
    """`dlperf analyze`: the per-layer roofline (performance guide) of a model."""
    a = sub.add_parser(
        "analyze", help="per-layer roofline of a model on a GPU (no GPU needed)",
        description="Apply NVIDIA's performance guide to every kernel of a model, forward and "
                    "(with --train) backward: FLOPs (2 per multiply-add), bytes moved, arithmetic "
                    "intensity, compute- or memory-bound, Tensor Core alignment, tile and wave "
                    "quantization, predicted time. Runs on meta tensors: no GPU, no memory.")
    a.add_argument("model", help="torchvision name (resnet50, vit_b_16, ...), gpt, or "
                                 "path/to/file.py:factory returning an nn.Module")
    a.add_argument("--device", default="h100-sxm",
                   help="GPU preset (see `dlperf devices`), a spec file from `dlperf probe` "
                        "(.json/.toml), or cpu for a fresh probe of this machine; several, "
                        "comma-separated, to compare them (the first gets the full table) "
                        "[h100-sxm]")
    a.add_argument("--efficiency", action="append", default=[], metavar="NAME=VALUE",
                   help="set one parameter of the efficiency model on top of --device's (a "
                        "fraction of the peak, e.g. tensor_gemm=0.779 or attention=0.35 for a "
                        "stack whose kernels you have measured; see `dlperf/hardware/"
                        "efficiency.py`); repeat for several")
    a.add_argument("--loss", choices=LOSSES, default=None,
                   help="how the training loop computes the cross-entropy over the logits "
                        "(dlperf/models/losses.py): fp32 = on the logits upcast to FP32 "
                        "(torchtitan eager, Hugging Face, Megatron-LM, autocast); half = in "
                        "the logits' dtype; fused = one kernel each way (flash-attn's fused "
                        "cross-entropy, or a torch.compile'd loss, as torchtitan compiles it "
                        "since 2025-04). "
                        "For a large vocabulary it sets the step's memory peak [fp32; the "
                        "mpt-* presets: fused, as MosaicML's published runs]")
    a.add_argument("--train-metrics", type=int, default=None, metavar="N",
                   help="cross-entropy metrics the trainer evaluates on each micro-batch's "
                        "logits after its backward, outside autograd, each on an FP32 copy "
                        "(Composer's LanguageCrossEntropy and LanguagePerplexity: 2). For a "
                        "small model with a large vocabulary they cost as much as its loss "
                        "several times over [0; the mpt-* presets: 2, as MosaicML's "
                        "published runs]")
    a.add_argument("--attention-kernel", choices=ATTENTION_KERNELS, default=None,
                   help="the fused attention kernel the stack runs, for its share of the Tensor "
                        "Core peak: flash2 = PyTorch's scaled_dot_product_attention since 2.2 "
                        "(FlashAttention-2: 0.553 on an A100, 0.262 on Hopper); triton-2023 = "
                        "llm-foundry's Triton flash kernel of MosaicML's 2023 runs (0.325, "
                        "0.187); cudnn = cuDNN's fused attention (Hopper: 0.475, timed on an "
                        "H200, where torch 2.11's SDPA picks it). GPUs without a calibrated "
                        "share take 0.325; "
                        "--efficiency attention=X sets it outright [what the PyTorch installed "
                        "here picks on the --device: cudnn on H100, H200, GH200 and B200 from "
                        "torch 2.11 (cuDNN 9.15.1 and later), else flash2; the mpt-* presets: "
                        "triton-2023, as MosaicML's published runs]")
    a.add_argument("--batch-size", type=batch_size_arg, default=None,
                   help="samples per step [256 for image models, 8 for gpt]")
    a.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16",
                   help="bf16/fp16: mixed precision as torch.autocast runs it; fp32: no autocast")
    a.add_argument("--tf32", action="store_true",
                   help="with --dtype fp32: GEMMs and convolutions on TF32 Tensor Cores (Ampere "
                        "and later). Without it the step is strict FP32 on the CUDA cores; note "
                        "that PyTorch runs cuDNN convolutions in TF32 by default "
                        "(torch.backends.cudnn.allow_tf32 is True, matmuls' flag is not)")
    a.add_argument("--precision", choices=("mixed", "half", "fsdp"), default="mixed",
                   help="with --dtype fp16/bf16: mixed = torch.autocast (fp32 weights, per-op "
                        "casts, softmax/norms in fp32); half = the model cast to the dtype "
                        "(model.half(): no casts, everything and the optimizer state in half); "
                        "fsdp = FSDP's mixed precision (torchtitan's FSDP2, Composer's "
                        "DEFAULT): the model run in the dtype without autocast, fp32 master "
                        "weights, optimizer state and gradient reduction [mixed]")
    a.add_argument("--activation-checkpointing", nargs="?", const="full", default=None,
                   choices=("full", "selective-op", "selective-attention", "modules"),
                   metavar="{full,selective-op,selective-attention,modules}",
                   help="with --train: recompute each block's forward in the backward "
                        "(torch.utils.checkpoint per block, the indexed children of a module "
                        "list such as blocks.0): more math, activations kept only at block "
                        "boundaries. selective-op: torchtitan's op-level policy (attention and "
                        "every other matmul kept, the rest recomputed); selective-attention: "
                        "Megatron-LM's selective recompute (only the attention core, Q Kᵀ "
                        "to times V, recomputed; everything else kept); modules: Megatron-Core's "
                        "--recompute-modules, those of --recompute-modules recomputed [full]")
    a.add_argument("--recompute-modules", default=None, metavar="LIST",
                   help="with --activation-checkpointing modules: the modules of each block "
                        "run again in the backward instead of kept, comma-separated: "
                        "layernorm (its norms), moe_act (its experts' activation), core_attn "
                        "(its attention core) (Megatron-Core's --recompute-modules) "
                        "[core_attn]")
    a.add_argument("--checkpoint-every", type=positive_int, default=None, metavar="N",
                   help="with --activation-checkpointing full: checkpoint only every N-th "
                        "block (the N-th, 2N-th, ... in model order; the others keep their "
                        "activations): fms-fsdp's --selective_checkpointing N, torchtitan's "
                        "selective layer mode (selective_ac_option N) [1: every block]")
    a.add_argument("--fusion", choices=("none", "bn-act", "conv-bn", "megatron", "compile",
                                        "compile-blocks"),
                   default="none",
                   help="the fused kernels the step runs: none = eager PyTorch (batch norm, "
                        "ReLU and the residual add a kernel each); bn-act = batch norm + ReLU "
                        "and batch norm + add + ReLU one kernel each (cuDNN's BN activation "
                        "ops, MXNet's fused BN); conv-bn = also the batch-norm statistics and "
                        "apply inside the convolutions (cuDNN's fused conv-BN ops, NVIDIA's "
                        "MLPerf ResNet-50); megatron = a decoder's attention scale, causal "
                        "mask and softmax one kernel, and each split region's dropout one "
                        "kernel with its residual add (Megatron-LM's fused kernels); compile = "
                        "torch.compile(model): the memory-bound kernels between two library "
                        "kernels (GEMM, convolution, attention) fused as Inductor generates "
                        "them, pointwise work recomputed in the backward rather than saved; "
                        "compile-blocks = the same inside each block only, the rest eager "
                        "(torchtitan's per-block compile) [none]")
    a.add_argument("--cuda-graphs", action="store_true",
                   help="the step replayed as a CUDA graph: no CPU issue time per kernel")
    a.add_argument("--train", action="store_true",
                   help="also the loss and backward pass (dgrad and wgrad)")
    a.add_argument("--channels-last", action="store_true",
                   help="model and input in NHWC (channels_last) memory format")
    a.add_argument("--optimizer", choices=("auto", "sgd", "adamw", "none"), default="auto",
                   help="parameter update counted in a --train step [auto: adamw for gpt and "
                        "token models, sgd otherwise]")
    # costs.OPTIMIZER_IMPLS (spelt out here: the parser is built without importing torch)
    a.add_argument("--optimizer-impl", choices=("fused", "foreach", "for-loop", "bertadam",
                                                "bertadam-sync"), default="fused",
                   help="how torch.optim runs the update: fused (fused=True, as dlperf train "
                        "runs it), foreach (torch's default on CUDA since 2.0) or for-loop "
                        "(foreach=False, and torch 1.x); with --dtype fp16 an unfused step "
                        "waits for GradScaler's inf check, so its launches are not hidden. "
                        "bertadam: NVIDIA DeepLearningExamples' FP32 BERT fine-tuning update "
                        "(run_squad.py: a global norm read with .item(), then BertAdam, "
                        "clip_grad_norm_ and Adam op by op for each tensor); bertadam-sync: "
                        "the same under torch 1.5-1.9, whose clip_grad_norm_ waits for the GPU "
                        "once per tensor [fused]")
    a.add_argument("--input-shape", help="per-sample shape without batch: C,H,W (3,224,224) or "
                                         "FEATURES for non-image models")
    a.add_argument("--input-dtype", choices=("float32", "int64"), default=None,
                   help="input element type: int64 for token ids (embedding models) "
                        "[float32; int64 for gpt]")
    a.add_argument("--num-classes", type=positive_int, help="classifier outputs (torchvision)")
    a.add_argument("--measure", action="store_true",
                   help="also run the step for real on this machine (--device cpu, or a GPU "
                        "preset when that GPU is present) and show measured beside predicted "
                        "time per kernel")
    a.add_argument("--measure-steps", type=positive_int, default=3,
                   help="timed steps for --measure, after one warm-up step [3]")
    a.add_argument("--json", metavar="PATH", help="write the full result as JSON")
    a.add_argument("--html", metavar="PATH",
                   help="write a self-contained HTML report with the roofline plot")
    a.add_argument("--top", type=positive_int, default=25, help="rows in the table [25]")
    a.add_argument("--macs", action="store_true", help="show multiply-accumulates, not FLOPs")
    s = a.add_argument_group("scale-out (--train): the same per-GPU batch on many GPUs")
    s.add_argument("--gpus", type=positive_int, default=None,
                   help="GPUs in the job: predict per-GPU and total throughput, exposed "
                        "communication, input-bound or not, and the limit, from 1 to 4,096 GPUs")
    s.add_argument("--gpus-per-node", type=positive_int, default=None,
                   help="GPUs per node, the ones its interconnect joins [the node "
                        "interconnect's: 8 in a DGX/HGX server, 72 on nvlink5-nvl72]")
    s.add_argument("--nodes", type=positive_int, default=None, metavar="M",
                   help="nodes in the job, the --gpus spread evenly over them (the same as "
                        "--gpus-per-node GPUS/M) [GPUS over --gpus-per-node, at least one]")
    s.add_argument("--interconnect", default="auto", metavar="NODE[,NETWORK]",
                   help="inside a node and between nodes (per GPU): presets from `dlperf "
                        "devices --interconnects`, or .json files [auto: the DGX/HGX system of "
                        "the --device preset; PCIe cards: PCIe through the host, 100 GbE "
                        "between nodes assumed]")
    s.add_argument("--strategy", choices=("ddp", "fsdp", "fsdp-grad-op", "hsdp"), default="ddp",
                   help="data parallel: DDP (bucketed all-reduce overlapping the backward), "
                        "FSDP (full sharding), fsdp-grad-op (FSDP's SHARD_GRAD_OP, ZeRO-2: "
                        "parameters gathered once per step) or hsdp (HYBRID_SHARD: full "
                        "sharding inside each node, one replica per node, the shards "
                        "all-reduced between nodes) [ddp]")
    s.add_argument("--tp", type=positive_int, default=1, metavar="N",
                   help="tensor parallel inside each node (gpt and its presets): N GPUs split "
                        "every block's heads, MLP and the vocabulary as Megatron does, and the "
                        "tokens between them (sequence parallel, as torchtitan runs it; "
                        "--no-sequence-parallel for Megatron's original all-reduces); the "
                        "analysis is one rank's shard, and --strategy runs over --gpus / N "
                        "replicas [1]")
    s.add_argument("--no-sequence-parallel", action="store_true",
                   help="with --tp: Megatron's original tensor parallelism (Megatron-LM without "
                        "--sequence-parallel): every rank keeps all the tokens between the "
                        "split regions, so it runs their norms, dropouts and residual adds "
                        "whole, and the ranks all-reduce instead of all-gathering and "
                        "reduce-scattering")
    s.add_argument("--tp-impl", choices=("torch", "torch-async", "megatron", "te"),
                   default=None,
                   help="with --tp: whose tensor parallelism. torch: PyTorch's DTensor (as "
                        "torchtitan runs it): every collective between dependent kernels, "
                        "autograd keeping each split layer's gathered input. torch-async: "
                        "the same with PyTorch's async tensor parallelism (torchtitan's "
                        "--parallelism.enable_async_tensor_parallel; needs --fusion compile "
                        "or compile-blocks): in the compiled blocks each all-gather fused "
                        "with the matmuls that multiply it from the left and each "
                        "reduce-scatter with the matmul that produces it, chunk by chunk "
                        "beside them; the backward's "
                        "reduce-scatters of the summed input gradients, the embedding's and "
                        "the output layer's stay exposed. megatron: "
                        "Megatron-LM's column-parallel linear (2021-09 on): the backward's "
                        "collectives run beside the layer's gradient GEMMs, and under "
                        "sequence parallelism the layer keeps its input's shard and gathers "
                        "it again; the model in its dtype, as Megatron runs it (--precision "
                        "fsdp or half). te: Megatron-Core on TransformerEngine's layers with "
                        "--tp-comm-overlap (sequence parallel): as megatron, and the forward's "
                        "collectives and the output projections' backward ones chunked beside "
                        "their GEMMs too; with --tp 1, TransformerEngine's layers and "
                        "Megatron-Core's fused kernels without tensor parallelism [torch]")
    s.add_argument("--fp8", choices=("delayed", "current", "mxfp8", "tensorwise", "rowwise"),
                   default=None,
                   help="the blocks' linear layers in FP8 on Hopper and later. delayed, "
                        "current: as TransformerEngine runs them (needs --tp-impl te): E4M3 "
                        "forward, E5M2 gradients, "
                        "per-tensor scales from the amax history (delayed) or from each "
                        "tensor's own amax, one more pass over it (current, Megatron-Bridge's "
                        "FP8-CS); each input, weight and gradient cast to FP8 and its "
                        "transpose, the weights once a step (the step's --grad-accum "
                        "micro-batches reuse them), the tensor-parallel all-gathers in FP8. "
                        "mxfp8: TransformerEngine's MXFP8 block scaling on Blackwell "
                        "(Megatron-Bridge's FP8-MX): E4M3 throughout, a power-of-two "
                        "scale for each 32 elements; each input, weight and gradient cast "
                        "once into a row-wise and a column-wise copy, the block-scaled GEMMs, "
                        "under --tp the all-gathers in MXFP8 with their scales. "
                        "tensorwise: as torchao's float8 training runs them (torchtitan's "
                        "float8 converter; no --tp): dynamic per-tensor scales, each cast an "
                        "amax pass and a cast pass, the FP8 copies the GEMMs' layouts need. "
                        "rowwise: torchao's rowwise recipe: a scale per row of each operand, "
                        "every operand cast again for each GEMM it enters (six casts a "
                        "layer), the backward GEMMs' outputs rescaled after them; with "
                        "--tp the all-gathers in --dtype and the casts after them. torchao's "
                        "casts are fused only under --fusion compile or compile-blocks, "
                        "as torchao asks. The output layer and attention stay in --dtype "
                        "[off]")
    s.add_argument("--fp8-all-gather", action="store_true",
                   help="with --fp8 tensorwise and --strategy fsdp or hsdp: FSDP gathers the "
                        "float8 layers' weights in FP8, each GPU casting its shard before "
                        "the gather (torchtitan's enable_fsdp_float8_all_gather with "
                        "precompute_float8_dynamic_scale_for_fsdp): half the gathered bytes "
                        "of those weights, no weight cast in the model [off]")
    s.add_argument("--fp8-recast-weights", action="store_true",
                   help="with --fp8 delayed or current and --grad-accum: every micro-batch "
                        "casts the weights to FP8 again, as TransformerEngine does when its "
                        "layers are called without is_first_microbatch (Composer and "
                        "llm-foundry's fc_type te, Hugging Face Accelerate) [off: the "
                        "step's first micro-batch casts them and the rest reuse the copies, "
                        "as Megatron-Core does]")
    s.add_argument("--pp", type=positive_int, default=1, metavar="N",
                   help="pipeline parallel (gpt and its presets, --strategy ddp): the blocks "
                        "split into N stages of consecutive blocks on N GPUs (of --tp each), "
                        "--grad-accum micro-batches flowing through them in Megatron-LM's 1F1B "
                        "schedule; the scale-out times the slowest stage, the schedule's "
                        "bubble and the stages' point-to-point sends [1]")
    s.add_argument("--pp-virtual", type=positive_int, default=1, metavar="V",
                   help="with --pp: virtual stages per GPU (Megatron-LM's interleaved "
                        "schedule: V chunks of blocks a GPU, the bubble V times smaller) [1]")
    s.add_argument("--pp-first-layers", type=nonnegative_int, default=None, metavar="N",
                   help="with --pp: the first stage's blocks, fewer than the others' because "
                        "it also runs the embedding (Megatron-Core's "
                        "--decoder-first-pipeline-num-layers; Llama 3's 405B: 7 of 126 on 16 "
                        "stages); the stages between share the rest equally [an equal share]")
    s.add_argument("--pp-last-layers", type=nonnegative_int, default=None, metavar="N",
                   help="with --pp: the last stage's blocks, fewer because it also runs the "
                        "output layer and the loss (--decoder-last-pipeline-num-layers) "
                        "[an equal share]")
    s.add_argument("--pp-layout", default=None, metavar="LAYOUT",
                   help="with --pp: Megatron-Core's --pipeline-model-parallel-layout, each "
                        "chunk's blocks (t), the embedding (E, first) and the output layer "
                        "and loss (L, last), chunks split by |, (...)*n and x*n repeating; "
                        "chunk i runs on stage i mod --pp, --pp-virtual chunks a stage (e.g. "
                        "Megatron-Bridge's Llama 3 70B on 8 x 5: "
                        "'Et*2|(t*2|)*34,t*3|(t*2|)*3,tL') [equal stages]")
    s.add_argument("--pp-overlap-p2p", action="store_true",
                   help="with --pp-virtual > 1: the stages' sends and receives beside the "
                        "chunks' compute (Megatron-Core's --overlap-p2p-communication, its "
                        "default for the interleaved schedule since 2023); only the fill's "
                        "and drain's stay exposed")
    s.add_argument("--cp", type=positive_int, default=1, metavar="N",
                   help="context parallel (gpt and its presets): each sequence split over N "
                        "GPUs, two of its 2N chunks a GPU (Megatron-Core's "
                        "--context-parallel-size, Llama 3's), next to the --tp ranks; every "
                        "layer but the attention runs on 1/N of the tokens, the attention "
                        "takes the other ranks' K and V (--cp-comm), and the gradients are "
                        "reduced over the data- and context-parallel ranks together [1]")
    s.add_argument("--cp-comm", choices=("p2p", "allgather"), default=None,
                   help="with --cp: how K and V reach the other ranks. p2p: "
                        "TransformerEngine's ring, each step's transfer beside the step's "
                        "attention kernel (Megatron-Core's default); allgather: gathered "
                        "before the attention and their gradients reduce-scattered after it, "
                        "both exposed (Llama 3's) [p2p]")
    s.add_argument("--grad-accum", type=positive_int, default=1,
                   help="micro-batches (of --batch-size) per optimizer step: DDP all-reduces "
                        "once per step, FSDP communicates on every micro-batch [1]")
    s.add_argument("--no-overlap", action="store_true",
                   help="DDP: all-reduce the gradients after the backward instead of beside it, "
                        "in Horovod's 64 MiB fusion buffers (one for ResNet-50)")
    s.add_argument("--bucket-cap-mb", type=positive_float, default=None, metavar="MIB",
                   help="DDP's bucket_cap_mb: gradients all-reduced per bucket of this many MiB "
                        "(given, the first bucket is that size too, as in torch); with "
                        "--no-overlap, Horovod's fusion threshold [DDP: 25, first 1; "
                        "--no-overlap: 64]")
    s.add_argument("--grad-as-bucket-view", action="store_true",
                   help="DDP's gradient_as_bucket_view=True: gradients live in the buckets, so "
                        "they are neither copied in and out nor held twice")
    s.add_argument("--no-broadcast-buffers", action="store_true",
                   help="DDP's forward_sync_buffers=False (broadcast_buffers=False before torch "
                        "2.13): no broadcast of the module's buffers "
                        "(batch norm's running statistics) from rank 0 before every forward, "
                        "which DDP does by default and whose latency grows with the GPUs")
    s.add_argument("--reduce-dtype", choices=("fp32", "bf16", "fp16"), default=None,
                   help="--strategy fsdp/hsdp/fsdp-grad-op: the dtype FSDP reduces gradients "
                        "in (MixedPrecision's reduce_dtype): bf16 halves the reduce-scatter "
                        "(and HSDP's all-reduce) of fp32 gradients, as FSDP1's bf16 policies "
                        "run it (fms-fsdp, llama-recipes); with --distributed-optimizer, "
                        "Megatron-Core's gradient buffer in it (grad_reduce_in_fp32 off, as "
                        "Megatron-Bridge's performance configs run) [the gradients' own: fp32, "
                        "or the dtype under --precision half]")
    s.add_argument("--distributed-optimizer", action="store_true",
                   help="DDP as Megatron-LM's distributed optimizer runs it "
                        "(--use-distributed-optimizer): gradients reduce-scattered per bucket "
                        "beside the backward, each replica updating and keeping the "
                        "optimizer state (and, with --precision fsdp, the fp32 master "
                        "weights) of 1/N of the parameters, which are all-gathered beside "
                        "the next forward (--overlap-param-gather)")
    s.add_argument("--deepspeed-bf16", action="store_true",
                   help="DDP as DeepSpeed's BF16_Optimizer runs it (a bf16 config at ZeRO "
                        "stage 0, as Megatron-DeepSpeed trained BLOOM): after each "
                        "micro-batch's backward every bf16 gradient cast to fp32 and added "
                        "into an fp32 buffer of the whole model, the buffer all-reduced after "
                        "the backward, each replica updating 1/N of the fp32 master weights "
                        "and Adam state, the bf16 parameters all-gathered after the update; "
                        "needs --dtype bf16 --precision fsdp")
    s.add_argument("--bn-group", type=positive_int, default=1,
                   help="GPUs of a node that share each batch norm's statistics (synchronised "
                        "batch norm in groups) [1]")
    s.add_argument("--nccl-algo", default=None, metavar="LIST",
                   help="NCCL_ALGO as the job sets it: ring, tree, pat, comma-separated, or ^ "
                        "before the ones left out (^tree); the collectives are timed among "
                        "those [NCCL's own choice]")
    s.add_argument("--nccl-proto", default=None, metavar="LIST",
                   help="NCCL_PROTO as the job sets it: LL, LL128, Simple, or ^ before the ones "
                        "left out [NCCL's own choice]")
    s.add_argument("--kvstore", choices=("device",), default=None,
                   help="reduce the gradients as MXNet's device kvstore does (--kv-store "
                        "device: one process drives the node's GPUs, each gradient summed by "
                        "copies between them, one engine operation at a time), not by NCCL; "
                        "one node [NCCL]")
    s.add_argument("--collective-sms", type=int, default=None, metavar="N",
                   help="the SMs a data-parallel collective's kernels hold while it runs "
                        "beside the compute, which then runs on the rest (one per NCCL channel: "
                        "32 on an NVSwitch node) [0: the compute beside it at full speed; the "
                        "published runs disagree, benchmarks/README.md]")
    s.add_argument("--step-cv", type=float, default=None, metavar="FRACTION",
                   help="the spread of one GPU's step time (coefficient of variation): every "
                        "synchronous step waits for the slowest GPU [0.01, fitted to the "
                        "published multi-GPU runs]")
    s.add_argument("--decode", choices=("gpu", "cpu", "synthetic"), default="gpu",
                   help="where JPEGs are decoded: on the GPU (DALI/nvJPEG), on host cores "
                        "(needs --data-cores and --decode-rate), or synthetic data [gpu]")
    s.add_argument("--data-cores", type=positive_float, default=None,
                   help="host cores decoding for each GPU (with --decode cpu): the node's "
                        "cores / --gpus-per-node")
    s.add_argument("--loader-workers", type=positive_int, default=None,
                   help="the data loader's worker processes per GPU (with --decode cpu): a GPU "
                        "then decodes on min(workers, the node's cores / the GPUs sharing "
                        "them), so one GPU alone on a host decodes faster than eight sharing it")
    s.add_argument("--loader", choices=tuple(HOST_DECODE), default=None,
                   help="the pipeline decoding on the host (with --decode cpu): torch's "
                        "DataLoader (worker processes) or DALI's CPU pipeline (threads); the "
                        "prediction is read through the published runs of that pipeline, "
                        "which lost different amounts from one GPU to eight [torch]")
    s.add_argument("--decode-rate", type=positive_float, default=None,
                   help="images/s one host core decodes and augments (with --decode cpu; "
                        "`dlperf bench data` measures it on a machine)")
    g = a.add_argument_group("gpt and its presets (gpt2 .. gpt2-xl, mpt-125m .. mpt-70b, "
                             "llama2-7b .. llama3-405b, mixtral-8x7b, mixtral-8x22b, "
                             "gpt-oss-20b, gpt-oss-120b, qwen3-30b-a3b, qwen3-235b-a22b): "
                             "each flag overrides the preset's value")
    g.add_argument("--layers", type=positive_int, default=None, help="decoder blocks [gpt: 12]")
    g.add_argument("--d-model", type=positive_int, default=None,
                   help="hidden size, a multiple of --heads [gpt: 768]")
    g.add_argument("--heads", type=positive_int, default=None, help="attention heads [gpt: 12]")
    g.add_argument("--head-dim", type=positive_int, default=None, metavar="D",
                   help="each head's size where it is not --d-model / --heads (Megatron's "
                        "--kv-channels; Qwen3, gpt-oss) [d-model / heads]")
    g.add_argument("--sliding-window", type=nonnegative_int, default=None, metavar="W",
                   help="each query attends to itself and the W - 1 tokens before it, one "
                        "fused kernel charged the key tiles the window reaches (Megatron's "
                        "--window-size W-1,0) [gpt-oss-*: 128; others: 0, none]")
    g.add_argument("--full-attention-every", type=nonnegative_int, default=None, metavar="N",
                   help="with --sliding-window: every N-th block (the N-th, 2N-th, ...) "
                        "attends to all tokens (Megatron's --window-attn-skip-freq) [gpt-oss-*: "
                        "2; 0: none]")
    g.add_argument("--attention-sinks", action="store_true",
                   help="a learned logit per head in every softmax's denominator (gpt-oss's; "
                        "Megatron's softmax_type learnable): one fused kernel [gpt-oss-*]")
    g.add_argument("--qk-norm", action="store_true",
                   help="each head's q and k normalised over its head size before the rotary "
                        "embedding (Megatron's --qk-layernorm): two norms a block [qwen3-*]")
    g.add_argument("--vocab", type=positive_int, default=None,
                   help="vocabulary size (the LM head's width) [gpt: 50257]")
    g.add_argument("--seq-len", type=positive_int, default=None,
                   help="tokens per sequence (the input shape) [gpt: 1024; mpt-*: 2048]")
    g.add_argument("--attention", choices=("sdpa", "math"), default=None,
                   help="sdpa = one fused attention kernel (F.scaled_dot_product_attention); "
                        "math = Q Kᵀ, causal mask, softmax, dropout and times V as separate "
                        "kernels over the [batch, heads, T, T] scores (Megatron-LM 2019-21, "
                        "NVIDIA's BERT, nanoGPT without flash) [sdpa]")
    g.add_argument("--rope", choices=("complex", "matrix", "half"), default=None,
                   help="whose rotary-embedding kernels a Llama preset runs: complex = "
                        "torchtitan's and Meta's complex64 multiply (20 B per element of q "
                        "and k); matrix = IBM fms's 2x2 rotation matrices broadcast and summed "
                        "in FP32 (36 B); half = Hugging Face transformers' rotate_half in the "
                        "model's dtype [complex]")
    g.add_argument("--untie-embeddings", action="store_true",
                   help="the output layer its own weights, not the token embedding's "
                        "(Megatron-LM's --untie-embeddings-and-output-weights; Llama) [gpt2 "
                        "and mpt presets: tied]")
    g.add_argument("--experts", type=positive_int, default=None, metavar="E",
                   help="a mixture of experts in every block in place of the MLP: E routed "
                        "experts, each an MLP of the preset's form (Megatron-Core's "
                        "--num-experts) [mixtral-*: 8; others: none]")
    g.add_argument("--top-k", type=positive_int, default=None, metavar="K",
                   help="with experts: the experts each token goes to (--moe-router-topk) [2]")
    g.add_argument("--expert-hidden", type=positive_int, default=None, metavar="H",
                   help="with experts: each expert's hidden units (--moe-ffn-hidden-size) "
                        "[the dense MLP's]")
    g.add_argument("--ep", type=positive_int, default=None, metavar="N",
                   help="expert parallel: the experts split over N GPUs of the data-parallel "
                        "ones, tokens sent to their experts' GPUs and back by all-to-alls "
                        "(--expert-model-parallel-size); what follows is one rank's step, the "
                        "all-to-alls in the scale-out [1]")
    g.add_argument("--expert-load", type=float, default=None, metavar="F",
                   help="with --ep: the busiest rank's tokens over the balanced share (1.2: "
                        "20%% more than its share); its experts and all-to-alls set the step "
                        "[1: a balanced router]")
    g.add_argument("--ep-dispatcher", choices=("alltoall", "deepep", "hybridep"),
                   default="alltoall",
                   help="with --ep: how tokens reach their experts' GPUs: alltoall = every copy "
                        "sent to its expert's GPU (Megatron's alltoall dispatcher, "
                        "torchtitan's); deepep, hybridep = each token sent over the network once "
                        "to each other node holding one of its experts, then over NVLink "
                        "(Megatron's flex dispatcher) [alltoall]")
    g.add_argument("--dropout", type=float, default=None, metavar="P",
                   help="GPT-2's and Megatron's dropouts in training (after the embeddings, on "
                        "the attention probabilities, on each block's two outputs), each a "
                        "kernel, in [0, 1) [0]")


def _float8_gather_shares(args) -> dict:
    """The AnalysisConfig shares of the weight casts under --fp8-all-gather (models/float8.py,
    ``gather_shares``): the GPUs sharing one copy of the weights, two gathers a micro-batch
    (FSDP reshards after the forward), the step's --grad-accum micro-batches."""
    from dlperf.models.float8 import gather_shares

    if not args.fp8_all_gather:
        return {}
    shards = min(args.gpus, args.gpus_per_node) if args.strategy == "hsdp" else args.gpus
    return gather_shares(shards, args.grad_accum)


def _checkpoint_policy(args) -> str:
    """AnalysisConfig.checkpoint_policy from --activation-checkpointing and
    --recompute-modules ("modules:NAME,NAME" for the latter)."""
    if args.recompute_modules is not None and args.activation_checkpointing != "modules":
        raise DlperfError("--recompute-modules names what --activation-checkpointing modules "
                          "recomputes: add --activation-checkpointing modules")
    if args.activation_checkpointing == "modules":
        names = [n.strip() for n in (args.recompute_modules or "core_attn").split(",")
                 if n.strip()]
        return "modules:" + ",".join(names)
    return args.activation_checkpointing or "full"


def _gpt_config(args):
    """The GPT preset named by ``args.model`` with the --layers ... --seq-len flags applied;
    None for other models (where those flags are an error, not silently ignored)."""
    from dlperf.models.gpt import PRESETS, gpt_config

    flags = {"layers": args.layers, "d_model": args.d_model, "heads": args.heads,
             "vocab": args.vocab, "seq_len": args.seq_len, "attention": args.attention,
             "dropout": args.dropout, "tp": args.tp if args.tp > 1 else None,
             "sequence_parallel": False if args.no_sequence_parallel else None,
             "tp_impl": args.tp_impl, "fp8": args.fp8,
             "fp8_all_gather": True if args.fp8_all_gather else None,
             "tie_embeddings": False if args.untie_embeddings else None,
             "cp": args.cp if args.cp > 1 else None, "cp_comm": args.cp_comm,
             "rope": args.rope, "experts": args.experts, "top_k": args.top_k,
             "expert_hidden": args.expert_hidden, "ep": args.ep,
             "expert_load": args.expert_load, "head_size": args.head_dim,
             "window": args.sliding_window, "full_every": args.full_attention_every,
             "sinks": True if args.attention_sinks else None,
             "qk_norm": True if args.qk_norm else None}
    if args.model not in PRESETS:
        prefix = {"sequence_parallel": "no-", "tie_embeddings": "un"}
        named = {"head_size": "head-dim", "window": "sliding-window",
                 "full_every": "full-attention-every", "sinks": "attention-sinks",
                 "qk_norm": "qk-norm"}
        given = [f"--{named.get(k) or prefix.get(k, '') + k.replace('_', '-')}"
                 for k, v in flags.items() if v is not None]
        if given:
            raise DlperfError(f"{', '.join(given)}: only for gpt and its presets "
                              f"({', '.join(PRESETS)}), not {args.model!r}")
        return None
    if args.rope and PRESETS[args.model].positions != "rope":
        raise DlperfError(f"--rope: {args.model} has learned positions, not rotary ones; "
                          "drop --rope or pick a llama preset")
    if args.rope and args.tp_impl == "te":
        raise DlperfError("--rope picks the unfused rotary kernels; --tp-impl te runs "
                          "TransformerEngine's fused one: drop one of them")
    try:
        return gpt_config(args.model, **flags)
    except ValueError as exc:
        flag = ("--sliding-window/--attention-sinks: " if "one fused kernel" in str(exc)
                else f"--tp {args.tp}: " if "tensor parallel" in str(exc)
                else f"--cp {args.cp}: " if "context parallel" in str(exc)
                else "--full-attention-every: " if "full_every" in str(exc)
                else "--dropout: " if "dropout" in str(exc)
                else (f"--ep {args.ep}: " if args.ep else "--expert-load: ")
                if "need a mixture of experts" in str(exc)
                else "--expert-load: " if "expert load" in str(exc)
                else f"--ep {args.ep}: " if "expert parallel over" in str(exc)
                else "--experts: " if "experts" in str(exc) else "")
        raise DlperfError(f"{flag}{exc}") from None


def gpus_per_node(gpus: int | None, nodes: int | None, per_node: int | None) -> int:
    """--gpus-per-node from --nodes (torchrun's --nnodes: GPUS spread evenly), or as given, or
    8 (a DGX/HGX node); a one-line error where the two flags disagree or M does not divide."""
    if nodes is None:
        return 8 if per_node is None else per_node
    if gpus is None:
        raise DlperfError(f"--nodes {nodes} spreads the scale-out's GPUs over nodes: add --gpus "
                          "N (a multiple of it)")
    if gpus % nodes:
        raise DlperfError(f"--gpus {gpus} does not spread evenly over --nodes {nodes}: give a "
                          "multiple of the node count (or --gpus-per-node for the node size)")
    if per_node is not None and per_node * nodes != gpus:
        raise DlperfError(f"--nodes {nodes} and --gpus-per-node {per_node} make "
                          f"{nodes * per_node} GPUs, not --gpus {gpus}: give one of them")
    return gpus // nodes


def interconnect_names(interconnect: str, device: str) -> tuple[list[str], bool] | None:
    """--interconnect's names (node, network) and whether they are assumed: as given (one name
    for both), or for auto the --device preset's system (hardware/interconnect.py,
    auto_interconnects); None for auto on a device with none."""
    from dlperf.hardware.interconnect import auto_interconnects

    names = [n.strip() for n in interconnect.split(",")]
    if names == ["auto"]:
        auto = auto_interconnects(device)
        if auto is None:
            return None
        *names, assumed = auto
        return names, assumed
    return (names * 2 if len(names) == 1 else names), False


def node_gpus(interconnect: str, device: str) -> int:
    """The default --gpus-per-node: the GPUs the node interconnect of --interconnect joins, 8
    where none is known."""
    from dlperf.hardware.interconnect import get_interconnect

    resolved = interconnect_names(interconnect, device)
    return 8 if resolved is None else get_interconnect(resolved[0][0]).gpus


def run(args) -> int:
    import dataclasses

    import torch

    output_file(args.json, "--json")
    output_file(args.html, "--html")

    from dlperf.analysis.api import (AnalysisConfig, capture_costs, default_batch_size,
                                     default_optimizer, predict_on)
    from dlperf.analysis.nccl import generation
    from dlperf.analysis.report import render, render_comparison
    from dlperf.files import write_json_atomic
    from dlperf.models.gpt import default_attention_kernel, default_loss, default_train_metrics
    from dlperf.models.registry import build_model, parse_input_shape

    console = new_console()

    def attention_kernel(spec) -> str:
        """--attention-kernel, else what the installed torch's SDPA runs on ``spec`` (per GPU:
        cuDNN's on Hopper from torch 2.11, FlashAttention-2 on Ampere) or the preset's."""
        return args.attention_kernel or default_attention_kernel(args.model, spec)

    node_given = args.gpus_per_node is not None or args.nodes is not None
    args.gpus_per_node = gpus_per_node(args.gpus, args.nodes, args.gpus_per_node)
    if args.tp > 1 and args.gpus is None:
        raise DlperfError(f"--tp {args.tp} splits the model over GPUs of a node: add --gpus N "
                          "(a multiple of it)")
    if args.cp > 1 and args.gpus is None:
        raise DlperfError(f"--cp {args.cp} splits each sequence over GPUs: add --gpus N (a "
                          "multiple of --tp x --cp x --pp)")
    if args.cp_comm is not None and args.cp == 1:
        raise DlperfError("--cp-comm describes context parallelism: add --cp N (N > 1)")
    if args.cp > 1 and args.measure:
        raise DlperfError("--measure times the whole model on this machine's GPU; --cp "
                          "predicts one context-parallel rank: drop one of them")
    if args.ep is not None and args.ep > 1 and args.gpus is None:
        raise DlperfError(f"--ep {args.ep} splits the experts over GPUs: add --gpus N (a "
                          "multiple of --tp x --cp x --ep x --pp)")
    if args.ep_dispatcher != "alltoall" and not (args.ep is not None and args.ep > 1):
        raise DlperfError(f"--ep-dispatcher {args.ep_dispatcher} picks how expert-parallel "
                          "ranks exchange tokens: add --ep N (N > 1), or drop it")
    if args.ep is not None and args.ep > 1 and args.measure:
        raise DlperfError("--measure times the whole model on this machine's GPU; --ep "
                          "predicts one expert-parallel rank: drop one of them")
    if (args.pp > 1 or args.pp_virtual > 1) and args.gpus is None:
        raise DlperfError(f"--pp {args.pp} splits the model over GPUs: add --gpus N (a "
                          "multiple of --tp x --pp)")
    for flag, given in (("--no-sequence-parallel", args.no_sequence_parallel),
                        ("--tp-impl", args.tp_impl not in (None, "te"))):
        if given and args.tp == 1:
            raise DlperfError(f"{flag} describes tensor parallelism: add --tp N (N > 1)")
    if (args.tp_impl in ("megatron", "te") and args.precision == "mixed"
            and args.dtype in ("bf16", "fp16")):
        raise DlperfError(f"--tp-impl {args.tp_impl} runs the model in {args.dtype} as "
                          "Megatron-LM "
                          "does, not under autocast: add --precision fsdp (fp32 master "
                          "weights) or --precision half")
    uneven = [flag for flag, n in (("--pp-first-layers", args.pp_first_layers),
                                   ("--pp-last-layers", args.pp_last_layers),
                                   ("--pp-layout", args.pp_layout)) if n is not None]
    if uneven and args.pp == 1:
        raise DlperfError(f"{' and '.join(uneven)} describe{'s' if len(uneven) == 1 else ''} "
                          "a pipeline's stages: add --pp N (N > 1)")
    if args.pp_layout is not None and len(uneven) > 1:
        raise DlperfError("--pp-layout places every block itself: drop --pp-first-layers and "
                          "--pp-last-layers")
    if args.pp_overlap_p2p and args.pp_virtual == 1:
        raise DlperfError("--pp-overlap-p2p overlaps the interleaved schedule's transfers "
                          "(Megatron-Core overlaps none in 1F1B): add --pp-virtual V (V > 1)")
    if args.fp8 in ("delayed", "current", "mxfp8") and args.tp_impl != "te":
        raise DlperfError(f"--fp8 {args.fp8} runs TransformerEngine's FP8 layers "
                          "(Megatron-Core's stack): add --tp-impl te, or use --fp8 tensorwise "
                          "(torchao's float8 layers, as torchtitan runs them)")
    if args.fp8 in ("tensorwise", "rowwise") and args.tp_impl not in (None, "torch",
                                                                      "torch-async"):
        raise DlperfError(f"--fp8 {args.fp8} (torchao's float8 layers) runs on PyTorch's "
                          "tensor parallelism: use --tp-impl torch or torch-async, or --fp8 "
                          "delayed or current with --tp-impl te")
    if args.fp8_recast_weights and args.fp8 not in ("delayed", "current", "mxfp8"):
        raise DlperfError("--fp8-recast-weights is TransformerEngine's weight cast per "
                          "micro-batch: it needs --fp8 delayed, current or mxfp8 (torchao's float8 "
                          "layers cast their weights in every micro-batch already)")
    if args.fp8_all_gather and (args.fp8 != "tensorwise"
                                or args.strategy not in ("fsdp", "hsdp") or not args.gpus):
        raise DlperfError("--fp8-all-gather is FSDP's float8 all-gather of torchao's layers: "
                          "it needs --fp8 tensorwise (torchao's rowwise recipe gathers in "
                          "BF16), --strategy fsdp or hsdp and --gpus N")
    if args.tp_impl == "torch-async" and (args.no_sequence_parallel
                                          or args.fusion not in ("compile", "compile-blocks")):
        raise DlperfError("--tp-impl torch-async is Inductor's pass over the all-gathers and "
                          "reduce-scatters of sequence parallelism (torchtitan refuses async "
                          "TP without --training.compile): add --fusion compile-blocks (or "
                          "compile) and drop --no-sequence-parallel")
    if args.tp_impl == "te" and args.no_sequence_parallel:
        raise DlperfError("--tp-impl te overlaps the collectives of sequence parallelism "
                          "(Megatron-LM refuses --tp-comm-overlap without it): drop "
                          "--no-sequence-parallel, or use --tp-impl megatron")
    if args.tp > 1 and args.measure:
        raise DlperfError("--measure times the whole model on this machine's GPU; --tp "
                          "predicts one tensor-parallel rank: drop one of them")
    gpt = _gpt_config(args)
    specs = _specs(args, console)
    spec = specs[0]
    if args.gpus is not None and not node_given:
        # a node is what its interconnect joins: an NVL72 rack's 72 GPUs, not a server's 8
        args.gpus_per_node = node_gpus(args.interconnect, spec.name)
    if args.fp8 is not None:
        lacking = [s.name for s in specs if s.peak_flops("fp8") is None]
        if lacking:
            raise DlperfError(f"--fp8: {', '.join(lacking)} has no FP8 Tensor Cores (Hopper, "
                              "Ada and later have them); drop --fp8 or choose such a --device")
        # datacenter Blackwell's FP8 GEMMs (sm 10.x: B200, B300, GB200) take any layout,
        # Hopper's, Ada's and sm 12.x Blackwell's only TN (TransformerEngine's
        # nvte_is_non_tn_fp8_gemm_supported): the capture (one for every --device) makes the
        # transposes or not; of the presets, the b200, gb200, b300 and gb300 are of the first kind
        kinds = {generation(s.name) < 3 for s in specs}
        if args.fp8 == "mxfp8" and True in kinds:
            older = ", ".join(s.name for s in specs if generation(s.name) < 3)
            raise DlperfError(f"--fp8 mxfp8: {older} has no block-scaled FP8 Tensor Cores "
                              "(MXFP8 is datacenter Blackwell's here: "
                              "b200, b300, gb200, gb300); use --fp8 current or delayed there")
        if len(kinds) > 1:
            raise DlperfError("--fp8 --device: compare Blackwell GPUs with Blackwell GPUs and "
                              "Hopper or Ada GPUs with each other (their FP8 GEMMs take "
                              "different operand layouts, so their casts differ)")
        gpt = dataclasses.replace(gpt, fp8_tn_only=kinds.pop())
    model, model_input = build_model(args.model, gpt=gpt, num_classes=args.num_classes)
    sample_shape = (parse_input_shape(args.input_shape) if args.input_shape is not None
                     else model_input.shape)
    tokens = (args.input_dtype or ("int64" if model_input.kind == "tokens" else "")) == "int64"
    batch = args.batch_size or default_batch_size(model_input.kind == "tokens")
    cfg = AnalysisConfig(model=args.model, input_shape=(batch, *sample_shape), dtype=args.dtype,
                         tf32=args.tf32, train=args.train, channels_last=args.channels_last,
                         device=spec.name, tokens=tokens and len(sample_shape) == 1,
                         optimizer=(default_optimizer(tokens) if args.optimizer == "auto"
                                    else args.optimizer), precision=args.precision,
                         activation_checkpointing=args.activation_checkpointing is not None,
                         checkpoint_policy=_checkpoint_policy(args),
                         checkpoint_every=args.checkpoint_every or 1,
                         fusion=args.fusion, cuda_graphs=args.cuda_graphs,
                         optimizer_impl=args.optimizer_impl,
                         fp8=args.fp8,
                         # TE casts the weights in a step's first micro-batch only, when
                         # told which one that is (is_first_microbatch: Megatron-Core)
                         fp8_weight_reuse=(args.grad_accum if args.fp8 in ("delayed", "current",
                                                                           "mxfp8")
                                           and not args.fp8_recast_weights else 1),
                         **_float8_gather_shares(args),
                         attention_kernel=attention_kernel(spec),
                         loss=args.loss or default_loss(args.model),
                         train_metrics=(args.train_metrics if args.train_metrics is not None
                                        else default_train_metrics(args.model)
                                        if args.train else 0))
    if args.optimizer_impl != "fused" and (not args.train or args.optimizer == "none"):
        raise DlperfError("--optimizer-impl describes the parameter update: it needs --train "
                          "and an optimizer")
    if args.tf32 and args.dtype != "fp32":
        raise DlperfError("--tf32 applies to --dtype fp32 only (bf16/fp16 already use Tensor Cores)")
    if args.checkpoint_every is not None and args.activation_checkpointing is None:
        raise DlperfError("--checkpoint-every N picks which blocks --activation-checkpointing "
                          "full wraps: add --activation-checkpointing")
    if args.activation_checkpointing is not None and not args.train:
        raise DlperfError("--activation-checkpointing needs --train (it replays the forward in "
                          "the backward)")
    if args.grad_accum != 1 and args.gpus is None:
        raise DlperfError("--grad-accum applies to the scale-out (--gpus N); one device's step "
                          "is one micro-batch of --batch-size")
    if args.gpus is None and any(v is not None for v in (args.data_cores, args.decode_rate,
                                                         args.loader_workers)):
        raise DlperfError("--data-cores, --decode-rate and --loader-workers describe the input "
                          "side of the scale-out: add --gpus N (and --decode cpu)")
    if args.loader is not None and (args.gpus is None or args.decode != "cpu"):
        raise DlperfError("--loader names the pipeline that decodes JPEGs on the host: add "
                          "--gpus N --decode cpu")
    if args.gpus is None and args.step_cv is not None:
        raise DlperfError("--step-cv is the spread of one GPU's step among many: add --gpus N")
    if args.gpus is None and args.collective_sms is not None:
        raise DlperfError("--collective-sms is what a collective takes from the compute beside "
                          "it on many GPUs: add --gpus N")
    if args.gpus is None and (args.nccl_algo or args.nccl_proto or args.grad_as_bucket_view
                              or args.bucket_cap_mb is not None or args.distributed_optimizer
                              or args.no_broadcast_buffers):
        raise DlperfError("--nccl-algo, --nccl-proto, --bucket-cap-mb, --grad-as-bucket-view, "
                          "--no-broadcast-buffers and --distributed-optimizer shape the "
                          "collectives of the scale-out: add --gpus N")
    if args.no_broadcast_buffers and args.strategy != "ddp":
        raise DlperfError(f"--no-broadcast-buffers is DDP's broadcast_buffers; --strategy "
                          f"{args.strategy} broadcasts no buffers: drop it")
    if args.gpus is None and args.kvstore is not None:
        raise DlperfError("--kvstore reduces the gradients of the scale-out: add --gpus N")
    if args.deepspeed_bf16 and (args.gpus is None or args.dtype != "bf16"
                                or args.precision != "fsdp"):
        raise DlperfError("--deepspeed-bf16 is DeepSpeed's BF16_Optimizer on the scale-out: "
                          "it needs --gpus N, --dtype bf16 and --precision fsdp (a bf16 model "
                          "with fp32 master weights)")
    if args.distributed_optimizer and args.strategy != "ddp":
        raise DlperfError(f"--distributed-optimizer is DDP's (Megatron-LM's); --strategy "
                          f"{args.strategy} shards the optimizer already: drop one of them")
    scale_setup = (_scale_setup(args, spec, console, gpt, batch * sample_shape[0])
                   if args.gpus else None)
    input_dtype = {"float32": torch.float32, "int64": torch.long}.get(args.input_dtype,
                                                                      model_input.dtype)
    costs, uncounted, seconds, memory = capture_costs(model, cfg, input_dtype)  # once for all
    analysis = predict_on(costs, uncounted, cfg, spec, seconds, memory=memory)
    stage = (_pipeline_stage(args, model, costs, uncounted, cfg, spec, seconds, memory,
                             scale_setup[3]) if args.pp > 1 else None)
    if args.tp > 1:
        between = ("all the tokens between them (no sequence parallelism: norms, dropouts "
                   "and residual adds whole on every rank)" if args.no_sequence_parallel else
                   "of the tokens between them (sequence parallel: norms and residual adds)")
        console.print(f"--tp {args.tp}: what follows is one tensor-parallel rank's step: "
                      f"1/{args.tp} of every block's heads and MLP and of the vocabulary, and "
                      f"{between}; the collectives that join the ranks are in the scale-out at "
                      "the end, "
                      + ("run as Megatron-LM runs them (--tp-impl megatron)."
                         if gpt.tp_impl == "megatron" else
                         "run as Megatron-Core runs them on TransformerEngine's layers with "
                         "--tp-comm-overlap (--tp-impl te)." if gpt.tp_impl == "te" else
                         "run as PyTorch's async tensor parallelism runs them, the compiled "
                         "blocks' fused with their matmuls (--tp-impl torch-async)."
                         if gpt.tp_impl == "torch-async" else
                         "run as PyTorch's DTensor runs them, every one exposed (for "
                         "Megatron-LM's stack: --tp-impl megatron --fusion megatron)."),
                      style="yellow")
    if args.cp > 1:
        console.print(f"--cp {args.cp}: what follows is one context-parallel rank's step: "
                      f"{gpt.local_seq_len:,} of each sequence's {gpt.seq_len:,} tokens (two "
                      f"of its {2 * args.cp} chunks), and its queries' attention against the "
                      "keys and values of the chunks before them; the exchanges of K and V "
                      f"({'a ring' if gpt.cp_comm == 'p2p' else 'an all-gather'}) are in the "
                      "scale-out at the end.", style="yellow")
    if gpt is not None and gpt.ep > 1:
        console.print(f"--ep {gpt.ep}: what follows is one expert-parallel rank's step: "
                      f"{gpt.local_experts} of each block's {gpt.experts} experts, run on "
                      f"{gpt.expert_rows(batch * sample_shape[0]):,} token copies a micro-batch "
                      f"(top {gpt.top_k} of its {batch * sample_shape[0]:,} tokens, every "
                      "rank's copies for its experts"
                      + (f", {gpt.expert_load:g}x the balanced share" if gpt.expert_load > 1
                         else ", a balanced router") + "); the all-to-alls that carry them "
                      "are in the scale-out at the end.", style="yellow")
    render(analysis, console, top=args.top, macs=args.macs)
    if stage is not None:
        layout = scale_setup[3]
        console.print(f"--pp {args.pp}: the step above is the whole model on one rank; the "
                      f"scale-out below times its slowest pipeline stage (stage {stage[2]} of "
                      f"{args.pp}: {layout[stage[2]]} blocks"
                      + (", the embeddings" if stage[2] == 0 else "")
                      + (", the output layer and the loss" if stage[2] == args.pp - 1 else "")
                      + f") over {args.grad_accum} micro-batches"
                      + ("" if len(set(layout)) == 1 else
                         f" (stages of {', '.join(map(str, layout))} blocks: the others' "
                         f"fill and drain count {stage[4]:.2f} of its micro-batches)")
                      + ", and the memory of the stage that holds the most.", style="yellow")
    result = analysis.to_dict()
    if len(specs) > 1:
        # each GPU's own attention kernel where none was given
        others = [analysis] + [predict_on(costs, uncounted, dataclasses.replace(
            cfg, attention_kernel=attention_kernel(s)), s, seconds, memory=memory)
            for s in specs[1:]]
        result["comparison"] = render_comparison(others, console)
    if args.gpus:
        result["scale_out"] = _scale_out(args, analysis, model, console, scale_setup, stage,
                                         gpt)
    if args.measure:
        result["measurement"] = _measure(args, cfg, spec, gpt, input_dtype, console).to_dict()
    if args.json:
        from dlperf.provenance import environment

        # machine, versions and commit beside the numbers (a --measure run is a benchmark)
        write_json_atomic(args.json, {**result, "environment": environment()})
        console.print(f"Wrote {args.json}")
    if args.html:
        from dlperf.analysis.html import render_html
        from dlperf.files import write_text_atomic

        write_text_atomic(args.html, render_html(analysis, scale_out=result.get("scale_out")))
        console.print(f"Wrote {args.html}")
    return 0


def _scale_setup(args, spec, console, gpt=None, tokens: int = 0):
    """--gpus: the interconnects and the ScaleConfig, checked before the capture, so that a
    mistyped interconnect file or flag stops the command before the model is traced, on the
    device ``spec``. ``gpt``: the decoder's config and ``tokens`` a micro-batch's (--tp: its
    collectives)."""
    from dlperf.analysis.scaling import ScaleConfig, held_sms
    from dlperf.hardware.interconnect import get_interconnect
    from dlperf.models.gpt import column_parallel_regions, row_parallel_regions

    if not args.train:
        raise DlperfError("--gpus needs --train (data parallel scaling is about training steps)")
    device = spec.name
    resolved = interconnect_names(args.interconnect, device)
    if resolved is None:
        raise DlperfError(f"--interconnect auto knows no system for {device}; name one, "
                          "e.g. --interconnect nvlink4-h100,ib-ndr")
    names, assumed = resolved
    if assumed:
        console.print(f"--interconnect auto: {device} is a PCIe card: {names[0]} "
                      f"through the host inside a node, {names[1]} between nodes "
                      "(assumed: name yours with --interconnect NODE,NETWORK)",
                      style="yellow")
    node, network = (get_interconnect(n) for n in names[:2])
    act_bytes = ELEMENT_BYTES[args.dtype]
    layout = None
    if args.pp > 1 or args.pp_virtual > 1:
        if gpt is None:
            raise DlperfError("--pp: only for gpt and its presets (its stages are the "
                              "decoder's blocks)")
        from dlperf.analysis.pipeline import check, parse_layout

        if args.pp_layout is not None:
            try:
                layout, virtual = parse_layout(args.pp_layout, gpt.layers, args.pp)
            except ValueError as exc:
                raise DlperfError(f"--pp-layout: {exc}") from None
            if virtual != args.pp_virtual:
                raise DlperfError(f"--pp-layout has {virtual} chunks a stage over --pp "
                                  f"{args.pp}: give --pp-virtual {virtual}")
        else:
            try:
                layout = check(gpt.layers, args.pp, args.pp_virtual, args.pp_first_layers,
                               args.pp_last_layers)
            except ValueError as exc:
                raise DlperfError(f"--pp {args.pp}: {exc}") from None
    # a stage's exchanges: the most blocks any holds until the slowest is known (_scale_out)
    exchanges = _stage_exchanges(args, gpt, tokens,
                                 max(layout) if layout else gpt and gpt.layers)
    cfg = ScaleConfig(gpus=args.gpus, gpus_per_node=args.gpus_per_node, strategy=args.strategy,
                      cp=args.cp, cp_comm=args.cp_comm or "p2p", **exchanges,
                      ep=gpt.ep if gpt is not None else 1,
                      tp=args.tp,
                      tp_regions=column_parallel_regions(gpt) if args.tp > 1 else (),
                      tp_row_regions=row_parallel_regions(gpt) if args.tp > 1 else (),
                      pp=args.pp,
                      pp_virtual=args.pp_virtual, pp_overlap_p2p=args.pp_overlap_p2p,
                      # a micro-batch's activations at a stage boundary, on one tensor-parallel
                      # rank (Megatron sends 1/tp of them, sequence parallel or not)
                      p2p_bytes=(tokens * gpt.d_model * act_bytes // args.tp
                                 if args.pp > 1 else 0),
                      decode=args.decode, data_cores_per_gpu=args.data_cores,
                      decode_img_per_s_per_core=args.decode_rate,
                      loader_workers_per_gpu=args.loader_workers, grad_accum=args.grad_accum,
                      overlap=not args.no_overlap, bucket_cap_mb=args.bucket_cap_mb,
                      bucket_view=args.grad_as_bucket_view,
                      broadcast_buffers=not args.no_broadcast_buffers,
                      distributed_optimizer=args.distributed_optimizer,
                      deepspeed_bf16=args.deepspeed_bf16,
                      reduce_dtype=args.reduce_dtype, bn_group=args.bn_group,
                      step_cv=args.step_cv, nccl_algo=args.nccl_algo,
                      nccl_proto=args.nccl_proto, kvstore=args.kvstore,
                      collective_sms=args.collective_sms or 0)
    held_sms(spec, cfg.collective_sms)  # (more SMs than the GPU has: before the capture)
    return cfg, node, network, layout


def _stage_exchanges(args, gpt, tokens: int, blocks: int | None) -> dict:
    """The ScaleConfig fields of a stage's tensor- and context-parallel exchanges on a
    micro-batch of ``tokens``, for a stage of ``blocks`` blocks (the whole decoder without
    pipeline stages), in the activations' dtype."""
    from dlperf.analysis.scaling import float8_tp_reductions, tensor_parallel_collectives
    from dlperf.models.float8 import RECIPES as FLOAT8_RECIPES
    from dlperf.models.fp8 import MX_RECIPES
    from dlperf.models.gpt import column_parallel_regions, row_parallel_regions

    act_bytes = ELEMENT_BYTES[args.dtype]
    float8 = gpt.fp8 if gpt is not None and gpt.fp8 in FLOAT8_RECIPES else None
    # a full checkpoint replays the forward's collectives; torchtitan's op-level policy
    # saves the collectives' outputs (and the amaxes: its _save_list keeps aten.max)
    recompute = args.activation_checkpointing == "full"
    # (the +1 of the embedding or the output layer kept whatever the stage)
    collectives = () if args.tp == 1 else tensor_parallel_collectives(
        blocks, tokens, gpt.d_model, act_bytes, recompute=recompute,
        recompute_every=args.checkpoint_every or 1,
        sequence_parallel=gpt.sequence_parallel, impl=gpt.tp_impl,
        fp8=gpt.fp8 is not None and float8 is None, float8=float8,
        mxfp8=gpt.fp8 in MX_RECIPES)
    if args.tp > 1 and float8 is not None:
        # torchao's casts of tensors split over the ranks: their amaxes all-reduced; a block's
        # column- and row-parallel layers as the model builds them (its first two regions)
        column = sum(len(r) for r in column_parallel_regions(gpt)[:2])
        row = sum(len(r) for r in row_parallel_regions(gpt)[:2])
        collectives += float8_tp_reductions(
            float8, blocks, column, row, tokens, gpt.d_model,
            recompute_layers=blocks // (args.checkpoint_every or 1) if recompute else 0,
            sequence_parallel=gpt.sequence_parallel)
    # context parallel: a layer's K and V on one rank for a micro-batch (of the local tokens,
    # the rank's share of the K/V heads), what each exchange moves
    kv_bytes = (2 * tokens * (gpt.kv_heads or gpt.heads) // args.tp * gpt.head_dim * act_bytes
                if args.cp > 1 else 0)
    # expert parallel: the busiest rank's token copies, what each all-to-all moves
    ep_bytes = (gpt.expert_rows(tokens) * gpt.d_model * act_bytes
                if gpt is not None and gpt.ep > 1 else 0)
    return {"tp_collectives": collectives, "cp_kv_bytes": kv_bytes,
            "cp_layers": blocks if args.cp > 1 else 0, "ep_bytes": ep_bytes,
            "ep_dispatcher": args.ep_dispatcher,
            "ep_routing": (gpt.experts, gpt.top_k) if gpt is not None and gpt.experts else ()}


def _pipeline_stage(args, model, costs, uncounted, cfg, spec, seconds, memory, layout):
    """--pp: the slowest pipeline stage's analysis, gradient parameters and index, the tied
    embedding's gradient bytes and the other stages' fill in its micro-batches (analysis/
    pipeline.py; ``layout``: the blocks of each stage); its memory that of the stage holding
    the most (the first of equal stages, the second after a lighter first; any, under
    --pp-layout)."""
    from dlperf.analysis.api import predict_on
    from dlperf.analysis.capture import block_paths
    from dlperf.analysis.pipeline import (fill_stages, in_flight_share, modules_before,
                                          ordered_blocks, stage_costs, stage_memory,
                                          stage_of_costs, stage_params)

    pp = len(layout)
    blocks = ordered_blocks(block_paths(n for n, _ in model.named_parameters()))
    stages = stage_of_costs(costs, blocks, layout)
    grad_bytes = state_element_bytes(cfg.precision)
    # every name of a parameter: a tied embedding is on the first stage and the last
    params, tied = stage_params(
        [(n, id(p), p.numel() * grad_bytes)
         for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad],
        blocks, layout, modules_before(costs, blocks))
    # (a share of the model's parameters, each once: a tied copy is extra on its stage)
    total = sum(b for _, b, _ in params) - tied or 1
    share = {k: sum(b for _, b, s in params if s == k) / total for k in range(pp)}
    held = max((stage_memory(memory, share[k],
                             in_flight_share(layout, k, args.pp_virtual, args.grad_accum))
                for k in range(pp)),
               key=lambda m: m["total_bytes"] if m else 0)
    # each distinct stage once: its blocks, and whether it also runs the embedding (the first)
    # or the output layer and loss (the last); the first of equal ones stands for the rest
    first_of: dict[tuple, int] = {}
    for i in range(pp):
        first_of.setdefault((layout[i], i == 0, i == pp - 1), i)
    times, analyses = {}, {}
    for k in sorted(first_of.values()):
        analyses[k] = predict_on(stage_costs(costs, stages, k, share[k]), uncounted, cfg,
                                 spec, seconds, memory=held)
        # a micro-batch's forward and backward on the stage (its update is once a step)
        times[k] = sum(p.time_s for p in analyses[k].predictions
                       if p.cost.phase != "optimizer")
    k = max(times, key=lambda i: (times[i], -i))
    fill = fill_stages([times[first_of[(layout[i], i == 0, i == pp - 1)]]
                        for i in range(pp)])
    return analyses[k], [(n, b) for n, b, s in params if s == k], k, tied, fill


def _scale_out(args, analysis, model, console, setup, stage=None, gpt=None) -> dict:
    """--gpus: the scaling curve of this analysis (one capture, reused), and the requested
    scale's row; ``setup``: what ``_scale_setup`` checked before the capture; ``stage``:
    with --pp, what ``_pipeline_stage`` found of the slowest stage; ``gpt``: the decoder's
    config (the stage's exchanges)."""
    from dataclasses import replace

    from dlperf.analysis.report import render_scaling
    from dlperf.analysis.scaling import scale_out_and_curve
    from dlperf.hardware.track_record import (describe_scale_out, efficiency_band,
                                              load_scale_out)

    cfg, node, network, layout = setup
    if stage is not None:
        analysis, params, k, tied, fill = stage
        # the slowest stage's own exchanges, and the other stages' share of the bubble
        cfg = replace(cfg, pp_tied_bytes=tied, pp_fill=fill, **_stage_exchanges(
            args, gpt, analysis.config.input_shape[0] * analysis.config.input_shape[1],
            layout[k]))
    else:
        # gradients in the parameters' dtype: fp32 under autocast, half with --precision half
        grad_bytes = state_element_bytes(analysis.config.precision)
        params = [(n, p.numel() * grad_bytes) for n, p in model.named_parameters()
                  if p.requires_grad]
    if cfg.ep > 1:  # (the experts' gradients, reduced over their own replicas)
        from dlperf.models.gpt import expert_parameters

        cfg = replace(cfg, expert_params=expert_parameters(model))
    if cfg.strategy == "ddp":  # (what DDP broadcasts before every forward)
        from dlperf.analysis.scaling import module_buffers

        cfg = replace(cfg, buffers=module_buffers(model))
    if args.fp8_all_gather:  # (torchao's float8 layers: FSDP gathers their weights in FP8)
        from dlperf.models.float8 import float8_parameters

        cfg = replace(cfg, fp8_gathered=float8_parameters(model))
    here, curve = scale_out_and_curve(analysis, params, cfg, node, network)
    if stage is not None:
        here["communication"]["pipeline"]["slowest_stage"] = stage[2]
    # (a whole sequence's tokens: a context-parallel rank holds 1/cp of them)
    tokens = analysis.config.input_shape[1] * cfg.cp if analysis.config.tokens else None
    # what published multi-GPU runs say about these predictions (hardware/track_record.py)
    # a host JPEG decode is read through the runs that had one (they lose what others do not)
    # (through the runs of its pipeline: torch's DataLoader or DALI's CPU pipeline, --loader)
    host_decode, loader = cfg.decode == "cpu", args.loader or "torch"
    line = describe_scale_out(analysis.device, host_decode=host_decode, loader=loader)
    # the record's runs are data parallel only: no band to read a tensor-parallel job through
    band = None if line is None or cfg.tp > 1 or cfg.pp > 1 or cfg.cp > 1 else efficiency_band(
        here["scaling_efficiency"], here["nodes"], analysis.device.name,
        host_decode=host_decode, loader=loader)
    render_scaling(here, curve, node, network, console, tokens_per_sample=tokens, record=line,
                   band=band)
    saved = load_scale_out()
    record = None if line is None else {
        "text": line[0], "systematic": line[1], "one_node": saved.get("one_node"),
        "device": saved.get("by_device", {}).get(analysis.device.name),
        "across_nodes": saved.get("across_nodes"),
        "host_decode": saved.get(HOST_DECODE[loader]) if host_decode else None,
        "loader": loader if host_decode else None,
        "efficiency_band": list(band) if band else None}
    return {"config": {**cfg.__dict__, "node": node.to_dict(), "network": network.to_dict()},
            "at_requested_scale": here, "curve": curve, "track_record": record}


def _specs(args, console) -> list:
    """The DeviceSpecs of --device (comma-separated: presets, spec files, or cpu for a fresh
    probe), each able to run --dtype, checked before the capture so a comparison never stops
    half printed."""
    names = [d.strip() for d in args.device.split(",") if d.strip()]
    if not names:
        raise DlperfError("--device: give a preset, a spec file or cpu")
    if len(names) > 1 and args.measure:
        raise DlperfError("--measure needs a single --device")
    if args.measure and (args.fusion != "none" or args.cuda_graphs):
        raise DlperfError("--measure times the eager PyTorch step: leave out --fusion and "
                          "--cuda-graphs, which predict another stack")
    specs = []
    for name in names:
        if name == "cpu":
            from dlperf.hardware.probe import ProbeConfig, probe

            with console.status("probing this CPU's ceilings (--device cpu)..."):
                specs.append(probe(ProbeConfig(device="cpu", quick=True))[0])
        else:
            from dlperf.hardware.specs import get_device

            specs.append(get_device(name))
    overrides = parse_overrides(args.efficiency)
    if overrides:
        from dataclasses import replace

        specs = [replace(s, efficiency={**(s.efficiency or {}), **overrides}) for s in specs]
    if args.dtype == "bf16":
        lacking = [s.name for s in specs if s.peak_flops("bf16") is None]
        if lacking:
            raise DlperfError(f"{', '.join(lacking)} has no bf16 math: use --dtype fp16 or fp32, "
                              "or leave it out of --device")
    return specs


def _measure(args, cfg, spec, gpt, input_dtype, console):
    import torch
    from rich.progress import Progress

    from dlperf.analysis.measure import MeasureConfig, measure
    from dlperf.analysis.report import render_measurement
    from dlperf.models.registry import build_model

    if args.device == "cpu":
        device = "cpu"
    elif torch.cuda.is_available():
        device = "cuda"
    else:
        raise DlperfError(f"--measure runs the model here, and no CUDA GPU is visible for "
                          f"--device {args.device}; use --device cpu to measure this CPU")
    model, _ = build_model(args.model, gpt=gpt, num_classes=args.num_classes, real=True)
    mcfg = MeasureConfig(steps=args.measure_steps)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"measuring on {device}", total=mcfg.steps + mcfg.warmup)
        result = measure(model, cfg, spec, device, input_dtype, mcfg,
                         progress=lambda: bar.advance(task))
    render_measurement(result, console, top=args.top)
    return result
