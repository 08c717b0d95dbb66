"""The CLI end to end on CPU: tables, JSON shape, one-line errors, spec files."""

import json
import subprocess
import sys

import pytest
import torch

from conftest import run_cli as _run
from dlperf.errors import DlperfError

LAYER_KEYS = {"module", "op", "phase", "flops", "bytes", "intensity", "bound", "gemm",
              "tensor_core_aligned", "quantization_efficiency", "predicted_time_s"}


def test_analyze_resnet50_train_json_shape(tmp_path, capsys):
    path = tmp_path / "r.json"
    code, out, err = _run(["analyze", "resnet50", "--device", "h100-sxm", "--batch-size", "64",
                           "--dtype", "bf16", "--train", "--json", str(path)], capsys)
    assert code == 0, err
    assert "Predicted step" in out and "convolution" in out
    data = json.loads(path.read_text())
    assert set(data) >= {"device", "config", "totals", "layers", "uncounted", "environment"}
    assert data["environment"]["torch"] == torch.__version__
    assert set(data["totals"]) >= {"flops", "bytes", "predicted_time_s"}
    assert data["device"]["name"] == "h100-sxm" and data["config"]["train"] is True
    for layer in data["layers"]:
        assert LAYER_KEYS <= set(layer)
    phases = {layer["phase"] for layer in data["layers"]}
    assert phases == {"forward", "dgrad", "wgrad", "optimizer"}  # SGD step by default
    convs = [layer for layer in data["layers"] if layer["gemm"] is not None]
    assert convs and all(set(layer["gemm"]) >= {"m", "n", "k"} for layer in convs)
    # Time adds up: the GPU's time is the sum over kernels; the step adds the time the GPU
    # waits for the CPU to issue kernels (at least the first kernel's issue).
    total = sum(layer["predicted_time_s"] for layer in data["layers"])
    totals = data["totals"]
    assert totals["gpu_time_s"] == pytest.approx(total)
    assert totals["host_wait_s"] > 0
    assert totals["predicted_time_s"] == pytest.approx(total + totals["host_wait_s"])
    # Forward+backward at batch 64 is about 3x the forward: 3 x 8.18 GFLOP x 64 = 1.57 TFLOP
    # (plus a little memory-bound arithmetic).
    assert data["totals"]["flops"] == pytest.approx(3 * 8.178e9 * 64, rel=0.03)


def test_html_report_is_self_contained(tmp_path, capsys):
    path = tmp_path / "r.html"
    code, _, err = _run(["analyze", "resnet18", "--batch-size", "8", "--train", "--html",
                         str(path)], capsys)
    assert code == 0, err
    text = path.read_text()
    assert text.startswith("<!doctype html>") and "<svg" in text
    assert "<script" not in text and "src=" not in text and "href=" not in text
    assert "<th>limited by</th>" in text  # issue #11: what sets each kernel's time
    # one circle per kernel that has both math and traffic
    import dlperf

    a = dlperf.analyze("resnet18", (8, 3, 224, 224), train=True)
    expected = sum(1 for p in a.predictions if p.cost.flops > 0 and p.cost.bytes > 0)
    assert text.count("<circle") == expected
    assert "What the guide says to do" in text


def test_tf32_is_titled_only_where_the_device_has_it(tmp_path, capsys):
    # --tf32 on a V100 or a Turing card changes nothing (torch's allow_tf32 has no TF32 units
    # to use): the title says so instead of claiming TF32, and the convolutions are costed on
    # the CUDA cores either way (the same time as without the flag).
    times = {}
    for device, tf32 in (("quadro-rtx8000", True), ("quadro-rtx8000", False),
                         ("a100-80gb", True)):
        flags = ["--tf32"] if tf32 else []
        path = tmp_path / f"{device}-{tf32}.json"
        code, out, err = _run(["analyze", "resnet18", "--device", device, "--batch-size", "8",
                               "--dtype", "fp32", *flags, "--json", str(path)], capsys)
        assert code == 0, err
        times[device, tf32] = json.loads(path.read_text())["totals"]["predicted_time_s"]
    assert times["quadro-rtx8000", True] == times["quadro-rtx8000", False]
    code, out, _ = _run(["analyze", "resnet18", "--device", "quadro-rtx8000", "--batch-size",
                         "8", "--dtype", "fp32", "--tf32"], capsys)
    assert "fp32 (no TF32 on this device)" in out and "+tf32" not in out
    code, out, _ = _run(["analyze", "resnet18", "--device", "a100-80gb", "--batch-size", "8",
                         "--dtype", "fp32", "--tf32"], capsys)
    assert "fp32 +tf32" in out


@pytest.mark.parametrize("model, shape, dtype", [
    ("gpt", (8, 1024), torch.long),  # a token model: AdamW, 8 sequences
    ("resnet18", (256, 3, 224, 224), None),  # an image model: SGD, 256 images
])
def test_cli_and_python_api_give_the_same_answer_by_default(model, shape, dtype, tmp_path,
                                                            capsys):
    # The defaults that decide a result (batch, optimizer) live in analysis/api.py: the command
    # without --batch-size/--optimizer and dlperf.analyze() with the same batch agree exactly.
    import dlperf

    path = tmp_path / "a.json"
    code, _, err = _run(["analyze", model, "--train", "--json", str(path)], capsys)
    assert code == 0, err
    cli = json.loads(path.read_text())
    api = dlperf.analyze(model, shape, train=True, input_dtype=dtype)
    assert cli["config"]["input_shape"] == list(shape)
    assert cli["config"]["optimizer"] == api.config.optimizer == (
        "adamw" if dtype is torch.long else "sgd")
    assert cli["totals"]["predicted_time_s"] == pytest.approx(
        api.totals()["predicted_time_s"], rel=1e-12)


MODEL_FILE = '''
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(100, 1000)   # 100 is not a multiple of 8: misaligned K
        self.fc2 = nn.Linear(1000, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

def make():
    return Net()
'''


def test_analyze_factory_file_and_features_input(tmp_path, capsys):
    f = tmp_path / "net.py"
    f.write_text(MODEL_FILE)
    path = tmp_path / "out.json"
    code, out, err = _run(["analyze", f"{f}:make", "--input-shape", "100", "--batch-size", "512",
                           "--train", "--device", "a100-80gb", "--dtype", "fp16",
                           "--json", str(path)], capsys)
    assert code == 0, err
    layers = json.loads(path.read_text())["layers"]
    fc1_fwd = next(x for x in layers if x["module"] == "fc1" and x["phase"] == "forward"
                   and x["gemm"])
    # forward GEMM M=1000 outputs, N=512 batch, K=100 inputs; 100 % 8 != 0 -> K misaligned,
    # and 1000 % 8 == 0, 512 % 8 == 0
    assert fc1_fwd["gemm"] == {"m": 1000, "n": 512, "k": 100, "batch": 1}
    assert fc1_fwd["tensor_core_aligned"] is False and fc1_fwd["misaligned_dims"] == ["k"]
    assert "no: K" in out


def test_gpt_analysis(capsys):
    code, out, err = _run(["analyze", "gpt", "--layers", "2", "--d-model", "256", "--heads", "4",
                           "--vocab", "1000", "--seq-len", "128", "--batch-size", "2",
                           "--train", "--top", "500"], capsys)
    assert code == 0, err
    assert "attention_backward" in out and "tokens/s" in out


def test_gpt_presets_are_the_published_models_to_the_parameter(capsys):
    from dlperf.models.gpt import GPT, PRESETS, gpt_config

    def count(cfg):
        with torch.device("meta"):
            return sum(p.numel() for p in GPT(cfg).parameters())

    # GPT-2 small: 124,439,808 parameters (the released checkpoint, tied head); MPT: the
    # NumParams column of llm-foundry's throughput tables at 2,048 tokens, e.g. 7b:
    # 50,368 x 4,096 + 2,048 x 4,096 + 32 x (12 x 4,096^2 + 13 x 4,096) + 2 x 4,096
    assert count(PRESETS["gpt2"]) == 124_439_808
    assert count(PRESETS["mpt-7b"]) == 6_658_859_008
    assert count(PRESETS["mpt-125m"]) == 125_311_488 and count(PRESETS["mpt-70b"]) == 64_862_437_376
    # at 4,096 tokens the learned positions grow by 2,048 x 4,096 (the table: 6,667,247,616)
    assert count(gpt_config("mpt-7b", seq_len=4096)) == 6_667_247_616
    # on the command line a flag overrides the preset's value and nothing else
    code, out, err = _run(["analyze", "mpt-125m", "--layers", "2", "--seq-len", "256",
                           "--batch-size", "2", "--train", "--top", "500"], capsys)
    assert code == 0, err
    assert "blocks.1." in out and "blocks.2." not in out
    assert "50368" in out or "50,368" in out  # the preset's vocabulary in the head's GEMM


@pytest.mark.parametrize("argv,needle", [
    (["analyze", "resnet5"], "unknown model 'resnet5' (did you mean: resnet50"),
    (["analyze", "resnet50", "--device", "h10-sxm"], "unknown device 'h10-sxm' (did you mean:"),
    (["analyze", "resnet50", "--input-shape", "3,abc"], "--input-shape '3,abc'"),
    (["analyze", "resnet50", "--batch-size", "0"], "expected a positive integer"),
    (["analyze", "nope.py:make"], "nope.py: model file not found"),
    (["analyze", "resnet50", "--dtype", "fp64"], "invalid choice: 'fp64'"),
    (["analyze", "resnet50", "--device", "missing.json"], "missing.json: cannot read device spec"),
    (["analyze", "resnet50", "--input-shape", "1,64,64"], "failed on input shape"),
    (["analyze", "resnet18", "--batch-size", "1", "--input-shape", "3,32,32", "--train"],
     "Expected more than 1 value per channel"),
    (["analyze", "resnet50", "--device", "v100-sxm2", "--dtype", "bf16"], "has no bf16 math"),
    (["analyze", "gpt", "--d-model", "100", "--heads", "3"], "divisible by heads"),
    (["analyze", "mpt-7b", "--heads", "7"], "divisible by heads"),
    (["analyze", "resnet50", "--layers", "3"], "--layers: only for gpt and its presets"),
    (["analyze", "mpt-8b"], "unknown model 'mpt-8b' (did you mean: mpt-7b"),
    (["analyze", "gpt", "--activation-checkpointing"], "--activation-checkpointing needs --train"),
    (["analyze", "resnet18", "--optimizer-impl", "for-loop"], "--optimizer-impl describes the"),
    (["analyze", "resnet18", "--train", "--optimizer", "none", "--optimizer-impl", "foreach"],
     "it needs --train and an optimizer"),
    (["analyze", "resnet18", "--train", "--optimizer-impl", "apex"], "invalid choice: 'apex'"),
    (["analyze", "resnet18", "--train", "--optimizer", "sgd", "--optimizer-impl", "bertadam"],
     "BertAdam is an Adam over FP32 parameters; use it with --optimizer adamw"),
    (["analyze", "resnet18", "--train", "--dtype", "fp16", "--cuda-graphs", "--optimizer-impl",
      "foreach"], "a CUDA graph cannot hold"),
    (["analyze", "gpt", "--train", "--grad-accum", "4"], "--grad-accum applies to the scale-out"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_input_gives_one_line_and_exit_2(argv, needle, capsys):
    code, out, err = _run(argv, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert needle in lines[0] and "Traceback" not in err


def test_training_a_model_with_nothing_to_train_says_so(tmp_path, capsys):
    # autograd's "element 0 of tensors does not require grad" read as a bad --input-shape
    path = tmp_path / "frozen.py"
    path.write_text("import torch\n"
                    "def make():\n"
                    "    m = torch.nn.Linear(8, 8)\n"
                    "    m.requires_grad_(False)\n"
                    "    return m\n")
    code, out, err = _run(["analyze", f"{path}:make", "--input-shape", "8", "--train"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "has no trainable parameters" in err and "input shape" not in err
    code, out, err = _run(["analyze", f"{path}:make", "--input-shape", "8"], capsys)
    assert code == 0, err  # its forward is still analysed


def test_a_model_file_that_exits_on_import_gets_a_hint_not_a_silent_exit(tmp_path, capsys):
    # a training script that parses its arguments at import raised SystemExit through dlperf:
    # exit status 2 (argparse's) or 3 and no word from dlperf
    path = tmp_path / "script.py"
    path.write_text("raise SystemExit(3)\n")
    code, out, err = _run(["analyze", f"{path}:make", "--input-shape", "8"], capsys)
    assert code == 2 and "exited while dlperf imported it (SystemExit 3)" in err
    assert "__main__" in err
    path.write_text("def make():\n    raise SystemExit('no')\n")
    code, out, err = _run(["analyze", f"{path}:make", "--input-shape", "8"], capsys)
    assert code == 2 and "the factory exited (SystemExit no)" in err


def test_a_comparison_with_a_device_lacking_the_dtype_stops_before_any_output(capsys):
    code, out, err = _run(["analyze", "resnet50", "--device", "h200,v100-sxm2", "--dtype", "bf16",
                           "--batch-size", "8"], capsys)
    assert code == 2 and "v100-sxm2 has no bf16 math" in err
    assert out == ""  # not the first device's table followed by an error


def test_bad_spec_file_names_the_field(tmp_path, capsys):
    spec = tmp_path / "gpu.json"
    spec.write_text(json.dumps({"name": "x", "sm_count": 10, "mem_bandwidth": 1e12,
                                "peak": {"bf17": 1e15}}))
    code, _, err = _run(["analyze", "resnet50", "--device", str(spec)], capsys)
    assert code == 2 and "unknown math unit 'bf17'" in err


def test_user_spec_file_toml(tmp_path, capsys):
    spec = tmp_path / "mygpu.toml"
    spec.write_text('name = "mygpu"\nsm_count = 100\nmem_bandwidth = 2e12\n'
                    '[peak]\nfp32 = 50e12\nbf16 = 500e12\n')
    path = tmp_path / "o.json"
    code, _, err = _run(["analyze", "resnet18", "--device", str(spec), "--batch-size", "8",
                         "--json", str(path)], capsys)
    assert code == 0, err
    assert json.loads(path.read_text())["device"]["name"] == "mygpu"


def test_devices_lists_every_preset(capsys):
    code, out, _ = _run(["devices"], capsys)
    assert code == 0
    for name in ("v100-sxm2", "t4", "a10", "rtx3090", "a100-40gb", "a100-80gb", "l4", "l40s",
                 "h100-sxm", "h100-pcie", "h200", "b200", "rtx4090", "rtx6000-ada", "rtx-a6000",
                 "quadro-rtx8000", "a100-pcie-40gb", "a100-pcie-80gb", "gh200", "a30", "a40",
                 "l40", "v100-pcie", "v100-sxm2-16gb", "gb200", "b300", "gb300"):
        assert name in out
    assert "138.9" in out  # V100 fp16 ops:byte
    code, out, _ = _run(["devices", "--json"], capsys)
    specs = {s["name"]: s for s in json.loads(out)}
    assert len(specs) == 27 and all(s["source"].startswith("https://") for s in specs.values())
    # dense and sparse kept apart: sparse is exactly 2x dense where NVIDIA publishes both
    h100 = specs["h100-sxm"]
    assert h100["sparse_peak"]["bf16"] == pytest.approx(2 * h100["peak"]["bf16"], rel=1e-3)


@pytest.mark.parametrize("sub", [[], ["analyze"], ["devices"], ["probe"]])
def test_help_explains_itself(sub):
    proc = subprocess.run([sys.executable, "-m", "dlperf", *sub, "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0
    assert "usage: dlperf" in proc.stdout and len(proc.stdout) > 200


@pytest.mark.slow
def test_analyze_device_cpu_runs_a_fresh_probe(capsys):
    code, out, err = _run(["analyze", "resnet18", "--device", "cpu", "--batch-size", "2",
                           "--dtype", "fp32"], capsys)
    assert code == 0, err
    assert "(measured)" in out and "Predicted step" in out


@pytest.mark.slow
def test_probe_writes_spec_that_analyze_accepts(tmp_path, capsys):
    path = tmp_path / "probe.json"
    code, out, err = _run(["probe", "--device", "cpu", "--quick", "--sweep", "--out", str(path)],
                          capsys)
    assert code == 0, err
    assert "Sweep (" in out
    data = json.loads(path.read_text())
    spec = data["spec"]
    assert spec["measured"] is True and spec["name"] == "cpu"
    assert spec["peak"]["fp32"] > 1e9 and spec["mem_bandwidth"] > 1e9
    assert {m["kind"] for m in data["measurements"]} >= {"matmul", "conv", "copy", "launch"}
    # --sweep fitted the efficiency model to this CPU from generic layers and stored it
    eff = spec["efficiency"]
    assert set(eff) >= {"cuda_core", "cuda_core_conv", "cuda_core_attention", "memory",
                        "depthwise", "depthwise_backward", "reduction", "norm",
                        "reduction_backward", "transcendental",
                        "window", "launch_s", "gemm_m0"}
    # fractions of the quick probe's peaks, inside the fit's bounds (a quick probe's matmul
    # peak can sit below what the sweep's larger layers reach, so up to 3x)
    assert 0 < eff["cuda_core"] <= 3.0 and 0 < eff["window"] <= 2.0
    assert data["sweep"]["fit"]["kernels"] >= 40
    report = tmp_path / "a.json"
    code, out, err = _run(["analyze", "resnet18", "--device", str(path), "--batch-size", "2",
                           "--dtype", "fp32", "--json", str(report)], capsys)
    assert code == 0, err
    assert "(measured)" in out
    assert json.loads(report.read_text())["model_constants"]["cuda_core"] == eff["cuda_core"]


def test_compare_devices_from_one_capture(tmp_path, capsys):
    path = tmp_path / "cmp.json"
    code, out, err = _run(["analyze", "resnet18", "--batch-size", "32", "--train", "--dtype",
                           "fp16", "--device", "v100-sxm2,h100-sxm", "--json", str(path)], capsys)
    assert code == 0, err
    rows = json.loads(path.read_text())["comparison"]
    assert [r["device"] for r in rows] == ["v100-sxm2", "h100-sxm"]
    # the same kernels: an H100 (989 TF/s, 3.35 TB/s) beats a V100 (125 TF/s, 0.9 TB/s)
    assert rows[1]["predicted_time_s"] < rows[0]["predicted_time_s"]
    assert "the same kernels on each device" in out
    # each device's track record against published runs rides along (a choice between GPUs
    # should see how far each one's predictions have landed)
    assert "track record" in out
    assert rows[0]["track_record"]["device"]["rows"] >= 20  # V100: NVIDIA, Lambda, skb rows
    # the efficiency model's line names the Winograd share (FITTED.winograd, 0.378), and the
    # JSON carries it with the other constants
    assert "cuDNN's Winograd: 38% of its math time" in " ".join(out.split())
    assert json.loads(path.read_text())["model_constants"]["winograd"] == 0.378
    code, _, err = _run(["analyze", "resnet18", "--device", "h100-sxm,h200", "--measure"], capsys)
    assert code == 2 and "--measure needs a single --device" in err


def test_bench_results_default_to_the_checkout_or_the_current_folder(tmp_path, monkeypatch):
    from dlperf.cli.common import result_path

    monkeypatch.chdir(tmp_path)
    assert str(result_path(None, "data-cpu.json")) == "data-cpu.json"  # outside a checkout
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    assert str(result_path(None, "data-cpu.json")) == "benchmarks/results/data-cpu.json"
    with pytest.raises(DlperfError, match="folder r does not exist"):
        result_path("r/x.json", "data-cpu.json")  # an explicit --out is never created
    (tmp_path / "r").mkdir()
    assert str(result_path("r/x.json", "data-cpu.json")) == "r/x.json"


def test_json_dash_is_refused_where_the_report_owns_the_terminal(tmp_path, monkeypatch, capsys):
    # `analyze --json -` wrote a file named "-" (one was committed by accident); only
    # `devices --json -` prints JSON alone, so elsewhere "-" is a one-line error, before work
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(["analyze", "resnet18", "--device", "h100-sxm", "--json", "-"], capsys)
    assert code == 2 and "--json -:" in err and "give a file name" in err
    assert not (tmp_path / "-").exists() and "Traceback" not in err
    code, out, _ = _run(["devices", "--json", "-"], capsys)
    assert code == 0 and json.loads(out)[0]["name"]


def test_efficiency_flag_sets_a_share_on_top_of_the_preset(tmp_path, capsys):
    # a user whose stack's GEMMs keep the single-GPU table's share on an H100 says so; every
    # cuBLAS GEMM's math time then scales by 0.578 / 0.779 and nothing else moves
    args = ["analyze", "gpt", "--device", "h100-sxm", "--batch-size", "8", "--dtype", "bf16",
            "--train", "--top", "1"]
    runs = {}
    for label, extra in (("preset", []), ("set", ["--efficiency", "tensor_gemm=0.779",
                                                  "--efficiency", "attention=0.25"])):
        path = tmp_path / f"{label}.json"
        code, out, err = _run(args + extra + ["--json", str(path)], capsys)
        assert code == 0, err
        runs[label] = json.loads(path.read_text())
    assert runs["preset"]["model_constants"]["tensor_gemm"] == 0.578
    assert runs["set"]["model_constants"]["tensor_gemm"] == 0.779
    assert runs["set"]["model_constants"]["attention"] == 0.25
    gemms = [(a, b) for a, b in zip(runs["preset"]["layers"], runs["set"]["layers"])
             if a["math_class"] == "tensor-gemm"]
    assert gemms
    for a, b in gemms:
        assert b["math_time_s"] == pytest.approx(a["math_time_s"] * 0.578 / 0.779)
    others = [(a, b) for a, b in zip(runs["preset"]["layers"], runs["set"]["layers"])
              if a["math_class"] not in ("tensor-gemm", "attention")]
    assert all(a["predicted_time_s"] == pytest.approx(b["predicted_time_s"]) for a, b in others)
    assert (runs["set"]["totals"]["predicted_time_s"]
            < runs["preset"]["totals"]["predicted_time_s"])


@pytest.mark.parametrize("flag, message", [
    ("tensor_gemm", "give NAME=VALUE with a number"),
    ("tensor_gemm=fast", "give NAME=VALUE with a number"),
    ("=0.5", "give NAME=VALUE with a number"),
    ("bogus=0.5", "unknown efficiency parameter 'bogus'"),
    ("tensor_gemm=5", "is a fraction of peak"),
    ("tensor_gemm=-1", "must be a positive number"),
    ("tensor_gemm=nan", "must be a positive number")])
def test_efficiency_flag_refuses_bad_input_in_one_line(flag, message, capsys):
    code, out, err = _run(["analyze", "gpt", "--device", "h100-sxm", "--efficiency", flag],
                          capsys)
    assert code == 2 and message in err and "--efficiency" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_json_results_write_sets_as_sorted_lists(tmp_path):
    # json has no set: the results writer turns one into its sorted members (str() wrote
    # Python's repr, "frozenset({...})", into analyze's scale-out config), anything else it
    # cannot write into its string
    import json
    from pathlib import PurePosixPath

    from dlperf.files import write_json_atomic

    out = write_json_atomic(tmp_path / "r.json", {"gathered": frozenset({"b.weight", "a.weight"}),
                                                  "empty": set(), "path": PurePosixPath("x/y")})
    assert json.loads(out.read_text()) == {"gathered": ["a.weight", "b.weight"], "empty": [],
                                           "path": "x/y"}
