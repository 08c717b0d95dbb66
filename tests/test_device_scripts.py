"""The one prepared GPU run (scripts/device_check.sh) checked here, so a lent device's few
minutes are never lost to a typo: every dlperf command in it parses and its training configs
resolve, and the benchmark scripts it calls run end to end on this CPU at tiny sizes."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dlperf.cli import build_parser, main
from dlperf.hardware.efficiency import FITTED, HOPPER_TENSOR_GEMM
from dlperf.hardware.specs import get_device
from conftest import load_benchmark
from imagegen import make_folder

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "device_check.sh"


def _commands() -> list[list[str]]:
    """Every dlperf invocation in device_check.sh as argv (after `-m dlperf`), $TRAIN expanded."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    train = re.search(r'^TRAIN="\$PY -m dlperf (.*?)"\s*$', text, re.M).group(1)
    argvs = []
    for line in text.splitlines():
        line = line.split(" #")[0].strip()
        if line.startswith(("#", "TRAIN=")):
            continue
        line = line.replace("$TRAIN", "$PY -m dlperf " + train)
        if "$PY -m dlperf " not in line:
            continue
        rest = line.split("$PY -m dlperf ", 1)[1]
        rest = rest.replace('"$OUT', '"/tmp/out').replace("$OUT", "/tmp/out")
        argvs.append(shlex.split(rest))
    return argvs


def run_benchmark(name: str, *args: str) -> None:
    """Run benchmarks/NAME.py with ``args`` in a fresh interpreter, as the device run does."""
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *args],
                   check=True, cwd=ROOT, capture_output=True)


def test_device_scripts_are_valid_bash():
    for script in (SCRIPT, ROOT / "scripts" / "build_device_ext.sh"):
        subprocess.run(["bash", "-n", str(script)], check=True)


def test_every_dlperf_command_in_the_device_run_parses(capsys):
    argvs = _commands()
    kinds = [a[0] for a in argvs]
    # the run's priorities: the corpus for issue #14's host-issue benchmark (a script, not a
    # dlperf command), then issue #11 (probe --sweep, nine analyze --measure: ResNet-50 bf16
    # channels_last, a GPT, ResNet-50 in seven more precisions and layouts; bench gemm), then
    # the compiled training goal, the sync A/B, graphs, the real-JPEG run, the ladder (if one
    # disappears, the check should say so)
    assert kinds[:12] == ["data", "probe", *["analyze"] * 9, "bench"], kinds
    assert "--sweep" in argvs[1] and argvs[11][1] == "gemm"
    # the seven layouts: TF32, bf16, strict FP32 and fp16, NCHW and channels_last, each measured
    layouts = [a for a in argvs[4:11]]
    assert all(a[1] == "resnet50" and "--measure" in a for a in layouts)
    assert sum("--tf32" in a for a in layouts) == 2
    assert sum("--channels-last" in a for a in layouts) == 3
    fp16 = [a for a in layouts if a[a.index("--dtype") + 1] == "fp16"]
    assert len(fp16) == 2 and sum("--channels-last" in a for a in fp16) == 1
    text = SCRIPT.read_text()
    assert text.index("bench_host_issue_gpu.py") < text.index("dlperf probe")
    assert text.index("bench_sustained_gemm_gpu.py") < text.index("dlperf probe")
    assert "sustained_gemm=/tmp/dlperf-sustained-gemm.json" in text  # gathered, not a 9th file
    assert text.index("bench_expert_gemm_gpu.py") < text.index("dlperf probe")
    assert "expert_gemm=/tmp/dlperf-expert-gemm.json" in text
    assert kinds.count("train") == 5 and {"probe", "analyze", "bench"} <= set(kinds), kinds
    parser = build_parser()
    for argv in argvs:
        if argv[0] == "train":  # the whole config resolves (unknown keys, bad values, ...)
            assert main(argv + ["--show-config"]) == 0, argv
            cfg = json.loads(capsys.readouterr().out)
            assert cfg["batch_size"] == 256 and cfg["epochs"] == 1, argv
            continue
        args, extra = parser.parse_known_args(argv)
        assert not extra, (argv, extra)
        if argv[0] == "analyze":
            for name in args.device.split(","):
                get_device(name)  # a known preset, or this raises


@pytest.mark.slow
def test_gpu_data_benchmark_runs_on_cpu(tmp_path):
    """benchmarks/bench_data_gpu.py falls back to the CPU here; its JSON has every field."""
    corpus = make_folder(tmp_path / "c", classes=2, per_class=6, size=(120, 160))
    out = tmp_path / "data-gpu.json"
    run_benchmark("bench_data_gpu", str(corpus), str(out), "--batch", "8", "--epochs", "1",
                  "--repeat", "2", "--threads", "2")
    res = json.loads(out.read_text())["results"]
    assert res["device"] == "cpu" and res["img_per_s"] > 0 and res["bad"] == 0
    assert 0 <= res["decode_call_share"] <= 1 and res["raw_decoder_img_per_s"] > 0
    assert res["cpu_loader"]["raw"] > 0
    from dlperf.data.decode import ROI_AVAILABLE

    if ROI_AVAILABLE:
        assert res["restart_markers"]["img_per_s"] > 0
        assert res["cpu_loader"]["restart_markers"] > 0


@pytest.mark.slow
def test_sync_audit_runs_on_cpu(tmp_path):
    out = tmp_path / "sync.json"
    run_benchmark("sync_audit", str(out), "--recipe", "tiny", "--steps", "3", "--log-every", "1")
    res = json.loads(out.read_text())["results"]
    assert res["audited"] is False and res["steps"] == 3 and res["total_syncs"] == 0


@pytest.mark.slow
def test_host_issue_benchmark_runs_on_cpu(tmp_path):
    """benchmarks/bench_host_issue_gpu.py (issue #14, step 0 of the device run) end to end on
    this CPU at a tiny size, busy processes decoding a corpus included; every field saved."""
    corpus = make_folder(tmp_path / "c", classes=1, per_class=4, size=(64, 64))
    out = tmp_path / "host.json"
    run_benchmark("bench_host_issue_gpu", str(out), "--model", "resnet18", "--batch", "2",
                  "--image", "32", "--steps", "2", "--warmup", "1", "--busy", "0,1", "--corpus",
                  str(corpus))
    saved = json.loads(out.read_text())
    res = saved["results"]
    assert saved["benchmark"] == "host-issue-gpu" and "git_commit" in saved["environment"]
    assert res["device"] == "cpu" and res["note"]
    cases = [(r["impl"], r["busy_processes"]) for r in res["rows"]]
    assert cases == [("fused", 0), ("foreach", 0), ("for-loop", 0), ("for-loop", 1)]
    # resnet18: 62 parameter tensors, 4 launches each in the for-loop; fused: 1 launch
    launches = {r["impl"]: r["predicted"]["update_launches"] for r in res["rows"]}
    assert launches == {"fused": 1, "foreach": 4, "for-loop": 248}
    assert all(r["median_s"] > 0 and r["steps"] == 2 for r in res["rows"])
    assert set(res["derived"]["busy_stretch"]) == {"0", "1"}
    # the CPU's own part of a for-loop launch: 4 ops per tensor of ResNet-50's 161
    assert res["cpu_dispatch"]["ops"] == 644 and 0 < res["cpu_dispatch"]["s_per_op"] < 1e-3


@pytest.mark.slow
def test_bert_update_benchmark_runs_on_cpu(tmp_path):
    """benchmarks/bench_bert_update_gpu.py (issue #14, step 0e of the device run) end to end on
    this CPU with its two-layer BERT; every field saved, the update's launches by hand."""
    out = tmp_path / "bert.json"
    run_benchmark("bench_bert_update_gpu", str(out), "--device", "a100-80gb", "--batch", "2",
                  "--steps", "2", "--warmup", "1")
    saved = json.loads(out.read_text())
    res = saved["results"]
    assert saved["benchmark"] == "bert-update-gpu" and res["device"] == "cpu" and res["note"]
    assert [r["case"] for r in res["rows"]] == ["backward", "fused", "bertadam", "bertadam-sync"]
    assert all(r["median_s"] > 0 and r["steps"] == 2 for r in res["rows"])
    # the two-layer BERT's 39 tensors: 16 decayed (3 embeddings, 6 weights a layer, the span
    # head's), 23 not (biases and LayerNorm: run_squad.py's no_decay). BertAdam: 16 x 12 +
    # 23 x 10 Adam kernels + 39 x 8 for the clips + the clipper's one multi-tensor norm = 735;
    # the fused AdamW one launch; no update, none
    launches = {r["case"]: r["predicted"]["update_launches"] for r in res["rows"]}
    assert launches == {"backward": 0, "fused": 1, "bertadam": 735, "bertadam-sync": 735}
    spans = res["update_spans"]
    assert set(spans) == {"fused", "bertadam", "bertadam-sync"}
    # the predicted BertAdam span holds its 735 launches of host time at least
    assert spans["bertadam"]["predicted_s"] >= 735 * res["predicted_host_s"] * 0.99
    assert res["host_s_per_launch"] is not None


def test_expert_gemm_benchmark_runs_on_cpu(tmp_path):
    """benchmarks/bench_expert_gemm_gpu.py (issue #14, step 0f of the device run) on this CPU
    at a tiny size: every GEMM of the experts' step timed as one batched GEMM and one per
    expert, the forms a CPU lacks left None, dlperf's prediction beside them."""
    out = tmp_path / "experts.json"
    run_benchmark("bench_expert_gemm_gpu", str(out), "--experts", "4", "--tokens", "64",
                  "--d-model", "32", "--ffn", "48", "--reps", "3", "--preset", "h100-sxm")
    saved = json.loads(out.read_text())
    res = saved["results"]
    assert saved["benchmark"] == "expert-gemm-gpu" and "git_commit" in saved["environment"]
    assert res["device"] == "cpu" and res["note"]
    # the gated first layer makes 2 x 48; its forward is 2 x 64 x 96 x 32 FLOPs an expert
    gemms = res["gemms"]
    assert list(gemms) == ["fc1 forward", "fc2 forward", "fc2 dgrad", "fc2 wgrad",
                           "fc1 dgrad", "fc1 wgrad"]
    assert gemms["fc1 forward"]["flops"] == 4 * 2 * 64 * 96 * 32
    assert (gemms["fc1 wgrad"]["m"], gemms["fc1 wgrad"]["n"], gemms["fc1 wgrad"]["k"]) == (
        32, 96, 64)
    assert all(g["batched_s"] > 0 and g["per_expert_s"] > 0 for g in gemms.values())
    # no streams and no grouped kernel on a CPU: None, and no ratio for them
    assert res["total"]["per_expert_streams_s"] is None and res["total"]["grouped_s"] is None
    assert res["over_batched"]["per_expert_s"] == pytest.approx(
        res["total"]["per_expert_s"] / res["total"]["batched_s"])
    assert res["predicted"]["preset"] == "h100-sxm"


def test_expert_gemm_prediction_batched_against_per_expert():
    # dlperf's pricing: one expert is the same GEMM either way; 16 experts batched never take
    # more waves than 16 GEMMs (ceil(16 t / SMs) <= 16 ceil(t / SMs) for t tiles each) and
    # launch once, not 16 times
    bench = load_benchmark("bench_expert_gemm_gpu")
    one = bench.predicted("h100-sxm", 1, 1024, 2880, 2880)
    assert all(g["batched_s"] == pytest.approx(g["per_expert_s"]) for g in one["gemms"].values())
    many = bench.predicted("h100-sxm", 16, 1024, 2880, 2880)
    assert all(g["per_expert_s"] > g["batched_s"] for g in many["gemms"].values())
    assert many["per_expert_s"] == pytest.approx(sum(
        g["per_expert_s"] for g in many["gemms"].values()))


def test_sustained_gemm_prediction_is_the_hopper_share_by_hand():
    # an MPT-13B block's GEMMs at 4,096 tokens on an H100 SXM: every one tiles 256 x 128 into a
    # multiple of 640 tiles, waves of 132 SMs 1,920 / 1,980 = 0.9697 busy (also 640 / 660 and
    # 2,560 / 2,640), so 989.4 x 0.578 x 0.9697 = 554.5 TFLOP/s with the Hopper share and
    # 989.4 x 0.779 x 0.9697 = 747.4 with the table's (launches: 4 x 0.5 us in ~2 ms)
    bench = load_benchmark("bench_sustained_gemm_gpu")
    pred = bench.predicted_tflops("h100-sxm", 4096, 5120)
    assert pred["tflops_own_share"] == pytest.approx(989.4 * 0.578 * 1920 / 1980, rel=2e-3)
    assert pred["tflops_table_share"] == pytest.approx(989.4 * 0.779 * 1920 / 1980, rel=2e-3)
    # an A100 has no share of its own: both are the table's
    a100 = bench.predicted_tflops("a100-80gb", 4096, 5120)
    assert a100["tflops_own_share"] == a100["tflops_table_share"]


def test_sustained_gemm_benchmark_runs_on_cpu(tmp_path):
    """benchmarks/bench_sustained_gemm_gpu.py (issue #14, step 0b of the device run) on this
    CPU at a tiny size: the series, its summary and the environment are saved."""
    out = tmp_path / "gemm.json"
    run_benchmark("bench_sustained_gemm_gpu", str(out), "--seconds", "1", "--tokens", "32",
                  "--d-model", "32", "--preset", "h100-sxm")
    saved = json.loads(out.read_text())
    res = saved["results"]
    assert saved["benchmark"] == "sustained-gemm-gpu" and "git_commit" in saved["environment"]
    assert res["device"] == "cpu" and res["note"]
    alone = res["alone"]
    assert alone["series"] and all(s["tflops"] > 0 for s in alone["series"])
    assert alone["summary"]["samples"] == len(alone["series"]) >= 2
    # no second stream on a CPU: nothing beside the copy, and the ratio says so
    assert res["beside_copy"]["series"] == [] and res["derived"]["beside_copy_over_alone"] is None
    assert res["derived"]["sustained_over_first"] > 0
    # dlperf's prediction for the same GEMMs on the preset asked for, with its own GEMM share
    # and the table's: the rates differ by the shares' ratio (the shapes' tile and wave losses
    # and launches are the same in both; a 32 x 96 x 32 GEMM is all launch, so only roughly)
    pred = res["predicted"]
    assert pred["preset"] == "h100-sxm" and saved["config"]["preset"] == "h100-sxm"
    assert pred["tensor_gemm_own"] == HOPPER_TENSOR_GEMM
    assert pred["tensor_gemm_table"] == FITTED.tensor_gemm
    assert 0 < pred["tflops_own_share"] <= pred["tflops_table_share"]
    assert res["derived"]["sustained_over_predicted_own_share"] == pytest.approx(
        alone["summary"]["last_half_median_tflops"] / pred["tflops_own_share"])


def test_sdpa_share_benchmark_counts_flops_as_dlperf_and_runs_on_cpu(tmp_path):
    """benchmarks/bench_sdpa_gpu.py (issue #14, step 0c of the device run): the FLOPs are
    attention_cost's, by hand, and on this CPU at a tiny size every backend that runs is
    saved with its share of the preset's peak beside the shipped ones."""
    bench = load_benchmark("bench_sdpa_gpu")
    # causal, B 2, H 32, T 4,096, D 128: two matmuls of 2 B H T^2 D, half under the mask:
    # 2 x 2 x 2 x 32 x 4,096^2 x 128 / 2 = 274,877,906,944; the backward's five matmuls 2.5x
    flops = bench.attention_flops(2, 32, 4096, 128)
    assert flops["forward"] == 2 * 2 * 2 * 32 * 4096**2 * 128 // 2 == 274_877_906_944
    assert flops["dgrad"] == pytest.approx(2.5 * flops["forward"])
    out = tmp_path / "sdpa.json"
    run_benchmark("bench_sdpa_gpu", str(out), "--device", "cpu", "--batch", "1", "--heads", "2",
                  "--tokens", "64", "--head-dim", "16", "--iters", "2")
    saved = json.loads(out.read_text())
    res = saved["results"]
    assert saved["benchmark"] == "sdpa-share" and "git_commit" in saved["environment"]
    assert res["shipped_share"] == {"flash2": 0.262, "triton-2023": 0.187, "cudnn": 0.475}
    ran = [r for r in res["backends"] if "error" not in r]
    assert ran and ran[0]["backend"] == "default"
    peak = res["peak_bf16_flops"]
    for r in ran:
        assert r["forward_share"] == pytest.approx(
            res["flops"]["forward"] / r["forward_s"] / peak)
        # both timed (not compared: two medians at a tiny size on a shared CPU are noise;
        # a forward once read 8 ms against 0.13 for forward + backward under CI's load)
        assert r["forward_backward_s"] > 0 and r["forward_s"] > 0
        assert r["forward_backward_share"] == pytest.approx(
            3.5 * res["flops"]["forward"] / r["forward_backward_s"] / peak)


@pytest.mark.slow
def test_compile_speedup_benchmark_runs_on_cpu(tmp_path):
    """benchmarks/bench_compile_gpu.py (issue #14, step 0d of the device run): eager and
    per-block compiled forward + backward of a tiny Llama on this CPU, beside dlperf's
    prediction of both; the ratios are the saved times' own."""
    out = tmp_path / "compile.json"
    run_benchmark("bench_compile_gpu", str(out), "--device", "cpu", "--layers", "2", "--d-model",
                  "64", "--heads", "4", "--kv-heads", "2", "--ffn", "176", "--vocab", "128",
                  "--tokens", "32", "--batch", "1", "--iters", "2", "--fp8")
    saved = json.loads(out.read_text())
    res = saved["results"]
    assert saved["benchmark"] == "compile-speedup" and "git_commit" in saved["environment"]
    # --fp8: the stack with torchao's float8 layers, compiled per block, beside --fp8
    # tensorwise's prediction (at this size the casts cost more than the GEMMs save)
    assert res["float8_s"] > 0
    assert res["measured_float8_speedup"] == pytest.approx(res["compiled_s"] / res["float8_s"])
    assert res["predicted_float8_speedup"] == pytest.approx(
        res["predicted_compiled_s"] / res["predicted_float8_s"])
    assert res["predicted_float8_speedup"] < 1
    # and the rowwise recipe, likewise (its six casts a layer: slower still at this size)
    assert res["rowwise_s"] > 0
    assert res["measured_rowwise_speedup"] == pytest.approx(res["compiled_s"] / res["rowwise_s"])
    assert res["predicted_rowwise_speedup"] == pytest.approx(
        res["predicted_compiled_s"] / res["predicted_rowwise_s"])
    assert res["predicted_rowwise_speedup"] < res["predicted_float8_speedup"]
    assert res["eager_s"] > 0 and res["compiled_s"] > 0 and res["dtype"] == "float32"
    assert res["measured_speedup"] == pytest.approx(res["eager_s"] / res["compiled_s"])
    assert res["predicted_speedup"] == pytest.approx(
        res["predicted_eager_s"] / res["predicted_compiled_s"])
    assert res["predicted_speedup"] > 1  # the compiled step moves fewer bytes
    assert res["speedup_ratio"] == pytest.approx(res["predicted_speedup"] /
                                                 res["measured_speedup"])
    # each stack's predicted time by kernel class adds up to its predicted step; the measured
    # classes need CUDA's profiler (None here)
    kernels = res["kernels_ms"]
    assert set(kernels) == {"none", "compile-blocks", "float8", "rowwise"}
    for name, key in (("none", "predicted_eager_s"), ("compile-blocks", "predicted_compiled_s"),
                      ("float8", "predicted_float8_s"), ("rowwise", "predicted_rowwise_s")):
        assert kernels[name]["measured"] is None
        assert sum(kernels[name]["predicted"].values()) == pytest.approx(res[key] * 1e3)
    assert "fused" not in kernels["none"]["predicted"]  # eager: no compiled kernels
    assert kernels["compile-blocks"]["predicted"]["fused"] > 0
    assert kernels["none"]["predicted"]["gemm"] == pytest.approx(
        kernels["compile-blocks"]["predicted"]["gemm"])  # compiling fuses around the GEMMs


def test_compile_benchmark_sorts_kernels_by_name_as_the_prediction_does():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_compile_gpu import kernel_class, predicted_class
    finally:
        sys.path.pop(0)
    # kernel names as CUDA's profiler reports them on Hopper (cuBLAS, CUTLASS's rowwise
    # _scaled_mm, FlashAttention-2, cuDNN's attention, Inductor, ATen)
    assert kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == "gemm"
    assert kernel_class("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT") == "gemm"
    assert kernel_class("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal"
                        "<...RowwiseScaledMM...>>") == "gemm"
    assert kernel_class("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel"
                        "<Flash_bwd_kernel_traits<128, 64, 128>>") == "attention"
    assert kernel_class("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16") == (
        "attention")
    assert kernel_class("fmha_cutlassB_bf16_aligned_64x64_k128_sm80") == "attention"
    assert kernel_class("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "fused"
    assert kernel_class("void at::native::vectorized_elementwise_kernel<4, "
                        "at::native::CUDAFunctor_add<float>>") == "other"
    assert [predicted_class(op) for op in ("mm", "_scaled_mm", "attention_backward",
                                           "compiled", "_to_copy")] == [
        "gemm", "gemm", "attention", "fused", "other"]


def test_sync_audit_blames_the_dlperf_line_under_the_library_call(tmp_path):
    # The H200 run counted its 20 syncs a step at two lines inside torch (module.py:1370,
    # storage.py:264): the line of dlperf that led there is the one to report.
    import traceback

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from sync_audit import blame
    finally:
        sys.path.pop(0)
    pkg = tmp_path / "repo" / "dlperf"
    frame = traceback.FrameSummary
    stack = [frame(str(tmp_path / "repo/benchmarks/sync_audit.py"), 70, "main"),
             frame(str(pkg / "train/loop.py"), 175, "_step"),
             frame(str(pkg / "data/device.py"), 45, "host_to_device"),
             frame("/usr/lib/python3/site-packages/torch/storage.py", 264, "pin_memory")]
    assert blame(stack, "storage.py:264", pkg) == "dlperf/data/device.py:45 (via storage.py:264)"
    # the warning raised on dlperf's own line: that line alone
    assert blame(stack[:3], "device.py:45", pkg) == "dlperf/data/device.py:45"
    # no dlperf frame (a library's own thread): the library line
    assert blame(stack[3:], "storage.py:264", pkg) == "storage.py:264"
    # a checkout folder named dlperf is not the package: only the package's files count
    outer = tmp_path / "dlperf"
    assert blame([frame(str(outer / "benchmarks/x.py"), 3, "f")], "x.py:9",
                 outer / "dlperf") == "x.py:9"


def test_each_step_logs_its_time_status_and_a_failures_stderr(tmp_path):
    # the device tool returns only the call's last 12,000 characters: a step that fails must
    # leave its reason in a file that comes back ($OUT/run-log.txt)
    text = SCRIPT.read_text()
    body = re.search(r"^step\(\) \{\n.*?^\}\n", text, re.M | re.S).group(0)
    log = tmp_path / "run-log.txt"
    harness = (f'LOG="{log}"\n{body}'
               'step bash -c "echo fine >&2; exit 0"\n'
               'step bash -c "echo first >&2; echo the reason >&2; exit 3"\n'
               'echo after\n')
    done = subprocess.run(["bash", "-c", harness], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "after"  # a failed step does not stop the run
    assert "FAILED (exit 3)" in done.stderr and "the reason" in done.stderr
    lines = log.read_text().splitlines()
    assert re.fullmatch(r"\[\d+ s\] exit 0: bash -c echo fine >&2; exit 0", lines[0]), lines
    assert re.fullmatch(r"\[\d+ s\] exit 3: bash -c .*exit 3", lines[1]), lines
    assert lines[2:] == ["    first", "    the reason"]  # the failure's stderr, indented


def test_a_failing_profile_is_reported_not_fatal(monkeypatch):
    # step 0d's kernel profile may fail on a GPU; the timings around it must still be saved
    from types import SimpleNamespace

    bench = load_benchmark("bench_compile_gpu")

    def broken(*_):
        def step():
            raise RuntimeError("CUPTI is busy")
        return step
    monkeypatch.setattr(bench, "_step", broken)
    cuda_tokens = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    out = bench.profile_step(None, cuda_tokens, None, lambda: None)
    # (here the profiler itself refuses first: no CUDA activity on this CPU; either way, a line)
    assert set(out) == {"error"} and 0 < len(out["error"]) <= 300
    assert out["error"].split(":")[0] in ("RuntimeError", "AssertionError")
    cpu_tokens = SimpleNamespace(device=SimpleNamespace(type="cpu"))
    assert bench.profile_step(None, cpu_tokens, None, lambda: None) is None


def test_compile_rescore_takes_the_kernel_the_measuring_stack_ran():
    import json

    rescore = load_benchmark("rescore_compile_gpu")
    saved = json.loads(rescore.DEFAULT_IN.read_text())["compile_speedup"]
    # the first lent H200: torch 2.11.0+cu130 with cuDNN 9.19, whose SDPA puts cuDNN first
    assert saved["environment"]["cudnn"] == 91900
    assert rescore.measured_stack_kernel(saved) == "cudnn"
    older = {**saved, "environment": {**saved["environment"], "torch": "2.8.0a0",
                                      "cudnn": 91001}}
    assert rescore.measured_stack_kernel(older) == "flash2"
    out = json.loads((rescore.DEFAULT_OUT).read_text())["results"]
    by = out["by_kernel"]
    # the same stack with cuDNN's attention (0.475 of the peak) is predicted faster than with
    # FlashAttention-2's (0.262), by the attention's time alone: 7.43 -> 4.10 ms
    assert by["cudnn"]["predicted_eager_s"] < by["flash2"]["predicted_eager_s"]
    gap = by["flash2"]["predicted_eager_s"] - by["cudnn"]["predicted_eager_s"]
    flash2 = by["flash2"]["predicted_ms_by_class"]["none"]["attention"]
    attention = flash2 - by["cudnn"]["predicted_ms_by_class"]["none"]["attention"]
    assert gap * 1e3 == pytest.approx(attention, rel=0.01)
    assert attention == pytest.approx(flash2 * (1 - 0.262 / 0.475), rel=0.02)
    assert flash2 == pytest.approx(7.43, abs=0.05)
    # the prediction saved beside the measurement (FlashAttention-2 at the 0.322 of its day,
    # GEMMs at the H100's 0.578): 1.40x the measured step, 49.6 ms. Today's H200 preset runs
    # its GEMMs at the 0.699 that H200 sustained: 22.95 ms of them then, 22.95 x 0.578 /
    # 0.699 = 18.98 now, which outweighs FlashAttention-2's smaller share (0.262): 47.0 ms
    then = out["predicted_when_measured"]
    assert then["eager_s"] == saved["results"]["predicted_eager_s"]
    assert then["eager_predicted_over_measured"] == pytest.approx(1.40, abs=0.005)
    assert by["flash2"]["predicted_ms_by_class"]["none"]["gemm"] == pytest.approx(
        22.95 * 0.578 / 0.699, rel=0.002)
    assert by["flash2"]["predicted_eager_s"] == pytest.approx(0.0470, abs=2e-4)
    assert by["flash2"]["predicted_eager_s"] < then["eager_s"]
