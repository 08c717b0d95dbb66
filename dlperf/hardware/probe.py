"""Measure this machine's ceilings: matmul and convolution FLOP/s per dtype, copy bandwidth.

The result is a measured DeviceSpec (efficiency already included, so the roofline uses it with
efficiency 1.0) that ``dlperf analyze --device PATH`` accepts. On CPUs oneDNN's
channels_last convolutions can beat the matmul rate (measured on this project's machines), so the probe keeps the best of several
shapes and kinds per dtype; otherwise predictions inherit the probe's error.

Timing: warm-up runs first, then the median of repeated runs, with CUDA
events on a GPU.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dlperf.dtypes import STORAGE
from dlperf.errors import DlperfError
from dlperf.hardware.specs import DeviceSpec

DTYPES = {u: STORAGE[u] for u in ("fp32", "bf16", "fp16")}  # the units a probe measures
# the longest single run a CPU probe starts for a larger matmul size (see probe())
MAX_CPU_RUN_S = 0.25


@dataclass(frozen=True)
class ProbeConfig:
    device: str = "auto"  # auto | cpu | cuda
    quick: bool = False  # small sizes, few repeats (tests, `analyze --device cpu`)
    repeats: int = 5
    warmup: int = 2


@dataclass
class Measurement:
    kind: str  # matmul | conv | copy | launch | host (CPU issue time per kernel, GPU only)
    unit: str  # math unit (fp32, tf32, bf16 ...) or "bytes" / "seconds"
    shape: str
    value: float  # FLOP/s, bytes/s or seconds
    times_s: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "unit": self.unit, "shape": self.shape, "value": self.value,
                "median_s": statistics.median(self.times_s) if self.times_s else None}


def _timer(device: torch.device):
    if device.type == "cuda":
        def run(fn, repeats, warmup):
            for _ in range(warmup):
                fn()
            torch.cuda.synchronize(device)
            out = []
            for _ in range(repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                out.append(start.elapsed_time(end) / 1e3)
            return out
    else:
        def run(fn, repeats, warmup):
            for _ in range(warmup):
                fn()
            out = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
            return out
    return run


def _matmul(n: int, dtype, device, unit, cfg, timer) -> Measurement:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    times = timer(lambda: torch.mm(a, b), cfg.repeats, cfg.warmup)
    return Measurement("matmul", unit, f"{n}x{n}x{n}", 2 * n**3 / statistics.median(times), times)


def _fp8_matmul(n: int, device, cfg, timer) -> Measurement | None:
    if not hasattr(torch, "_scaled_mm") or torch.cuda.get_device_capability(device) < (8, 9):
        return None
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major B
    one = torch.ones((), device=device)
    try:
        times = timer(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                               out_dtype=torch.bfloat16), cfg.repeats, cfg.warmup)
    except (RuntimeError, TypeError):  # a private API: any torch may change or refuse it
        return None
    return Measurement("matmul", "fp8", f"{n}x{n}x{n}", 2 * n**3 / statistics.median(times), times)


def _conv(batch, channels, size, dtype, device, unit, cfg, timer) -> Measurement:
    """A ResNet-style 3x3 convolution in channels_last (the fast layout on both CPU and GPU)."""
    x = torch.randn(batch, channels, size, size, device=device).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(channels, channels, 3, 3, device=device).to(dtype)
    w = w.contiguous(memory_format=torch.channels_last)
    flops = 2 * batch * size * size * channels * channels * 9
    with torch.no_grad():
        times = timer(lambda: torch.nn.functional.conv2d(x, w, padding=1), cfg.repeats, cfg.warmup)
    return Measurement("conv", unit, f"N{batch} C{channels} {size}x{size} 3x3",
                       flops / statistics.median(times), times)


def _copy(nbytes: int, device, cfg, timer) -> Measurement:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    times = timer(lambda: dst.copy_(src), cfg.repeats, cfg.warmup)
    # A copy reads and writes every byte: bandwidth counts both (guide's "bytes moved").
    return Measurement("copy", "bytes", f"{nbytes >> 20} MiB", 2 * nbytes / statistics.median(times),
                       times)


def _launch(device, cfg, timer) -> Measurement:
    """GPU time per kernel that does no work. On a GPU the 200 tiny kernels are replayed from a
    CUDA graph, so the CPU's cost to issue them (``_host_issue``) is not in the figure; on a CPU
    the two are the same thing, the eager per-op overhead."""
    x = torch.zeros(1, device=device)
    n = 200
    run = lambda: [x.add_(1) for _ in range(n)]  # noqa: E731
    shape = "1-element add"
    if device.type == "cuda":
        try:
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                run()  # warm-up on the side stream, as graph capture requires
            torch.cuda.current_stream(device).wait_stream(stream)
            with torch.cuda.graph(graph):
                run()
            run, shape = graph.replay, "1-element add, CUDA graph replay"
        except RuntimeError:  # no graph support: keep the eager figure (host included)
            pass
    times = timer(run, cfg.repeats, cfg.warmup)
    return Measurement("launch", "seconds", shape, statistics.median(times) / n,
                       [t / n for t in times])


def _host_issue(device, cfg) -> Measurement:
    """CPU time eager PyTorch takes to issue one tiny kernel to the GPU (no synchronisation
    inside the loop: the GPU queue absorbs them), the efficiency model's ``host_s``."""
    x = torch.zeros(1, device=device)
    n = 200
    times = []
    for i in range(cfg.warmup + cfg.repeats):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(n):
            x.add_(1)
        elapsed = time.perf_counter() - start
        if i >= cfg.warmup:
            times.append(elapsed / n)
    return Measurement("host", "seconds", "1-element add issued from Python",
                       statistics.median(times), times)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        from dlperf.errors import DlperfError

        raise DlperfError("--device cuda: no CUDA GPU is visible to PyTorch here; use cpu")
    return torch.device(name)


def probe(cfg: ProbeConfig = ProbeConfig(), progress=None) -> tuple[DeviceSpec, list[Measurement]]:
    """Measure ceilings on ``cfg.device``; returns (measured DeviceSpec, raw measurements)."""
    device = resolve_device(cfg.device)
    timer = _timer(device)
    gpu = device.type == "cuda"
    tasks = []
    if gpu:
        n = 4096 if cfg.quick else 8192
        tasks += [("fp32", lambda: _with_tf32(False, lambda: _matmul(n, torch.float32, device,
                                                                      "fp32", cfg, timer))),
                  ("tf32", lambda: _with_tf32(True, lambda: _matmul(n, torch.float32, device,
                                                                     "tf32", cfg, timer))),
                  ("bf16", lambda: _matmul(n, torch.bfloat16, device, "bf16", cfg, timer)),
                  ("fp16", lambda: _matmul(n, torch.float16, device, "fp16", cfg, timer)),
                  ("fp8", lambda: _fp8_matmul(n, device, cfg, timer)),
                  ("bf16", lambda: _conv(64, 256, 56, torch.bfloat16, device, "bf16", cfg, timer)),
                  ("copy", lambda: _copy((1 << 28) if cfg.quick else (1 << 30), device, cfg, timer))]
    else:
        sizes = (512, 1024) if cfg.quick else (1024, 2048)
        conv = (4, 64, 28) if cfg.quick else (16, 128, 56)
        rate: dict[str, float] = {}  # FLOP/s of the last matmul measured per dtype

        def sized(n, unit):
            # A CPU without native bf16/fp16 emulates them at ~1 GFLOP/s: a 1024^3 matmul
            # then takes seconds per run and only confirms the smaller size's rate (the peak
            # is the best of the shapes). Larger sizes run only while one run stays short.
            if unit in rate and 2 * n**3 / rate[unit] > MAX_CPU_RUN_S:
                return None
            m = _matmul(n, DTYPES[unit], device, unit, cfg, timer)
            rate[unit] = m.value
            return m

        for unit in ("fp32", "bf16", "fp16"):
            for n in sizes:
                tasks.append((unit, lambda n=n, u=unit: sized(n, u)))
            tasks.append((unit, lambda u=unit: _conv(*conv, DTYPES[u], device, u, cfg, timer)))
        tasks.append(("copy", lambda: _copy((1 << 26) if cfg.quick else (1 << 28), device, cfg,
                                             timer)))
    tasks.append(("launch", lambda: _launch(device, cfg, timer)))
    if gpu:
        tasks.append(("host", lambda: _host_issue(device, cfg)))

    measurements: list[Measurement] = []
    for _, task in tasks:
        m = task()
        if m is not None:
            measurements.append(m)
        if progress:
            progress()
    return _to_spec(device, measurements), measurements


def cached_cpu_probe(quick: bool = True, refresh: bool = False) -> tuple[DeviceSpec, str]:
    """This CPU's measured spec, probed once per machine and environment (CPU model, threads,
    torch version, platform) and then read from ``cache_dir()``: `dlperf train` needs the
    ceiling for its MFU figure, not a fresh minute of measuring after every run. Returns
    (spec, where it came from).

    ``refresh``: probe again even with a cache, and keep for each math unit and for the
    bandwidth the larger of the two measurements. A ceiling is the most the CPU was seen to do,
    and one probe on a shared machine can run beside other work: a cache written then is too
    low for every later run (a run that outpaces its ceiling asks for this)."""
    import hashlib
    import json

    from dlperf.files import cache_dir, write_json_atomic

    env = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
           "platform": platform.platform(), "quick": quick}
    key = hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / f"cpu-probe-{key}.json"
    cached = None
    try:
        data = json.loads(path.read_text())
        if data.get("environment") == env:
            cached = DeviceSpec.from_dict(data["spec"], str(path))
    except (OSError, ValueError, KeyError, TypeError, DlperfError):
        pass  # no cache yet, or one from another version: probe afresh
    if cached is not None and not refresh:
        return cached, "this CPU, probed"
    spec, _ = probe(ProbeConfig(device="cpu", quick=quick))
    if cached is not None:
        spec = best_of(spec, cached)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"spec": spec.to_dict(), "environment": env})
    except (OSError, DlperfError):
        pass  # a read-only home: the figure stands, only the cache is lost
    return spec, "this CPU, probed"


def best_of(spec: DeviceSpec, other: DeviceSpec) -> DeviceSpec:
    """``spec`` with each math unit's peak and the bandwidth the larger of its own and
    ``other``'s: two probes of one machine, the ceiling being the most either saw."""
    import dataclasses

    peak = {u: max(v, other.peak.get(u) or 0) for u, v in spec.peak.items()}
    return dataclasses.replace(spec, peak=peak,
                               mem_bandwidth=max(spec.mem_bandwidth, other.mem_bandwidth))


def cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it (else what platform knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_task_count(cfg: ProbeConfig) -> int:
    device = resolve_device(cfg.device)
    return 9 if device.type == "cuda" else 3 * 3 + 2


def _with_tf32(enabled: bool, fn):
    """Run ``fn`` with cuBLAS TF32 on or off, restoring the caller's setting afterwards."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        return fn()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def efficiency_overrides(ms: list[Measurement]) -> dict:
    """What a probe measured of the efficiency model beyond peaks: the CPU's issue time per
    kernel on a GPU machine (``host_s``); empty on a CPU, where ops run synchronously."""
    host = [m.value for m in ms if m.kind == "host"]
    return {"host_s": host[0]} if host else {}


def _to_spec(device: torch.device, ms: list[Measurement]) -> DeviceSpec:
    peak: dict[str, float] = {}
    for m in ms:
        if m.kind in ("matmul", "conv"):
            peak[m.unit] = max(peak.get(m.unit, 0.0), m.value)
    bandwidth = max(m.value for m in ms if m.kind == "copy")
    launch = next(m.value for m in ms if m.kind == "launch")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return DeviceSpec(
            name=f"probed-{props.name.lower().replace(' ', '-')}",
            display_name=f"{props.name} (measured)", sm_count=props.multi_processor_count,
            mem_bandwidth=bandwidth, peak=peak, l2_bytes=getattr(props, "L2_cache_size", None),
            memory_bytes=props.total_memory, tensor_cores=props.major >= 7, measured=True,
            launch_overhead_s=launch, efficiency=efficiency_overrides(ms),
            source=f"dlperf probe, torch {torch.__version__}, CUDA {torch.version.cuda}",
            notes="Sustained rates measured by dlperf probe; efficiency already included.")
    cores = torch.get_num_threads()
    cpu = platform.processor() or platform.machine()
    return DeviceSpec(
        name="cpu", display_name=f"CPU {cpu}, {cores} threads (measured)", sm_count=cores,
        mem_bandwidth=bandwidth, peak=peak, tensor_cores=False, measured=True,
        launch_overhead_s=launch, source=f"dlperf probe, torch {torch.__version__}",
        notes="Best of matmul and channels_last 3x3 conv per dtype; copy bandwidth counts bytes "
              "read + written; launch = eager per-op overhead.")
