"""How much of a datasheet peak real kernels reach, by kernel class (issue #11).

The performance guide (2.1) defines *whether* an operation is math- or memory-bound from its
arithmetic intensity and the ops:byte ratio at full peak; dlperf keeps that definition for the
``bound`` column. How *long* the kernel takes also depends on how close real kernels get to
those peaks, which differs by kind of kernel. This module holds that part, as a handful of
named, readable parameters instead of two constants for every op on every GPU:

Math (fraction of the dense peak of the unit the kernel runs on, before the tile and wave
quantization of ``gemm.py``, which stays separate):

* ``tensor_gemm``: cuBLAS GEMMs (linear layers, attention matmuls) on Tensor Cores.
* ``tensor_conv``: cuDNN implicit-GEMM convolutions on Tensor Cores (im2col addressing,
  filter/halo loads and the epilogue cost them more than a GEMM of the same M, N, K).
* ``grouped_conv``: grouped convolutions wide enough for Tensor Cores (ResNeXt's 32 groups of
  4-32 channels); cuDNN runs them as many small GEMMs that never fill a tile pipeline.
* ``attention``: fused attention kernels (flash attention: both matmuls, the online softmax
  and, in the backward, five matmuls per tile) on Tensor Cores, which keep less of the peak
  than a GEMM of the same FLOPs (the softmax's exp and rescaling between the matmuls, causal
  tiles half empty). None: as ``tensor_gemm``.
* ``cuda_core``: FP32 on the FMA pipes (FP32 GEMMs without TF32, depthwise convolutions).
* ``cuda_core_attention``: fused attention off Tensor Cores (a CPU's flash-attention kernel,
  FP32 memory-efficient attention on a GPU's CUDA cores): blocked matmuls with an online
  softmax between them, which on a 2-core CPU ran at a third of the sgemm rate the other
  matmuls reach. None: as ``cuda_core``; ``dlperf probe --sweep`` fits it on a CPU.
* ``cuda_core_conv``: convolutions on the same pipes (FP32 convolutions; every convolution on a
  CPU), when they reach a different share than GEMMs: a CPU's GEMMs (MKL/OpenBLAS sgemm) keep
  more of the peak than its convolutions (oneDNN direct and im2col kernels). None: as
  ``cuda_core`` (the published GPU table does not separate them).
* ``winograd``: the share of its implicit-GEMM math time an FP32 convolution keeps when cuDNN
  runs it with a Winograd algorithm, which computes a 3x3 convolution from fewer multiplies
  (F(2x2, 3x3) needs 2.25x fewer, F(4x4, 3x3) 4x fewer, Lavin and Gray, arXiv 1509.09308)
  at the cost of the input, filter and output transforms. It applies to convolutions on the
  CUDA cores (FP32 without TF32 Tensor Cores) whose shape the algorithms take (a 3x3 filter,
  stride 1, dilation 1, one group: ``Cost.winograd``) in NCHW: cuDNN's Winograd kernels take
  packed NCHW tensors, and an NHWC FP32 convolution runs an implicit GEMM. The published
  table shows it: on the same V100 the same PyTorch ResNet-50 trains at 374 img/s in NCHW
  FP32 and 310 in NHWC FP32; without the term DeepLearningExamples' FP32 ResNet-50 on a
  V100 (dense 3x3 convolutions) was predicted at 0.83-0.86x its measured speed, while its
  ResNeXt-101 and SE-ResNeXt-101 (grouped 3x3 convolutions, which the algorithms do not
  take) came out at 0.94-1.01x (docs/design.md, "Winograd"). 1.0 (no Winograd) for measured profiles: a CPU's
  convolutions (oneDNN) run direct or GEMM-based kernels by default.
* ``tf32_nchw``: what a TF32 convolution on NCHW tensors pays for its layout, as a share of
  the NCHW transposes a 16-bit one is charged (analysis/roofline.py: its input activations read
  and written once more at streaming bandwidth, inside the kernel: no launches of their own).
  0 for the presets: every TF32 CNN row of the published table is NCHW and they fit without it
  (with it, and the other parameters as shipped, their median error goes from 3.9% to 9.5%:
  benchmarks/results/experiment-tf32-nchw.json).
  The second lent H200 (torch 2.11, cuDNN 9.19) measured otherwise, per kernel: its TF32 NCHW
  convolutions took 8.5 ms more per ResNet-50 step at batch 128 than channels_last ones, 0.57 of
  what NCHW cost its bf16 convolutions over the same bytes, and the step ran 1.43x faster in
  channels_last, where dlperf predicts 1.00x (benchmarks/results/h200-kernel-classes.json).
  The model gets it right on the NCHW step only because it predicts that GPU's elementwise
  kernels at half the rate they ran (2.1 against 4.1 TB/s): shipping the term needs a refit of
  the memory side (benchmarks/README.md, "The second lent GPU"). ``--efficiency
  tf32_nchw=0.57`` costs it.
* ``conv_backward``: the share of its convolution fraction a backward convolution (dgrad and
  wgrad, one ``convolution_backward`` kernel) reaches, relative to the forward one. 1.0 for the
  presets (the published table's steps always hold twice the forward FLOPs in backward, so it
  cannot separate the two); ``dlperf probe --sweep`` fits it per machine, where backward
  kernels may run other code: on a 2-core EPYC that emulates bf16, bf16 channels_last
  convolutions ran at 15-21 GFLOP/s forward and 4-9 backward (a fitted share of 0.55), FP32
  ones at a share of 0.92 (benchmarks/results/predict-vs-measure-cpu.json).

* ``depthwise_backward``: the share of ``cuda_core`` that the backward of a depthwise (or
  narrow grouped) convolution reaches in its math. Their forward streams (the ``depthwise``
  memory class); their backward can be math-bound at a low rate instead: on a 2-core EPYC,
  oneDNN's depthwise backward ran at 4-17 GFLOP/s, so that in MobileNetV3's step a
  memory-bound model predicted the 5x5 backward kernels 3-6x too fast while every forward
  was within 0.7-1.7x (benchmarks/results/predict-vs-measure-cpu.json, fourth run). 1.0 for
  the presets (the published table cannot separate it;
  on a GPU the depthwise backward stays memory-bound at this share); ``dlperf probe --sweep``
  fits it per machine.
* ``depthwise_wgrad_wide``: the same share for the weight gradient of a depthwise
  convolution whose window is wider than 3x3 (5x5, 7x7). oneDNN, which runs PyTorch's CPU
  convolutions, has a JIT depthwise kernel for every data gradient but for the weight gradient
  only at 3x3; wider windows fall back to its GEMM-based convolution, one small GEMM per image
  and channel (``ONEDNN_VERBOSE``: ``x64:gemm:jit``). On a 2-core AVX2 EPYC a 5x5 weight
  gradient (96 channels at 14x14, batch 8) took 2.6 ms where the 3x3 one took 0.26 (10x the
  time for 2.8x the FLOPs), while their data gradients took 0.35 and 0.29 ms
  (benchmarks/results/depthwise-cpu.json). With one share for all, MobileNetV3's 5x5 backward
  kernels were predicted at 0.21-0.36x of their measured time and its 3x3 ones at 1.1-2.2x,
  on two hosts (benchmarks/README.md, seventh and eighth CPU runs). None: as
  ``depthwise_backward`` (the presets: cuDNN is other code, and the published table cannot
  separate it); ``dlperf probe --sweep`` fits it on a CPU.

Memory (achieved bytes/s):

* ``memory``: a streaming kernel's fraction of the datasheet DRAM bandwidth (STREAM-like).
* ``sm_bytes_per_clock``: bytes per SM per clock the SMs move to and from DRAM (Little's law:
  outstanding loads per SM / memory latency). Each byte costs the DRAM's time and the SMs'
  time, in series: achieved = 1 / (1 / (memory x datasheet) + 1 / (SMs x clock x this)).
  Without the SM term every memory-bound kernel speeds up with the datasheet bandwidth alone,
  and dlperf said an H200 (4.8 TB/s, the same 132 SMs and clocks as an H100) trains ResNet-50
  1.35x faster than an H100; measured: 1.10x. With a hard cap (min of the two) instead, an
  H200 was no faster than an H100 and a B200 (148 SMs, 8 TB/s) barely faster: held out, the
  published H200 and B200 rows came out at 0.71x and 0.58x of their measured speed; with the
  series form 1.03x and 1.06x (benchmarks/README.md).
* Memory classes, each a fraction of the achieved (streaming) bandwidth above, for the kernels
  that do more per byte than stream it (``memory_class_of``):

  - ``depthwise``: depthwise and narrow grouped convolutions (each output reads a k x k window
    of one channel: short, strided rows, and the weight gradient is a reduction over batch x
    pixels per channel).
  - ``reduction``: reductions whose output is much smaller than their input (sums, means,
    variances, global pooling): one pass over the input.
  - ``norm``: normalisations in the forward pass (batch, group and layer norm: statistics then
    normalise; softmax and log-softmax: max, sum of exponentials, normalise), whose output is
    as large as the input, read again after the statistics. Kept apart from ``reduction``
    because the two differ by 2x and more on a CPU: on a 2-core EPYC, NCHW batch norm's
    per-channel statistics over strided rows moved 10 GB/s of real traffic where a sum
    moved 30 (benchmarks/results/predict-vs-measure-cpu.json; with one class for both, fitted
    mostly on sums, every model's batch norms were predicted 2x too fast).
  - ``reduction_backward``: the backward kernels of both (norm and softmax backward: a
    reduction of (dy, x), then dx from both again).
  - ``channel_norm`` and ``channel_norm_backward``: batch and group norm, forward and backward,
    where they differ from layer norm and softmax (None: as ``norm`` and
    ``reduction_backward``). Their statistics are per channel, over the batch and the pixels
    (strided rows in NCHW), where layer norm's and softmax's are over one contiguous row. On a
    2-core EPYC the two kinds differ by about 2x (batch norm's forward at 23% of the streaming
    rate, layer norm and softmax at 44%: the seventh CPU run's fit); with one ``norm`` class,
    fitted mostly to the sweep's log-softmax kernels, the batch-norm forwards of the sweep and
    of MobileNetV3 were predicted at 0.51-0.63x of their measured time and layer norm's at
    2.1x (benchmarks/README.md, sixth CPU run).
  - ``transcendental``: elementwise kernels that evaluate a transcendental function per element
    (GELU's erf, SiLU/sigmoid, tanh, exp): memory-bound on a GPU (its special-function units
    keep up with DRAM), math-bound on a CPU's vector units.
  - ``gelu_tanh``: the tanh-approximated GELU (GPT-2's, BERT's; forward and backward), where
    it differs from ``transcendental`` (None: as that). The same aten op as the erf GELU, but
    on a CPU other code: in the last rounds of the ninth to twelfth CPU runs the GPT's tanh
    GELU, forward and backward, was predicted at 0.26-0.56 of its step's own
    predicted/measured ratio with the share the sweep's erf GELU fitted; fitted apart, the tanh
    GELU runs at 12-17% of the streaming rate and the other transcendental kernels at 38-50%,
    and the GPT's GELU kernels come out at 0.77-0.85 (fifteenth run, benchmarks/README.md).
  - ``window``: pooling over a sliding window (max/average pooling and their backward).
  - ``window_backward``: the backward of that pooling, where it differs (None: as ``window``).
    On a CPU the two are other code: ATen's max pooling forward compares every window and
    writes the indices, its backward scatters each gradient to the one index saved; in the
    last sweep of the twelfth CPU run the forward took 18 ms and the backward 1.6 ms
    for the same 8 x 128 x 56 x 56 layer, and with one share for both ResNet-18's max-pooling
    forward was predicted at 0.28x of its measured time and its backward at 6.7x
    (benchmarks/results/predict-vs-measure-cpu.json as committed in 7fdd54a, the twelfth run;
    fitted apart: 0.63x and 3.25x, benchmarks/README.md, thirteenth run).

  The published GPU table cannot separate these classes (their kernels are a few percent of
  the rows' steps), so the shipped GPU model keeps them at 1.0 (streaming bandwidth, with the
  two-pass traffic below); ``dlperf probe --sweep`` fits them per machine from generic kernels
  of each class. A lent H200 timed them per kernel in ResNet-50 (torch 2.11, cuDNN 9.19:
  benchmarks/results/h200-kernel-classes.json): against its elementwise kernels' 4.1 TB/s,
  batch norm's real traffic ran at 0.18-0.31 of that rate in bf16 and 0.47-0.94 in FP32
  (NCHW slower), pooling at 0.15-0.43. Put into the fit of the published table, those shares
  break it, whatever the streaming rate: batch norm's alone take the clean rows' median error
  from 6.7% to 16.0% in sample, with the mixed-precision CNN rows at 0.79x their measured
  speed even as the fit streams at its bound; pooling's alone are neutral (6.9%)
  (benchmarks/experiment_kernel_classes.py, results/experiment-kernel-classes.json). The
  published stacks (2019-2023, fp16) ran batch norm faster, relative to streaming, than that
  H200's stack does, so the classes stay at 1.0 and ``dlperf analyze --measure`` shows a
  user's own GPU by class.

Per dtype: ``by_dtype`` maps a kernel's dtype ("bf16", "fp16") to parameters that replace the
ones above for kernels of that dtype. A measured profile needs it when a precision runs other
code than FP32 (a CPU without bf16 units emulates it in oneDNN at a tenth of the FP32 rate, with
its own forward/backward balance); ``dlperf probe --sweep`` fills it from a bf16 pass on such a
CPU. Empty for the presets: on a GPU the precision picks the unit (Tensor Cores or CUDA cores)
and the unit picks the fraction.

Per attention kernel: ``by_attention`` maps a fused attention kernel (ATTENTION_KERNELS:
PyTorch's FlashAttention-2, llm-foundry's 2023 Triton kernel) to its share of the Tensor Core
peak on the device, where one is known; ``efficiency_for(spec, kernel)`` puts it in
``attention`` (``for_attention``), unless the spec sets ``attention`` outright. The A100 and
Hopper presets carry it (below); other GPUs take the generic ``attention`` for both kernels.

Host: ``launch_s`` is the GPU's own gap per kernel; ``host_s`` the CPU's time to issue one
(eager PyTorch), which bounds the step when the GPU's kernels are shorter (roofline.step_time).
``conv_launch_s`` is a fixed time more for every convolution kernel (forward, dgrad, wgrad): a
convolution library's cost per call that does not shrink with the problem. On a CPU we read it
as oneDNN waking its thread team for every convolution, where ATen's small elementwise kernels
stay on one thread; the generic ``launch_s`` is fitted mostly to those. On a 2-core EPYC the
sweep fits 83-126 us per convolution call beside 12-17 us per kernel, and with it (and the
convolutions' own ramp below) MobileNetV3's per-kernel median error on the same measurements
is 26% against 36% without (benchmarks/results/predict-vs-measure-cpu.json, seventh CPU run).
0 for the presets (on a GPU the per-call cost of cuDNN is host time, ``host_s``);
``dlperf probe --sweep`` fits it per machine from small convolutions.

Memory traffic by class: the guide's minimum bytes (every input read once, every output written
once) is what the ``bytes`` and ``intensity`` columns show. Some kernels must read their input
twice, and their time is predicted from the traffic they really move (``TRAFFIC_FACTOR``):
training-mode batch/group normalisation computes the statistics in one pass over x and
normalises in a second; their backward reduces (dy, x) to the two parameter gradients, then
reads both again to form dx; LayerNorm's backward computes dx and, in a second kernel,
gamma/beta gradients from the same (dy, x).

The shipped parameters (``FITTED``) are one set for every NVIDIA GPU, fitted by
``benchmarks/fit_efficiency.py`` to the published measurements in
``benchmarks/validation/published_training.csv``, with leave-one-source-out errors saved in
``benchmarks/results/efficiency-fit.json``. The per-generation differences come from the
device itself (SM count, clock, bandwidth, peaks), not from a constant per GPU. A device file
may override any parameter (``"efficiency": {...}``); a measured profile (``dlperf probe``)
carries its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from dlperf.errors import DlperfError


@dataclass(frozen=True)
class Efficiency:
    tensor_gemm: float = 0.80
    tensor_conv: float = 0.80
    grouped_conv: float = 0.80
    cuda_core: float = 0.80
    memory: float = 0.85
    sm_bytes_per_clock: float | None = None  # None: no SM term (the DRAM alone)
    cuda_core_conv: float | None = None  # None: as cuda_core
    attention: float | None = None  # None: as tensor_gemm
    cuda_core_attention: float | None = None  # None: as cuda_core
    winograd: float = 1.0  # FP32 NCHW 3x3 convolutions' share of their math time (Winograd)
    tf32_nchw: float = 0.0  # a TF32 NCHW convolution's layout cost, a share of fp16's (0: none)
    conv_backward: float = 1.0  # backward convolutions' share of the forward's fraction
    depthwise_backward: float = 1.0  # depthwise backward's share of cuda_core (its math)
    depthwise_wgrad_wide: float | None = None  # None: as depthwise_backward
    depthwise: float = 1.0
    reduction: float = 1.0
    norm: float = 1.0
    reduction_backward: float = 1.0
    channel_norm: float | None = None  # None: as norm
    channel_norm_backward: float | None = None  # None: as reduction_backward
    transcendental: float = 1.0
    window: float = 1.0
    window_backward: float | None = None  # None: as window
    gelu_tanh: float | None = None  # None: as transcendental
    misaligned: float = 0.50  # Tensor Core GEMMs breaking the 16-byte rule (guide 2.2)
    # Small-problem ramp of GEMM-shaped kernels: x m/(m+gemm_m0) x n/(n+gemm_n0) x k/(k+gemm_k0),
    # the M, N, K at which a GEMM runs at half its large-problem rate (0: no ramp). Fitted per
    # machine by `dlperf probe --sweep`; the GPU presets leave it to the tile/wave model.
    gemm_m0: float = 0.0
    gemm_n0: float = 0.0
    gemm_k0: float = 0.0
    # The same ramp for convolutions (their implicit GEMM's M, N, K), where it differs: a CPU's
    # convolutions (oneDNN) are other code than its GEMMs (sgemm), and with one shared ramp
    # the sweep's small convolutions set the ramp of every GEMM. None: as the GEMMs'.
    conv_m0: float | None = None
    conv_n0: float | None = None
    conv_k0: float | None = None
    launch_s: float = 3e-6  # GPU time per kernel that does no useful work
    conv_launch_s: float = 0.0  # more per convolution kernel (see the module docstring)
    # CPU time eager PyTorch spends issuing one kernel (Python, dispatcher, autocast, the CUDA
    # launch). The CPU runs ahead of the GPU through the launch queue, so this only costs time
    # where kernels are shorter than it: small batches, many small ops (see roofline.step_time).
    host_s: float = 0.0
    # dtype -> {parameter: value} for kernels of that dtype (see the module docstring)
    by_dtype: dict = field(default_factory=dict)
    # fused-attention kernel (ATTENTION_KERNELS) -> its share of the Tensor Core peak on this
    # device, where one is known (``for_attention``); the others take ``attention``
    by_attention: dict = field(default_factory=dict)
    # the fused-attention kernel these parameters time (``for_attention``; "": not said): its
    # head-size padding (``kernel_head_dim``) is charged on top of its share
    attention_kernel: str = ""
    source: str = ""

    def for_dtype(self, dtype: str) -> "Efficiency":
        """The parameters for a kernel of ``dtype``: this model with ``by_dtype[dtype]`` over it."""
        overrides = self.by_dtype.get(dtype)
        return replace(self, **overrides) if overrides else self

    def for_attention(self, kernel: str) -> "Efficiency":
        """This model with fused attention at ``kernel``'s share, where this device has one
        (``by_attention``); else unchanged (``attention`` holds the generic share)."""
        if kernel not in ATTENTION_KERNELS:
            raise DlperfError(f"--attention-kernel {kernel!r}: choose "
                              f"{' or '.join(ATTENTION_KERNELS)}")
        share = self.by_attention.get(kernel)
        if share is None or share == self.attention:
            return self if self.attention_kernel == kernel else replace(
                self, attention_kernel=kernel)
        note = f"attention: {kernel} {share}"
        return replace(self, attention=share, attention_kernel=kernel,
                       source=f"{self.source}; {note}" if self.source else note)

    def math(self, math_class: str) -> float:
        return {"tensor-gemm": self.tensor_gemm, "tensor-conv": self.tensor_conv,
                "grouped-conv": self.grouped_conv, "cuda-core": self.cuda_core,
                "attention": self.tensor_gemm if self.attention is None else self.attention,
                "cuda-core-attention": self.cuda_core if self.cuda_core_attention is None
                else self.cuda_core_attention,
                "cuda-core-conv": self.cuda_core if self.cuda_core_conv is None
                else self.cuda_core_conv}.get(math_class, 1.0)

    def ramp(self, gemm, conv: bool = False) -> float:
        """The small-problem factor of a GEMM (per group for grouped convolutions); ``conv``:
        a convolution's implicit GEMM, with the convolution half-rates where they are set."""
        m0, n0, k0 = self.gemm_m0, self.gemm_n0, self.gemm_k0
        if conv:
            m0, n0, k0 = (m0 if self.conv_m0 is None else self.conv_m0,
                          n0 if self.conv_n0 is None else self.conv_n0,
                          k0 if self.conv_k0 is None else self.conv_k0)
        return gemm.m / (gemm.m + m0) * gemm.n / (gemm.n + n0) * gemm.k / (gemm.k + k0)

    def bandwidth(self, spec, memory_class: str = "stream") -> float:
        """Achieved bytes/s of a kernel of ``memory_class`` on ``spec``."""
        bw = spec.mem_bandwidth * self.memory
        if self.sm_bytes_per_clock and spec.tensor_cores:
            bw = combine_bandwidth(bw, sm_cycles_per_s(spec) * self.sm_bytes_per_clock)
        return bw * self.memory_fraction(memory_class)

    def memory_fraction(self, memory_class: str) -> float:
        """The share of streaming bandwidth a kernel of ``memory_class`` reaches."""
        if memory_class == "stream":
            return 1.0
        value = getattr(self, memory_class.replace("-", "_"))
        return self.memory_fraction(CLASS_FALLBACK[memory_class]) if value is None else value

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# A GPU whose datasheet gives no boost clock (B200) is capped as if it ran at this clock, the
# highest of the presets, so its cap is never tighter than a known part's.
FALLBACK_CLOCK_MHZ = 2000.0


def combine_bandwidth(dram, sm_cap):
    """Achieved bandwidth from the DRAM's (``memory`` x datasheet) and the SMs' (SMs x clock x
    ``sm_bytes_per_clock``) limits. Floats or numpy arrays (the fit evaluates whole tables)."""
    return 1.0 / (1.0 / dram + 1.0 / sm_cap)


def sm_cycles_per_s(spec) -> float:
    """SMs x boost clock: the SM-cycles per second the per-SM memory cap multiplies."""
    return spec.sm_count * (spec.boost_clock_mhz or FALLBACK_CLOCK_MHZ) * 1e6


# Ops whose kernels read their inputs twice (see the module docstring); the factor is real
# traffic / minimum traffic when the input and output activations are the same size:
# forward: read x twice + write y = 3 units for a minimum of 2; backward: read (dy, x) twice +
# write dx = 5 units for a minimum of 3.
_TWO_PASS_FORWARD = ("native_batch_norm", "_native_batch_norm_legit",
                     "_native_batch_norm_legit_functional", "cudnn_batch_norm",
                     "native_group_norm")
_CHANNEL_NORM_BACKWARD = ("native_batch_norm_backward", "cudnn_batch_norm_backward",
                          "batch_norm_backward", "native_group_norm_backward")
_TWO_PASS_BACKWARD = (*_CHANNEL_NORM_BACKWARD, "native_layer_norm_backward")
TRAFFIC_FACTOR = {**{op: 1.5 for op in _TWO_PASS_FORWARD},
                  **{op: 5 / 3 for op in _TWO_PASS_BACKWARD}}


def traffic_factor(op: str) -> float:
    return TRAFFIC_FACTOR.get(op, 1.0)


# Memory classes of the non-convolution kernels (depthwise convolutions are classed by the
# roofline, which knows their groups); every op not named here streams.
MEMORY_CLASSES = ("stream", "depthwise", "reduction", "norm", "reduction-backward",
                  "channel-norm", "channel-norm-backward", "transcendental", "window",
                  "window-backward", "gelu-tanh")
# the class whose fraction a class takes while its own is None
CLASS_FALLBACK = {"channel-norm": "norm", "channel-norm-backward": "reduction-backward",
                  "window-backward": "window", "gelu-tanh": "transcendental"}
_CLASS_OF_OP = {
    **{op: "reduction" for op in (
        "mean", "sum", "amax", "amin", "var", "var_mean", "std", "norm", "linalg_vector_norm",
        "_adaptive_avg_pool2d", "fp8_amax", "fp8_weight_amax")},
    **{op: "channel-norm" for op in _TWO_PASS_FORWARD},
    **{op: "channel-norm-backward" for op in _CHANNEL_NORM_BACKWARD},
    # (models/fused.py's RMSNorm: TransformerEngine's one-pass kernels, a row in registers)
    **{op: "norm" for op in ("native_layer_norm", "_softmax", "_log_softmax", "te_rms_norm")},
    **{op: "reduction-backward" for op in (
        "native_layer_norm_backward", "_softmax_backward_data", "_log_softmax_backward_data",
        "_adaptive_avg_pool2d_backward", "te_rms_norm_backward")},
    **{op: "transcendental" for op in (
        "gelu", "gelu_backward", "silu", "silu_backward", "sigmoid", "sigmoid_backward",
        "tanh", "tanh_backward", "exp", "erf", "log", "softplus", "softplus_backward",
        "mish", "mish_backward", "elu", "elu_backward", "log_sigmoid_forward",
        "log_sigmoid_backward", "te_swiglu", "te_swiglu_backward", "te_clamped_geglu",
        "te_clamped_geglu_backward")},
    **{op: "window" for op in (
        "max_pool2d_with_indices", "avg_pool2d", "max_pool3d_with_indices", "avg_pool3d")},
    **{op: "window-backward" for op in (
        "max_pool2d_with_indices_backward", "avg_pool2d_backward",
        "max_pool3d_with_indices_backward", "avg_pool3d_backward")},
}


def memory_class_of(op: str, variant: str = "") -> str:
    """The memory class of a (non-convolution) kernel named ``op`` (see the module docstring);
    ``variant`` as ``Cost.variant`` ("tanh": the tanh-approximated GELU)."""
    cls = _CLASS_OF_OP.get(op, "stream")
    return "gelu-tanh" if variant == "tanh" and cls == "transcendental" else cls


# Fitted by benchmarks/fit_efficiency.py to every clean row of the published table (see the
# module docstring and benchmarks/results/efficiency-fit.json for the held-out errors).
FITTED = Efficiency(tensor_gemm=0.779, tensor_conv=1.0, grouped_conv=1.0, cuda_core=0.804,
                    memory=0.954, sm_bytes_per_clock=15.1, depthwise=0.426, launch_s=0.5e-6,
                    host_s=10e-6, attention=0.325, winograd=0.378,
                    source="benchmarks/results/efficiency-fit.json, attention-fit.json")
# Reading the fit (175 clean rows, V100 to B200: CNNs and transformers in AMP, O2 fp16, TF32
# and FP32; refitted on 2026-12-02 when FP32 3x3 convolutions in NCHW got cuDNN's Winograd
# algorithms, ``winograd``): the convolution classes sit at their bound of 1.0, i.e. after the
# tile model's own losses (tile, wave, and the per-tile intrinsic efficiency of gemm.py,
# 0.70-1.00) cuDNN's convolutions lose nothing more; cuBLAS GEMMs keep 77.9%, FP32 on the CUDA
# cores 80.4%, and a Winograd convolution 37.8% of its implicit-GEMM math time (2.6x faster,
# between F(2x2, 3x3)'s 2.25x and F(4x4, 3x3)'s 4x fewer multiplies; the folds that leave one
# source out give 0.34-0.49). Memory: the DRAM term is 95.4% of the datasheet and the SM term
# 15.1 B per SM per clock, so a streaming kernel achieves 1.77 TB/s on an H100 (3.35
# datasheet; SM term 3.95), 2.12 TB/s on an H200 (1.20x the H100 from 1.43x the DRAM), 1.05
# TB/s on an A100 80 GB, 0.59 TB/s on a V100 (65% of its 900 GB/s), 2.82 TB/s on a B200.
# launch_s sits at its lower bound (0.5 us): the table's large-batch rows cannot see a
# per-kernel GPU gap; steps of many small kernels are bounded by host_s instead, which is not
# fitted (no row is host-bound): 10 us is our estimate of an eager PyTorch op's CPU cost
# (Python, dispatcher, autocast, cudaLaunchKernel) on a server CPU. In-sample 6.0% over the
# clean rows, held out by source 8.0% (the fit before the Winograd term, on the same rows:
# 6.6% and 8.5%).

# attention (0.325 of the Tensor Core peak): fitted by benchmarks/fit_attention.py to MosaicML's
# MPT decoders on 8 A100s at 512 to 65,536 tokens (the published table has no fused attention),
# with everything else as above and the runs costed as they computed (FSDP's mixed precision,
# --precision fsdp: bf16 parameters without autocast; flash-attn's fused loss; Composer's two
# cross-entropy train metrics a micro-batch, --train-metrics 2); each model size held out in
# turn gives 0.323-0.327, and the 58 rows' median error is 18.9% as a GEMM (0.779; a
# 65,536-token step ~2x too fast) and 2.8% held out (those of 8,192 tokens and more, where
# attention dominates, 2.6%; results/attention-fit.json). Without the train metrics (until
# 2026-12-04) the fit was 0.313 at 3.0% held out, and MPT-125M's rows came out 1.01x at 65,536
# tokens rising to 1.20x at 512, where the metrics' FP32 passes over its 50,368-wide logits are
# a fifth of its step; with them and 0.325, 0.95-1.02x. Costed as autocast over fp32 weights,
# as until 2026-12-02, the fit was 0.351 at 6.5% held out. 0.325 is what flash attention
# reached in that stack (2023); the FlashAttention-2 paper (arXiv 2307.08691) reports 25-40%
# of the A100's peak for FlashAttention and 50-73% (forward) for FlashAttention-2: the A100
# presets time FlashAttention-2 at its own share (``--attention-kernel flash2``, below), and
# 0.325 is the generic share, the Triton kernel's ("triton-2023").

# Hopper (the H100, H200 and GH200 presets carry both, the H200 with its own GEMM share,
# H200_TENSOR_GEMM below: hardware/specs.py): cuBLAS's GEMMs at
# 0.578 of the Tensor Core peak and fused attention at 0.187, fitted together by
# ``benchmarks/fit_attention.py --device h100-sxm --with-gemm`` to the 70 MPT rows on H100s of
# the same llm-foundry tables (512 to 65,536 tokens, 8 to 512 GPUs, costed as they computed:
# --precision fsdp). Each model size held out gives 0.573-0.583 and 0.184-0.189, and the rows'
# median error is 3.8% held out (results/attention-fit-h100-sxm.json; 41% with attention as a
# GEMM and the A100's GEMM share). Refitted with Composer's train metrics in the step
# (2026-12-04, results/attention-refit-metrics-h100-gemm.json): 0.585 and 0.189 (folds
# 0.580-0.592 and 0.187-0.191), 3.9% held out; not shipped, a 1% move the rows cannot tell from
# these values (4.3% with them).
# - Why a GEMM share of its own: the single-GPU table's Hopper rows (BERT, ResNet-50) spend
#   70-77% of their predicted step in memory-bound kernels and pin no GEMM share; the MPT rows
#   at 512-2,048 tokens are GEMM-bound and, with the table's 0.779 and the attention share that
#   fitted best (0.143), came out 1.08-1.42x too fast while the longest sequences came out
#   0.80-0.87x (results/experiment-fsdp-attention-fit-h100.json), where the A100 rows of the
#   same script and container fit. The same joint fit on the A100 rows gives 0.762 (folds
#   0.755-0.780), within 2% of 0.779, with the train metrics in their steps (0.737, within
#   5%, without): the A100 needs no share of its own (results/attention-refit-metrics-a100-
#   gemm.json, attention-fit-gemm.json).
# - What it holds: more than cuBLAS's kernels lose. Short single-GPU GEMM benchmarks reach more
#   of the H100's peak: 794.5 TFLOP/s (80.3%) at the best shape against 271.2 (86.9%) on an
#   A100 SXM (stas00/ml-engineering, "Maximum Achievable Matmul FLOPS", torch 2.6-2.7), up to
#   808 TFLOP/s in XLA's measured sm_90 GEMM table (xla/service/gpu/model/
#   matmul_interpolator_data.h). 0.578 also holds what a 700 W part loses over hours of dense
#   GEMMs in a full node (a power-limited clock) and what FSDP's overlapped NCCL kernels take
#   from the SMs (one per channel); step 0b of scripts/device_check.sh measures those two on a
#   lent GPU. In FLOP/s the H100's GEMMs run 2.35x the A100's (572 against 243 TFLOP/s).
# - Fused attention: the same stack ran its A100 rows at 0.325 of that peak; in FLOP/s the H100
#   is 1.82x the A100 (185 against 101 TFLOP/s) where its Tensor Core peak is 3.17x. The kernels
#   are written for Ampere's warp-level MMA instructions, which a Hopper SM runs at a fraction of
#   the peak its warpgroup MMA (wgmma) reaches: the FlashAttention-3 paper (arXiv 2407.08608)
#   finds FlashAttention-2 at 35% of the H100's peak in the forward, against 50-73% of the
#   A100's in the FlashAttention-2 paper.
# Both are the 2023 stack's (PyTorch 2.1, CUDA 12.1, triton attention); a stack with Hopper
# kernels (FlashAttention-3, cuDNN's fused attention, a newer cuBLAS) runs faster: `analyze
# --efficiency tensor_gemm=... --efficiency attention=...` or a device file's "efficiency"
# table sets them. Before this fit (until
# 2026-12-02) the Hopper presets carried attention 0.175 alone, fitted with the rows costed as
# autocast over fp32 weights, whose cast kernels stood in for the GEMMs' missing time.
HOPPER_ATTENTION = 0.187
HOPPER_TENSOR_GEMM = 0.578
# The H200's own GEMM share (issue #14, 2026-12-04): what a lent H200 sustained over 20 s of an
# MPT-13B block's GEMMs alone (4,096 tokens, d 5,120, bf16, torch 2.11: 670 TFLOP/s at a clock
# held near 1,500 MHz, 0.90 of the single-GPU table's 0.779; step 0b of
# scripts/device_check.sh, benchmarks/results/device-h200-2026-12-04/analyses.json), and what
# every published H200 run fits, none of them fitted to it (benchmarks/
# experiment_hopper_gemm.py, results/experiment-hopper-gemm.json, at 0.578 -> 0.699):
# KempnerForge's compiled Llama 3 8B FSDP2 on 2 and 4 H200s 0.82 -> 0.95, Trainy's torchtitan
# Llama 3.1 8B (float8, compiled) on 32 and 64 H200s 0.88 -> 0.95, Lambda's single-H200 BERT
# 0.86-0.97 -> 0.92-1.03 (its ResNet-50 rows do not move). Every H200 run is on a 2024 or later
# stack (the part shipped in 2024), while the H100 share above is the 2023-2024 runs' (MosaicML,
# IBM, torchtitan: 0.578-0.64 in the same experiment, 0.699 too fast by 8-16%). The two parts
# share the GH100's SMs and clocks: the difference is the stacks the rows ran (and the H200's
# memory), which one part's preset cannot separate; `--efficiency tensor_gemm=` sets a stack's
# own value on either. The GH200 keeps the H100's: Lambda's GH200 BERT rows fit 0.578.
H200_TENSOR_GEMM = 0.699
# The V100's own shares (issue #14, 2026-12-05): cuBLAS's Tensor Core GEMMs at 0.604 of the
# fp16 peak and FP32 on the CUDA cores (GEMMs and convolutions) at 0.843 of the FP32 peak,
# fitted to the single-GPU table's 30 V100 rows with every other parameter as FITTED
# (``benchmarks/fit_efficiency.py --own-share v100-sxm2,v100-sxm2-16gb,v100-pcie --fix ...``,
# results/efficiency-fit-volta.json; each source held out in turn gives 0.543-0.644 and
# 0.831-0.868).
# - Why: the fitted 0.779 is a compromise over V100 to B200 in which the V100's few BERT rows
#   lose. BERT in fp16 on V100s came out 1.10-1.28x too fast in three tables of two publishers
#   (NVIDIA's SQuAD READMEs of 2020 and 2021 and its 2020 pre-training tables, Lambda's), and
#   the FP32 CNNs 0.95x too slow (results/experiment-volta-gemm.json, -cuda-core.json).
# - Held out: the scaling table's 110 V100 rows were in no fit (results/validation-scaling.json).
#   Per GPU, NVIDIA's 28 BERT pre-training and SQuAD runs of 2020 went from 1.20x to 1.03x
#   (median error 20.1% -> 6.8%), and all V100 rows from 8.3% to 5.6% (SXM2 32 GB, 96 rows) and
#   15.6% to 5.2% (16 GB, 14 rows). In the single-GPU table the V100 rows' worst error went
#   from 22.0% to 12.4% (results/validation-published.json).
# - What it holds: a V100's cuBLAS reached 83 TFLOP/s in mixed precision at its best shape,
#   0.66 of the 125 peak (Markidis et al., "NVIDIA Tensor Core Programmability, Performance &
#   Precision", arXiv 1803.04014, 2018); sustained training adds a 300 W part's clock under
#   load. The A100 fits its own rows at 0.762, within 2% of 0.779 (above): the gap is Volta's.
# - The exception: NVIDIA's 2022 BERT pre-training stack (NVFuser, fused LAMB, flag
#   jit-fused) ran its V100 GEMMs near 0.7; such a stack sets its own with
#   `--efficiency tensor_gemm=0.7`.
# A joint refit of every parameter with the V100's two shares free (results/efficiency-fit-
# volta-joint.json: 0.599 and 0.844 for the V100) moves the others (tensor_gemm 0.794,
# cuda_core 0.670) and is not shipped: held out by source it is no better (8.1% against the
# shipped fit's 8.0%), the fold without Lambda's 95 rows running to the bounds (cuda_core 0.3,
# tensor_gemm 1.0).
VOLTA_TENSOR_GEMM = 0.604
VOLTA_CUDA_CORE = 0.843
# GeForce's own GEMM share (issue #14, 2026-12-05): cuBLAS's Tensor Core GEMMs on the GeForce
# RTX 3090 and 4090 at 1.0 of the Tensor Core peak with FP32 accumulation (the half rate these
# cards run it at: 71 and 165 TFLOP/s dense; specs.py), fitted to the single-GPU table's 58 rows
# on them with every other parameter as FITTED, the CUDA-core share held at FITTED's
# (``benchmarks/fit_efficiency.py --own-share rtx3090,rtx4090 --fix own_cuda_core=0.804 --fix
# ...``, results/efficiency-fit-geforce.json; it sits at the search's bound, and each source
# held out in turn gives 0.995-1.0). The CUDA-core share is held because the rows cannot see
# it: fitted free it ran to its bound of 0.3 with the same errors
# (results/efficiency-fit-experiment-geforce.json).
# - Why: at the shared 0.779 every GEMM-bound run on these two cards came out too slow, in two
#   publishers' tables: timm's ViTs and Swins on a 3090 (PyTorch 1.12) 0.78-0.96x, Lambda's
#   BERT fine-tuning on a 3090 and a 4090 (2022-24 containers) 0.87-0.95x, where their CNN
#   rows (convolutions, another share) fit. At 1.0 those rows are 0.91-1.07x, and the 175
#   fitted rows' median error goes from 6.4% to 5.1% (results/validation-published.json); no
#   other preset moves.
# - What it holds: the peaks are the datasheets' at the rated boost clock (1,695 and 2,520
#   MHz), and GeForce boards run above it while power allows; torch's FP16 GEMM of 2 x 4,096 x
#   4,096 by 4,096 x 4,096 ran at 167.0 TFLOP/s on an RTX 4090 (aredden/torch-cublas-hgemm,
#   README), 1.01 of the 165.2 peak. PyTorch asks cuBLAS for FP32 accumulation whatever
#   ``allow_fp16_reduced_precision_reduction`` says (pytorch/pytorch#123157), so the half rate
#   is the one to scale. The workstation GA102 and AD102 parts (RTX A6000, A40, RTX 6000 Ada,
#   FP32 accumulation at the full rate and 300 W) keep the shared share: the same fit with
#   the A6000 and A40 in the family took the A6000's rows from 5.7% to 12.2%
#   (results/efficiency-fit-experiment-ga102.json).
# - Held out: Lambda's 2020-21 logs of the same BERT script on a 3090 (flagged for their
#   older stack, in no fit) ran 7-10% slower than its 2022 runs at their batch sizes, so at 1.0
#   they sit near the other GPUs' old-stack rows rather than below them.
GEFORCE_TENSOR_GEMM = 1.0

# Fused attention by kernel (``--attention-kernel``, ``AnalysisConfig.attention_kernel``): the
# shares above are MosaicML's 2023 stack's, whose attention was llm-foundry's Triton flash
# kernel ("triton-2023"). PyTorch's F.scaled_dot_product_attention runs FlashAttention-2 on
# Ampere and Hopper since PyTorch 2.2 (2024-01; "flash2": what an eager PyTorch step called
# until cuDNN's came first on Hopper, ``sdpa_kernel`` below, and what torchtitan's and IBM's
# fms-fsdp published Llama runs ran):
# - A100: 0.553 of the Tensor Core peak, fitted to the 12 eager Llama FSDP rows on A100s
#   (torchtitan's 8 on 64 GPUs, IBM's 4 on 128: 7B-70B, 4,096-8,192 tokens) with everything
#   else as shipped, each row held out in turn giving 0.512-0.587; the rows' median error 6.1%
#   -> 2.2% held out (benchmarks/experiment_llama_memory.py --param attention,
#   results/experiment-llama-attention.json). Their errors had followed the attention's share
#   of the step (Llama 3 8B at 8,192 tokens, 19-22% attention: 0.87-0.89x; Llama 2 70B, 6-8%:
#   1.00-1.08x), which a memory rate does not. The FlashAttention-2 paper (arXiv 2307.08691)
#   reports 50-73% of the A100's peak forward; 0.553 is forward and backward together.
# - Hopper: 0.262, PyTorch's FlashAttention-2 forward and backward as two lent H200s timed it
#   (step 0c of scripts/device_check.sh: causal BF16, head size 128, 4,096 tokens, torch 2.11;
#   0.262 on both, benchmarks/results/device-h200-2026-12-04*/analyses.json, "sdpa_share").
#   Its forward alone ran at 0.299 there, near the 0.322 the FlashAttention-3 paper (Shah et
#   al., arXiv 2407.08608, figure 5) timed for it on an H100 SXM5 (319 TFLOP/s of 989.4; "35%
#   utilization", its abstract says: written for Ampere's MMA instructions, it does not use
#   Hopper's warpgroup MMA); the backward runs slower, and a training step runs both, so the
#   presets carry the measured pair (until 2026-12-04 they carried the paper's 0.322). Scored
#   on the 24 published Hopper decoder runs that ran it (benchmarks/experiment_flash2_hopper.py,
#   results/experiment-flash2-hopper.json) the median error went from 5.5% to 3.7%, and
#   torchtitan's compiled Llama 3 8B on 128 H100s from 1.106 to 1.064; Trainy's two H200 runs
#   (torch 2.8, float8, compiled) from 0.918/0.932 to 0.869/0.883. IBM's 4 rows on 96 H100s
#   alone fit 0.406 (held out 0.388-0.433) with the 2023 stack's GEMM share beside it: they
#   cannot separate the two, so the measured kernel's figure is shipped and the rows are its
#   check.
# - "cudnn": cuDNN's fused attention (``sdpa_kernel(SDPBackend.CUDNN_ATTENTION)``, and what
#   PyTorch's SDPA picked by default on the lent H200 with torch 2.11 and cuDNN 9.19: 1.98 ms
#   against cuDNN's 2.05 and FlashAttention-2's 3.71). Hopper: 0.475 of the peak, forward and
#   backward, causal BF16 at head size 128 and 4,096 tokens, timed by step 0c of
#   scripts/device_check.sh on that H200 (benchmarks/results/device-h200-2026-12-04/
#   analyses.json, "sdpa_share"; FlashAttention-2 there: 0.262 forward and backward, the
#   shipped share, and 0.299 forward). 1.81x FlashAttention-2, inside the 1.7-2.3x that huggingface/transformers#48163 measured for
#   training shapes on Hopper (where it found cuDNN slower than FlashAttention-2 on Ampere and
#   Blackwell: no share for them here). PyTorch 2.5.1 made the backend opt-in
#   (pytorch/pytorch#138522); the stacks the validation rows ran called FlashAttention-2
#   unless their row says cudnn.
# Other GPUs have no calibrated share for these: they take ``attention`` (0.325).
ATTENTION_KERNELS = ("flash2", "triton-2023", "cudnn")
# The kernel of a stack that does not say (a validation row's blank, ``AnalysisConfig``'s
# default): PyTorch's SDPA before it put cuDNN first.
DEFAULT_ATTENTION_KERNEL = "flash2"
# Which kernel PyTorch's own SDPA picks (``sdpa_kernel``, what `dlperf analyze` assumes when
# neither --attention-kernel nor the model's preset says): PyTorch 2.9 meant to put cuDNN's
# fused attention first on datacenter Hopper and Blackwell (pytorch/pytorch#162073), but its
# wheels, built against cuDNN 9.8, did not (pytorch/pytorch#165801); since 2.10 the backend
# order puts it first on those GPUs (sm90, sm100) when the cuDNN it runs is newer than 9.15.0
# (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, check_prefer_cudnn_attention: 9.15.1
# fixed sequence lengths that are not multiples of 128, pytorch/pytorch#169849), unless
# TORCH_CUDNN_SDPA_DEPRIORITIZED is set; the wheels cross that threshold at 2.11, whose bundled
# cuDNN is 9.19 (huggingface/transformers#48163, where this was found on 2026-08-31). The lent
# H200 saw it: torch 2.11's SDPA ran causal attention in 1.98 ms, cuDNN's alone in 2.05 and
# FlashAttention-2's in 3.71 (benchmarks/results/device-h200-2026-12-04/analyses.json).
# Its later form takes sm103 (Blackwell Ultra: B300, GB300) with sm100 ("!minor || minor == 3").
SDPA_CUDNN_FIRST_DEVICES = frozenset({"h100-sxm", "h100-pcie", "h200", "gh200", "b200",
                                     "gb200", "b300", "gb300"})
SDPA_CUDNN_MIN_VERSION = 91501  # cuDNN 9.15.1 (torch.backends.cudnn.version() numbering)
SDPA_CUDNN_FIRST_TORCH = (2, 11)  # the first wheels whose bundled cuDNN passes it


def sdpa_kernel(spec, torch_version: str | None = None, cudnn_version: int | None = None,
                environ=None) -> tuple[str, str]:
    """(kernel, why): the fused attention PyTorch's scaled_dot_product_attention runs on
    ``spec`` with the PyTorch installed here (or the versions given): "cudnn" where it puts
    cuDNN first (see above), else "flash2". A CPU-only PyTorch has no cuDNN to ask: its
    version decides, as its CUDA wheels of the same version would."""
    import os

    import torch

    environ = os.environ if environ is None else environ
    torch_version = torch_version or torch.__version__
    if cudnn_version is None and torch_version == torch.__version__:
        cudnn_version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() \
            else None
    stack = f"torch {torch_version.split('+')[0]}" + (
        f" with cuDNN {cudnn_version // 10000}.{cudnn_version // 100 % 100}.{cudnn_version % 100}"
        if cudnn_version else "")
    if spec.name not in SDPA_CUDNN_FIRST_DEVICES:
        return "flash2", (f"{stack}: FlashAttention-2 on {spec.name} (cuDNN first only on "
                          "sm90/sm100)")
    # c10::utils::check_env: 1/on/yes/true/y set it, 0/off/no/false/n and the rest do not
    if environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "").strip().upper() in (
            "1", "ON", "YES", "TRUE", "Y"):
        return "flash2", f"{stack}: TORCH_CUDNN_SDPA_DEPRIORITIZED is set"
    if cudnn_version is not None:
        first = cudnn_version >= SDPA_CUDNN_MIN_VERSION
    else:
        first = _version_tuple(torch_version) >= SDPA_CUDNN_FIRST_TORCH
    if first:
        return "cudnn", f"{stack} runs cuDNN's fused attention first on {spec.name}"
    return "flash2", f"{stack} runs FlashAttention-2 first on {spec.name}"


def _version_tuple(version: str) -> tuple[int, ...]:
    """(major, minor) of a version string such as "2.14.1+cu130" or "2.8.0a0"."""
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)
A100_FLASH2_ATTENTION = 0.553
HOPPER_FLASH2_ATTENTION = 0.262  # two lent H200s, forward + backward (the paper: 0.322 fwd)
HOPPER_CUDNN_ATTENTION = 0.475
# Strict-FP32 convolutions on Hopper (no TF32: cuDNN on the CUDA cores), as the second lent H200
# ran them (torch 2.11, cuDNN 9.19; benchmarks/results/h200-kernel-classes.json, measured per
# kernel): in channels_last, where no Winograd algorithm runs, ResNet-50's convolutions took
# 112.1 ms at batch 128 against 61.3 predicted at the fitted CUDA-core share (0.804, fitted to
# V100 rows), i.e. 0.804 x 61.3 / 112.1 = 0.44 of the FP32 peak, which on Hopper counts two
# FP32 lanes per core that an implicit-GEMM convolution rarely fills (a large sgemm reached
# 0.76 of it in `dlperf probe` there). In NCHW they took 110.6 ms: Winograd's forward gain
# (6.6 ms) was lost again in the backward (5.1 ms), so Hopper carries no Winograd share
# (``winograd`` 1.0; the V100's published NCHW/NHWC rows keep FITTED's 0.378).
HOPPER_CUDA_CORE_CONV = 0.44

# A measured profile (dlperf probe) already holds achieved rates: nothing left to discount.
MEASURED = Efficiency(tensor_gemm=1.0, tensor_conv=1.0, grouped_conv=1.0, cuda_core=1.0,
                      memory=1.0, source="measured by dlperf probe")

# Every parameter named in the table above, what a device file's "efficiency" may set.
PARAMETERS = tuple(f.name for f in fields(Efficiency)
                   if f.name not in ("source", "attention_kernel"))
# Parameters whose None means "as another one" (see each field): a device file may set them so.
NULLABLE = tuple(f.name for f in fields(Efficiency) if f.default is None)
# The dtypes a kernel's math can have (``Cost.dtype``), what ``by_dtype`` may name.
KERNEL_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")
FRACTIONS = ("tensor_gemm", "tensor_conv", "grouped_conv", "cuda_core", "cuda_core_conv",
             "attention", "cuda_core_attention", "winograd", "conv_backward", "depthwise_backward",
             "depthwise_wgrad_wide",
             "memory", "depthwise", "reduction", "norm", "reduction_backward",
             "channel_norm", "channel_norm_backward",
             "transcendental", "gelu_tanh", "window", "window_backward", "misaligned",
             "tf32_nchw")


def efficiency_for(spec, attention_kernel: str = DEFAULT_ATTENTION_KERNEL,
                   fitted: dict | None = None) -> Efficiency:
    """The efficiency model for ``spec``: measured profiles carry achieved rates; datasheet
    presets use the fitted parameters; a spec's own ``efficiency`` entries override either (the
    Hopper presets' GEMM and attention shares, a device file's table), and the source says
    which. Fused attention runs at ``attention_kernel``'s share where the device has one
    (ATTENTION_KERNELS), unless its ``efficiency`` sets ``attention`` itself (a device file,
    ``--efficiency attention=...``): that one is the user's. ``fitted``: parameters that
    replace FITTED's for this call, as an edit of FITTED would (an experiment on the shared
    parameters: the validation scripts' ``--fitted``); a preset's own entries still win."""
    base = MEASURED if spec.measured else FITTED
    if fitted and not spec.measured:
        base = replace(FITTED, **fitted, source=f"FITTED edited: {_listed(fitted)}")
    if spec.launch_overhead_s is not None:
        base = replace(base, launch_s=spec.launch_overhead_s)
    overrides = getattr(spec, "efficiency", None) or {}
    if overrides:
        own = f"{spec.name}'s own {', '.join(sorted(overrides))}"
        base = replace(base, **overrides,
                       source=f"{base.source}; {own}" if base.source else own)
    if "attention" in overrides:  # the user's share, for the kernel they run
        return replace(base, attention_kernel=attention_kernel)
    return base.for_attention(attention_kernel)


def _listed(values: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items()))


# The head size FlashAttention-2 computes with: its kernels are compiled for head sizes 32, 64,
# 96, 128, 160, 192 and 256, and a head size between them runs the next one up, padded
# (HEADDIM_SWITCH in csrc/flash_attn/src/static_switch.h, and head_size_rounded in
# flash_api.cpp: a multiple of 32 up to 192, else 256; some releases also built 224, which
# this charges as 256 for heads of 193-224, at most 14% over). PyTorch's SDPA vendors the same
# kernels (aten/src/ATen/native/transformers/cuda/flash_attn). A head of 80 (Phi-2, Stable
# Diffusion's 640-channel blocks) computes as 96, one of 112 as 128: 1.2x and 1.14x the math.
# Not charged: cuDNN's fused attention (dlperf has no figure for what a head size costs it).
FLASH2_HEAD_DIMS = (32, 64, 96, 128, 160, 192, 256)

# llm-foundry's 2023 Triton kernel ("triton-2023", llmfoundry/models/layers/flash_attn_triton.py
# at b2a43a147, flash-attn's flash_attn_triton.py for triton 2.0.0.dev20221202) computes a head
# of d in blocks of BLOCK_HEADDIM = max(next_power_of_2(d), 16) columns, and runs heads up to 128
# (``assert d <= 128``): a head of 80 computes as 128 (1.6x the math), one of 40 as 64. Charged
# as geometry only: a padded head also takes the kernel's masked path (EVEN_HEADDIM false: masked
# loads, and up to four more barriers an iteration of its backward's inner loop), whose own cost
# no published run shows (every MPT run in the validation tables has heads of 64 or 128: the
# benchmark's MPT-30B has 56 heads of 128, scripts/train/yamls/pretrain/mpt-30b.yaml), so a
# padded head may run slower than this says.
TRITON_2023_MAX_HEAD = 128


def kernel_head_dim(kernel: str, head_dim: int) -> int:
    """The head size ``kernel`` computes a head of ``head_dim`` with (padded up to one its
    kernels are built for); ``head_dim`` itself where it pads nothing or cannot run it."""
    if kernel == "flash2" and 0 < head_dim <= FLASH2_HEAD_DIMS[-1]:
        return next(d for d in FLASH2_HEAD_DIMS if d >= head_dim)
    if kernel == "triton-2023" and 0 < head_dim <= TRITON_2023_MAX_HEAD:
        return max(16, 1 << (head_dim - 1).bit_length())
    return head_dim


def kernel_head_sizes(kernel: str) -> str:
    """The head sizes ``kernel`` is built for, in words (the head-padding finding's advice)."""
    if kernel == "triton-2023":
        return f"powers of two from 16 to {TRITON_2023_MAX_HEAD}"
    return ", ".join(str(d) for d in FLASH2_HEAD_DIMS)


def parse_overrides(items: list[str], flag: str = "--efficiency") -> dict:
    """``NAME=VALUE`` flags (`dlperf analyze --efficiency`, the validation scripts' ``--fitted``
    and ``--efficiency``) as a device file's "efficiency" table, checked the same way
    (``check_overrides``: known names, fractions in (0, 1]), or one line naming ``flag``."""
    table = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or not name.strip() or number is None:
            raise DlperfError(f"{flag} {item!r}: give NAME=VALUE with a number, e.g. "
                              f"{flag} tensor_gemm=0.779")
        table[name.strip()] = number
    return check_overrides(table, flag) if table else {}


def check_overrides(overrides, origin: str) -> dict:
    """A device file's "efficiency" table: known names, fractions in (0, 1] (per-SM bytes and
    launch seconds: positive), or one line saying what is wrong."""
    if not isinstance(overrides, dict):
        raise DlperfError(f"{origin}: 'efficiency' must be a table of "
                          f"{', '.join(PARAMETERS)}")
    for key, value in overrides.items():
        if key == "by_dtype":
            _check_by_dtype(value, origin)
            continue
        if key == "by_attention":
            _check_by_attention(value, origin)
            continue
        if key not in PARAMETERS:
            raise DlperfError(f"{origin}: unknown efficiency parameter {key!r}; "
                              f"use one of {', '.join(PARAMETERS)}")
        if key in NULLABLE and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                value > 0 or (key in ("host_s", "conv_launch_s", "tf32_nchw") and value == 0)):
            raise DlperfError(f"{origin}: efficiency {key} must be a positive number, "
                              f"got {value!r}")
        if key in FRACTIONS and value > 3:
            raise DlperfError(f"{origin}: efficiency {key} is a fraction of peak; "
                              f"give a number in (0, 1] (a measured profile may reach up to 3: "
                              f"its peaks are the probe's best shapes), got {value!r}")
        if key in ("launch_s", "host_s", "conv_launch_s") and value > 1e-2:
            raise DlperfError(f"{origin}: efficiency {key} is seconds per kernel; "
                              f"{value!r} is not plausible (microseconds: e.g. 3e-6)")
    return dict(overrides)


def _check_by_attention(table, origin: str) -> None:
    """``by_attention``: {kernel: share of the Tensor Core peak}, each in (0, 1]."""
    if not isinstance(table, dict):
        raise DlperfError(f"{origin}: efficiency by_attention must be a table of kernel -> "
                          f"share, e.g. {{\"flash2\": 0.55}}")
    for kernel, share in table.items():
        if kernel not in ATTENTION_KERNELS:
            raise DlperfError(f"{origin}: efficiency by_attention has unknown kernel "
                              f"{kernel!r}; use one of {', '.join(ATTENTION_KERNELS)}")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise DlperfError(f"{origin}: efficiency by_attention[{kernel!r}] is a share of "
                              f"the Tensor Core peak in (0, 1], got {share!r}")


def _check_by_dtype(table, origin: str) -> None:
    """``by_dtype``: {dtype: {parameter: value}}, each inner table checked as above."""
    if not isinstance(table, dict):
        raise DlperfError(f"{origin}: efficiency by_dtype must be a table of dtype -> parameters, "
                          f"e.g. {{\"bf16\": {{\"cuda_core_conv\": 0.6}}}}")
    for dtype, inner in table.items():
        if dtype not in KERNEL_DTYPES:
            raise DlperfError(f"{origin}: efficiency by_dtype has unknown dtype {dtype!r}; "
                              f"use one of {', '.join(KERNEL_DTYPES)}")
        for nested in ("by_dtype", "by_attention"):
            if isinstance(inner, dict) and nested in inner:
                raise DlperfError(f"{origin}: efficiency by_dtype[{dtype!r}] cannot nest "
                                  f"{nested}")
        check_overrides(inner, f"{origin}: efficiency by_dtype[{dtype!r}]")
