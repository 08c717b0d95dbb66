"""Issue #11's validation table of published GPU training throughputs, and the models it needs."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
from conftest import load_benchmark, run_cli

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "benchmarks/validation/published_training.csv"


def _script():
    return load_benchmark("validate_published")


def test_every_published_row_is_complete_and_runnable_as_written():
    from dlperf.hardware.specs import get_device
    from dlperf.models.registry import build_model

    rows = _script().read_rows(CSV)
    assert len(rows) >= 30 and len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        get_device(r["device"])  # a preset that exists
        assert r["class"] in ("cnn-amp", "cnn-fp32-tf32", "transformer-amp",
                              "transformer-fp32-tf32")
        # a flag other than clean says why: a suspect figure, or a stack the model was not
        # fitted to (the reason given after the colon)
        assert r["flag"] in ("clean", "input-bound?") or (
            r["flag"].startswith(("suspect: ", "stack-")) and ": " in r["flag"])
        assert r["layout"] in ("nchw", "nhwc") and r["optimizer"] in ("sgd", "adamw")
        assert r["source"] and r["table"] and r["measured_img_s"] > 0
    has_timm = importlib.util.find_spec("timm") is not None
    for name in {r["model"] for r in rows}:
        if has_timm or not name.startswith("timm:"):
            build_model(name)  # on the meta device: cheap


def test_nvidia_convnets_match_timm_parameter_for_parameter():
    # An independent reference for the two models torchvision lacks: timm's resnext101_32x4d
    # and seresnext101_32x4d have 44,177,704 and 48,955,416 parameters, the published sizes
    # (44.18 M and 48.96 M) of NVIDIA's ResNeXt101-32x4d and SE-ResNeXt101-32x4d.
    timm = pytest.importorskip("timm")
    from dlperf.models.registry import build_model

    for ours, theirs in (("resnext101_32x4d", "resnext101_32x4d"),
                         ("se_resnext101_32x4d", "seresnext101_32x4d")):
        model, _ = build_model(ours)
        count = sum(p.numel() for p in model.parameters())
        with __import__("torch").device("meta"):
            reference = timm.create_model(theirs, pretrained=False)
        assert count == sum(p.numel() for p in reference.parameters())


@pytest.mark.slow
def test_validation_script_predicts_rows_and_saves_them(tmp_path, capsys):
    out = tmp_path / "v.json"
    assert _script().main([str(CSV), str(out), "--only=dle-rn50-v100-16-amp,dle-effb0-v100-16-fp32"]) == 0
    saved = json.loads(out.read_text())
    rows = {r["id"]: r for r in saved["results"]["rows"]}
    assert set(rows) == {"dle-rn50-v100-16-amp", "dle-effb0-v100-16-fp32"}
    for r in rows.values():
        assert r["predicted_img_s"] > 0 and r["ratio"] == pytest.approx(
            r["predicted_img_s"] / r["measured_img_s"])
    assert saved["results"]["summary"]["clean"]["rows"] == 2
    # the shipped efficiency model is recorded with the result, and says it was fitted here
    assert saved["config"]["efficiency_model"]["memory"] > 0 and "environment" in saved
    assert "fit_efficiency" in saved["config"]["fitted_to_these_rows"]
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "median |error|" in capsys.readouterr().out


def test_another_reading_sets_a_column_on_every_row(tmp_path):
    # --set=optimizer_impl= costs Lambda's BERT-base FP32 row with a fused AdamW instead of the
    # BertAdam it ran: its update issues far fewer launches, so it is predicted faster
    out, fused = tmp_path / "as-run.json", tmp_path / "fused.json"
    only = "--only=lambda-bertB-a100sxm80-fp32"
    assert _script().main([str(CSV), str(out), only]) == 0
    assert _script().main([str(CSV), str(fused), only, "--set=optimizer_impl="]) == 0
    run = json.loads(out.read_text())["results"]["rows"][0]
    other = json.loads(fused.read_text())
    assert run["optimizer_impl"] == "bertadam" and other["config"]["set_columns"] == {
        "optimizer_impl": ""}
    assert other["results"]["rows"][0]["ratio"] > 1.02 * run["ratio"]
    with pytest.raises(SystemExit, match="not a column"):
        _script().main([str(CSV), str(out), "--set=colour=red"])
    with pytest.raises(SystemExit, match="its own OUT.json"):
        _script().main(["--set=optimizer_impl="])


def test_an_experiments_efficiency_model_is_a_command_not_an_uncommitted_edit(monkeypatch):
    # --fitted=NAME=VALUE reads the table as an edit of efficiency.FITTED would, and
    # --efficiency=[DEVICE:]NAME=VALUE as `dlperf analyze --efficiency` on that preset: an
    # experiment's numbers then come from a clean commit (the edit saved in its config)
    from dataclasses import replace

    import dlperf.hardware.efficiency as eff

    vp = _script()
    v100, geforce, a100 = ("lambda-bertB-v100-fp16", "lambda-bertB-3090-fp16",
                           "lambda-bertB-a100sxm80-fp16")
    rows = [r for r in vp.read_rows(CSV) if r["id"] in (v100, geforce, a100)]
    captured = vp.capture_rows(rows)

    def predict(**kwargs):
        return {r["id"]: r["predicted_img_s"]
                for r in vp.predict_rows(rows, captured=captured, **kwargs)}

    shipped = predict()
    fitted = predict(edits=vp.efficiency_edits(["tensor_gemm=0.4"], []))
    monkeypatch.setattr(eff, "FITTED", replace(eff.FITTED, tensor_gemm=0.4))
    assert fitted == predict()  # exactly what the edit of FITTED gives
    monkeypatch.undo()
    # the V100 and the GeForce keep their own GEMM shares; the A100's GEMMs slow to 0.4/0.779
    assert fitted[v100] == shipped[v100] and fitted[geforce] == shipped[geforce]
    assert fitted[a100] < 0.95 * shipped[a100]
    # one preset: the 3090 at the shared share (0.779 below its own 1.0), the rest as shipped
    one = predict(edits=vp.efficiency_edits([], ["rtx3090:tensor_gemm=0.779"]))
    assert one[geforce] < 0.97 * shipped[geforce]
    assert (one[v100], one[a100]) == (shipped[v100], shipped[a100])
    # no preset named: every preset's, as `dlperf analyze --efficiency` sets it
    every = predict(edits=vp.efficiency_edits([], ["tensor_gemm=0.4"]))
    assert all(every[i] < 0.97 * shipped[i] for i in shipped) and every[a100] == fitted[a100]
    assert vp.efficiency_edits([], []) is None
    for args, needle in (((["tensor=0.5"], []), "unknown efficiency parameter 'tensor'"),
                         ((["tensor_gemm=fast"], []), "--fitted 'tensor_gemm=fast'"),
                         (([], ["gtx9000:memory=0.5"]), "gtx9000"),
                         (([], ["memory=5"]), "fraction of peak")):
        with pytest.raises(SystemExit, match=needle):
            vp.efficiency_edits(*args)
    with pytest.raises(SystemExit, match="its own OUT.json"):
        vp.main(["--fitted=tensor_gemm=0.4"])


def test_speedup_pairs_compare_predicted_and_measured_gains():
    def row(id_, precision, layout, measured, predicted, flag="clean", model="resnet50",
            source="s"):
        return dict(id=id_, precision=precision, layout=layout, measured_img_s=measured,
                    predicted_img_s=predicted, flag=flag, model=model, source=source)

    rows = [row("timm-nhwc-resnet50-3090-amp", "amp", "nhwc", 1470, 1280),
            row("timm-resnet50-3090-amp", "amp", "nchw", 1000, 1000),
            row("lambda-rn50-a100-amp", "amp", "nchw", 1500, 1500, source="lambda-x"),
            row("lambda-rn50-a100-tf32", "tf32", "nchw", 1000, 1200, source="lambda-x"),
            row("lambda-bertB-a100-fp16", "fp16-o2", "nchw", 300, 330, model="bert-base"),
            row("lambda-bertB-a100-fp32", "tf32", "nchw", 150, 150, model="bert-base"),
            # a flagged row pairs with nothing; an unpaired row is left out
            row("dle-rn50-v100-16-amp", "amp", "nhwc", 1200, 1200, flag="suspect"),
            row("dle-rn50-v100-16-fp32", "fp32", "nchw", 400, 400),
            row("skb-rn50-v100-amp-nhwc", "amp", "nhwc", 1154, 1154)]
    gains = _script().speedups(rows)
    (cl,) = gains["channels_last"]["rows"]
    # channels_last: measured 1470 / 1000 = 1.47x, predicted 1280 / 1000 = 1.28x: 0.8707
    assert (cl["fast"], cl["slow"]) == ("timm-nhwc-resnet50-3090-amp", "timm-resnet50-3090-amp")
    assert cl["ratio"] == pytest.approx(1.28 / 1.47)
    mp = gains["mixed_precision"]
    # ResNet-50: measured 1.5x, predicted 1500 / 1200 = 1.25x: 0.8333; BERT: 2.0x vs 2.2x: 1.1
    assert mp["by_group"]["lambda-resnet50-nchw"]["median_ratio"] == pytest.approx(1.25 / 1.5)
    assert mp["by_group"]["bert"]["median_ratio"] == pytest.approx(1.1)
    assert mp["pairs"] == 2 and mp["median_abs_error"] == pytest.approx((1 / 6 + 0.1) / 2)


@pytest.mark.slow
def test_fit_script_fits_and_holds_sources_out(tmp_path, capsys):
    # Three small rows from two sources: the fit runs end to end, lowers the in-sample error
    # below the unfitted constants', and predicts every row of each source with a fit that
    # never saw it (held out).
    fit = load_benchmark("fit_efficiency")
    lines = [line for line in CSV.read_text().splitlines() if not line.startswith("#")]
    wanted = ("skb-rn50-v100-amp-nhwc", "skb-rn50-v100-fp32-nchw", "dle-rn50-v100-16-amp",
              "dle-effb0-v100-16-fp32")
    small = tmp_path / "small.csv"
    small.write_text("\n".join([lines[0]] + [line for line in lines[1:]
                                              if line.split(",")[0] in wanted]) + "\n")
    out = tmp_path / "fit.json"
    assert fit.main([str(small), str(out)]) == 0
    res = json.loads(out.read_text())["results"]
    assert len(res["rows"]) == 4 and set(res["folds"]) == {"dle-efficientnet",
                                                             "dle-resnet50v1.5",
                                                             "skb-pytorch-experiments"}
    assert all(r["ratio_held_out"] > 0 for r in res["rows"])
    assert (res["summary_in_sample"]["clean"]["median_abs_error"]
            <= res["summary_constants_0.8_0.85_two_pass"]["clean"]["median_abs_error"])
    for name, (lo, hi) in fit.BOUNDS.items():
        assert lo <= res["parameters"][name] <= hi
    # --own-share with every shared parameter held: only the V100s' two shares are searched
    # (the four rows are all V100s), and they fit the rows at least as well as the presets'
    held = [f"{name}={value}" for name, value in res["parameters"].items()]
    own = tmp_path / "own.json"
    args = [str(small), str(own), "--own-share", "v100-sxm2"]
    for pair in held:
        args += ["--fix", pair]
    assert fit.main(args) == 0
    got = json.loads(own.read_text())["results"]
    assert got["own_share_presets"] == ["v100-sxm2"]
    assert {k: got["parameters"][k] for k in fit.BOUNDS} == pytest.approx(res["parameters"])
    for name, (lo, hi) in fit.OWN.items():
        assert lo <= got["parameters"][name] <= hi
    # an own share can be held too (--fix own_cuda_core=...): only the GEMM share is searched
    assert fit.main(args + ["--fix", "own_cuda_core=0.8"]) == 0
    half = json.loads(own.read_text())["results"]["parameters"]
    assert half["own_cuda_core"] == 0.8 and half["own_tensor_gemm"] != 0.8

    def loss(result):  # the fit's objective: the mean squared log ratio over the clean rows
        return sum(math.log(r["ratio_in_sample"]) ** 2 for r in result["rows"]) / 4

    assert loss(got) <= loss(res) + 1e-9  # the presets' shares are one point it searched
    with pytest.raises(SystemExit, match="unknown preset"):
        fit.main([str(small), str(own), "--own-share", "v100-sxm9"])
    # --fit-host with every other parameter held, on a table with a BertAdam row (Lambda's
    # BERT-base FP32 on a V100: the CPU bounds its update) and one source dropped: only the
    # CPU's time per launch is searched, within its bounds, and the result says what was run
    bert = tmp_path / "bert.csv"
    bert.write_text(small.read_text() + next(line for line in lines
                                             if line.startswith("lambda-bertB-v100-fp32,")) + "\n")
    host = tmp_path / "host.json"
    args = [str(bert), str(host), "--fit-host", "--drop-source", "dle-efficientnet"]
    for pair in held:
        args += ["--fix", pair]
    assert fit.main(args) == 0
    got = json.loads(host.read_text())["results"]
    assert got["dropped_sources"] == ["dle-efficientnet"] and len(got["rows"]) == 4
    assert fit.HOST_BOUNDS[0] <= got["parameters"]["host_s"] <= fit.HOST_BOUNDS[1]
    assert got["parameters"]["host_s"] != pytest.approx(10e-6)  # it moved from the estimate
    assert {k: got["parameters"][k] for k in fit.BOUNDS} == pytest.approx(res["parameters"])
    with pytest.raises(SystemExit, match="not a column"):
        fit.main([str(bert), str(host), "--set", "colour=red"])
    assert got["weight"] == "row"  # the shipped loss: every row alike
    with pytest.raises(SystemExit, match="--weight colour: choose one of row, source, device"):
        fit.main([str(bert), str(host), "--weight", "colour"])
    with pytest.raises(SystemExit, match="--own-share needs presets"):
        fit.main([str(bert), str(host), "--own-share"])
    with pytest.raises(SystemExit, match="only with --own-share"):  # it would hold nothing
        fit.main([str(bert), str(host), "--fix", "own_cuda_core=0.8"])


def test_a_presets_own_shares_for_a_fit_are_a_command_not_a_specs_edit(tmp_path, monkeypatch):
    # --efficiency DEVICE:NAME=VALUE gives a preset shares of its own for the fit exactly as an
    # edit of specs.py would (the A100-held experiment's edit): the same search, the same
    # parameters and ratios, row for row, and the edit saved with the result.
    from dataclasses import replace

    from dlperf.hardware import specs

    fit = load_benchmark("fit_efficiency")
    lines = [line for line in CSV.read_text().splitlines() if not line.startswith("#")]
    # BERT-base FP16 on an A100 and an A10: GEMM-bound, and neither preset has shares of its own
    wanted = ("lambda-bertB-a100sxm80-fp16", "lambda-bertB-a10-fp16")
    small = tmp_path / "small.csv"
    small.write_text("\n".join([lines[0]] + [line for line in lines[1:]
                                              if line.split(",")[0] in wanted]) + "\n")
    assert len(small.read_text().splitlines()) == 3, "a wanted row left the table"
    # every shared parameter but the GEMM share held, to keep the search short
    held = []
    for pair in ("tensor_conv=0.8", "grouped_conv=0.5", "cuda_core=0.8", "memory=0.85",
                 "sm_bytes_per_clock=16", "depthwise=0.4", "launch_s=4e-6", "winograd=0.5"):
        held += ["--fix", pair]
    flags = tmp_path / "flags.json"
    assert fit.main([str(small), str(flags), *held, "--efficiency", "a100-80gb:tensor_gemm=0.5",
                     "--efficiency", "a100-sxm:cuda_core=0.6"]) == 0
    by_flag = json.loads(flags.read_text())["results"]
    assert by_flag["efficiency_edits"] == {
        "fitted": {}, "devices": {"a100-80gb": {"tensor_gemm": 0.5, "cuda_core": 0.6}}}
    spec = specs.PRESETS["a100-80gb"]
    monkeypatch.setitem(specs.PRESETS, "a100-80gb", replace(
        spec, efficiency={**spec.efficiency, "tensor_gemm": 0.5, "cuda_core": 0.6}))
    edited = tmp_path / "edited.json"
    assert fit.main([str(small), str(edited), *held]) == 0
    by_edit = json.loads(edited.read_text())["results"]
    assert by_flag["parameters"] == pytest.approx(by_edit["parameters"], rel=1e-12)
    assert [r["ratio_in_sample"] for r in by_flag["rows"]] == pytest.approx(
        [r["ratio_in_sample"] for r in by_edit["rows"]], rel=1e-12)
    # DEVICE:NAME=fitted takes a preset's own entry away (the edited preset's, here): its rows
    # follow the fitted share again, as with the shipped preset
    unset = tmp_path / "unset.json"
    assert fit.main([str(small), str(unset), *held, "--efficiency", "a100:tensor_gemm=fitted",
                     "--efficiency", "a100-80gb:cuda_core=fitted"]) == 0
    by_unset = json.loads(unset.read_text())["results"]
    assert by_unset["efficiency_edits"]["fitted_on"] == {"a100-80gb": ["cuda_core",
                                                                       "tensor_gemm"]}
    monkeypatch.setitem(specs.PRESETS, "a100-80gb", spec)
    plain = tmp_path / "plain.json"
    assert fit.main([str(small), str(plain), *held]) == 0
    shipped_fit = json.loads(plain.read_text())["results"]
    assert by_unset["parameters"] == pytest.approx(shipped_fit["parameters"], rel=1e-12)
    # and it is an edit: against the shipped presets the A100 row moves (its GEMMs at 0.5, not
    # the fitted share, which only the A10 row now sets)
    shipped = {r["id"]: r["ratio_in_sample"] for r in shipped_fit["rows"]}
    mine = {r["id"]: r["ratio_in_sample"] for r in by_flag["rows"]}
    assert abs(mine["lambda-bertB-a100sxm80-fp16"] / shipped["lambda-bertB-a100sxm80-fp16"]
               - 1) > 0.05
    for bad, message in ((["--efficiency", "tensor_gemm=0.5"], "name a preset"),
                         (["--efficiency", "a100-80gb:memory=0.9"], "honours a preset's"),
                         (["--efficiency", "a100-99gb:tensor_gemm=0.5"], "unknown device"),
                         (["--efficiency", "a100-99gb:tensor_gemm=fitted"], "unknown device"),
                         (["--efficiency", "a100:tensor_gemm=fitted"], "no tensor_gemm of its"),
                         (["--efficiency", "a100-80gb:tensor_gemm=7"], "tensor_gemm"),
                         (["--efficiency"], "needs DEVICE:NAME=VALUE")):
        with pytest.raises(SystemExit, match=message):
            fit.main([str(small), str(flags), *bad])
    with pytest.raises(SystemExit, match="are experiments"):
        fit.main(["--efficiency", "a100-80gb:tensor_gemm=0.5"])


def test_rows_measured_before_pytorch_2_capture_attention_unfused():
    # timm's benchmark files of PyTorch 1.12 predate F.scaled_dot_product_attention: their ViTs
    # ran q @ k^T, a softmax and @ v as separate kernels, which the capture must see
    pytest.importorskip("timm")
    vp = _script()
    rows = [r for r in vp.read_rows(CSV) if r["model"] == "timm:vit_small_patch16_224"]
    old = next(r for r in rows if "-pt112-" in r["source"])
    assert vp._before_sdpa(old)
    assert not vp._before_sdpa({**old, "source": "lambda-deeplearning-benchmark"})
    (_, _, costs, _, _), = vp.capture_rows([{**old, "batch": 2}])
    ops = {c.op for c in costs}
    assert "bmm" in ops and "_softmax" in ops and "attention" not in ops
    (_, _, fused, _, _), = vp.capture_rows([{**old, "batch": 2, "source": "new"}])
    assert "attention" in {c.op for c in fused}


def test_relative_scaling_compares_one_configuration_across_gpu_counts():
    vs = load_benchmark("validate_scaling")

    def row(id_, gpus, batch, measured, predicted, **kw):
        return {"id": id_, "source": "s", "model": "m", "device": "d", "image_size": 224,
                "batch": batch, "precision": "amp", "strategy": "ddp",
                "activation_checkpointing": False, "checkpoint_policy": "full", "gpus": gpus,
                "measured_per_gpu": measured, "predicted_per_gpu": predicted, **kw}

    rows = [row("a8", 8, 128, 100.0, 110.0), row("a64", 64, 128, 90.0, 110.0),
            # another 8-GPU system of the same GPU: not a scaling pair
            row("b8", 8, 128, 105.0, 110.0),
            # another batch: its own group, with no second count
            row("c64", 64, 256, 80.0, 100.0),
            # the same runs compiled (torchtitan's tables publish both): compared with the
            # compiled 8-GPU run, not the eager one (the first scoring did: 120 / 100)
            row("a8-compile", 8, 128, 120.0, 130.0, fusion="compile-blocks"),
            row("a64-compile", 64, 128, 114.0, 130.0, fusion="compile-blocks")]
    vs.add_relative_scaling(rows)
    by_id = {r["id"]: r for r in rows}
    # compiled: measured 114 / 120 = 0.95, predicted 130 / 130 = 1.0
    assert by_id["a64-compile"]["relative_base"] == "a8-compile"
    assert by_id["a64-compile"]["relative_measured"] == pytest.approx(0.95)
    assert by_id["a8-compile"]["relative_ratio"] is None
    # 64 vs 8 GPUs: measured 90 / 100 = 0.9, predicted 110 / 110 = 1.0, ratio 1.0 / 0.9
    assert by_id["a64"]["relative_measured"] == pytest.approx(0.9)
    assert by_id["a64"]["relative_ratio"] == pytest.approx(1 / 0.9)
    assert by_id["b8"]["relative_ratio"] is None and by_id["a8"]["relative_ratio"] is None
    assert by_id["c64"]["relative_ratio"] is None
    # a suspect row is neither a base nor compared: without the flag the 32-GPU run (half the
    # rate of its 16- and 64-GPU siblings) would be the 64-GPU run's base, 100 / 50 = 2.0
    rows = [row("d32", 32, 10, 50.0, 100.0, flag="suspect: slower than its siblings"),
            row("d64", 64, 10, 100.0, 100.0, flag="clean"),
            row("d128", 128, 10, 98.0, 100.0, flag="clean")]
    vs.add_relative_scaling(rows)
    by_id = {r["id"]: r for r in rows}
    assert by_id["d32"]["relative_ratio"] is None and by_id["d64"]["relative_ratio"] is None
    assert by_id["d128"]["relative_base"] == "d64"
    assert by_id["d128"]["relative_measured"] == pytest.approx(0.98)  # 98 / 100
    # two systems of one GPU at two counts each (NVIDIA's BERT tables: DGX-1 and DGX-2, 4 and 8
    # GPUs): each 8-GPU run is compared with its own system's 4 (DGX-2: 95 / 100), not with
    # whichever 4-GPU run comes first (the DGX-1's: 95 / 90 = 1.056)
    dgx1, dgx2 = ("nvlink2-dgx1,ib-edr", 8), ("nvlink2-dgx2,ib-edr", 16)
    rows = [row(f"{name}-x{g}", g, 10, measured, 100.0, interconnect=ic, gpus_per_node=n)
            for name, (ic, n), g, measured in (("dgx1", dgx1, 4, 90.0), ("dgx1", dgx1, 8, 88.0),
                                                ("dgx2", dgx2, 4, 100.0), ("dgx2", dgx2, 8, 95.0))]
    vs.add_relative_scaling(rows)
    by_id = {r["id"]: r for r in rows}
    assert by_id["dgx2-x8"]["relative_base"] == "dgx2-x4"
    assert by_id["dgx2-x8"]["relative_measured"] == pytest.approx(0.95)
    assert by_id["dgx1-x8"]["relative_measured"] == pytest.approx(88 / 90)


def test_float8_pairs_match_each_fp8_run_with_its_bf16_sibling():
    vs = load_benchmark("validate_scaling")

    def row(id_, measured, predicted, fp8=None):
        return {"id": id_, "fp8": fp8, "fp8_all_gather": False,
                "measured_per_gpu": measured, "predicted_per_gpu": predicted}

    rows = [row("t-compile", 100.0, 100.0), row("t-float8", 125.0, 130.0, "tensorwise"),
            row("t-rowwise", 110.0, 118.0, "rowwise"),
            # TransformerEngine's run: the BF16 sibling is the id without "-fp8"
            row("m", 200.0, 190.0), row("m-fp8", 230.0, 228.0, "delayed"),
            # a TE run whose BF16 twin ran another micro-batch: its id names no sibling
            row("m-mb2-fp8", 240.0, 230.0, "delayed")]
    pairs = {p["float8"]: p for p in vs.float8_pairs(rows)}
    assert set(pairs) == {"t-float8", "t-rowwise", "m-fp8"}
    assert pairs["t-rowwise"]["bf16"] == "t-compile" and pairs["m-fp8"]["bf16"] == "m"
    # measured 230 / 200 = 1.15, predicted 228 / 190 = 1.2, ratio 1.2 / 1.15
    assert pairs["m-fp8"]["measured_speedup"] == pytest.approx(1.15)
    assert pairs["m-fp8"]["predicted_speedup"] == pytest.approx(1.2)
    assert pairs["m-fp8"]["ratio"] == pytest.approx(1.2 / 1.15)
    assert pairs["m-fp8"]["recipe"] == "delayed"
    assert pairs["t-float8"]["measured_speedup"] == pytest.approx(1.25)


def test_compile_pairs_compare_the_published_and_predicted_speedups():
    vs = load_benchmark("validate_scaling")
    rows = [{"id": "a", "fusion": "none", "measured_per_gpu": 100.0, "predicted_per_gpu": 90.0},
            {"id": "a-compile", "fusion": "compile", "measured_per_gpu": 120.0,
             "predicted_per_gpu": 117.0},
            # a compiled row without an eager sibling: no pair
            {"id": "b-compile", "fusion": "compile", "measured_per_gpu": 1.0,
             "predicted_per_gpu": 1.0}]
    (pair,) = vs.compile_pairs(rows)
    # measured 120 / 100 = 1.2; predicted 117 / 90 = 1.3; ratio 1.3 / 1.2
    assert (pair["compiled"], pair["eager"]) == ("a-compile", "a")
    assert pair["measured_speedup"] == pytest.approx(1.2)
    assert pair["predicted_speedup"] == pytest.approx(1.3)
    assert pair["ratio"] == pytest.approx(1.3 / 1.2)


def test_ibm_compile_rows_are_the_blogs_mfu_times_tokens_per_mfu():
    # pytorch.org/blog/maximizing-training-throughput gives MFU only; tokens/s per GPU are the
    # MFU times the earlier blog's tokens per MFU for the model and GPU: 7B A100 compiled
    # 3,700 x 0.68 / 0.57 = 4,414.0; 70B H100 at 464 GPUs eager 800 x 0.32 / 0.34 = 752.9,
    # compiled 800 x 0.38 / 0.34 = 894.1
    vs = load_benchmark("validate_scaling")
    rows = {r["id"]: r for r in vs.read_rows(ROOT / "benchmarks/validation/published_scaling.csv")}
    assert rows["ibm-llama2-7b-a100-x128-compile"]["measured_per_gpu"] == 4414
    assert rows["ibm-llama2-70b-h100-x464"]["measured_per_gpu"] == 753
    assert rows["ibm-llama2-70b-h100-x464-compile"]["measured_per_gpu"] == 894
    for id_, row in rows.items():
        if id_.endswith("-compile"):
            assert row["fusion"] in ("compile", "compile-blocks"), id_


def test_added_ms_reads_scaling_loss_as_time_per_step():
    vs = load_benchmark("validate_scaling")
    # the record blog's DGX-1: 256 images a step, 1,075 img/s on one V100, 7,850 / 8 = 981.25
    # on eight: 256 / 981.25 - 256 / 1,075 = 260.89 - 238.14 = 22.75 ms more per step
    assert vs.added_ms(256, 981.25, 1075) == pytest.approx(22.752, abs=1e-3)
    # DeepLearningExamples' MXNet 18.12 (device kvstore), fp16 at batch 208: 1,442.6 img/s on
    # one GPU, 10,263.2 / 8 on eight: 208 / 1,282.9 - 208 / 1,442.6 = 17.95 ms, the same
    # order as the record's at another batch, where the percentages (8.7% and 11.1%) differ
    assert vs.added_ms(208, 10263.2 / 8, 1442.6) == pytest.approx(17.949, abs=1e-3)
    # tokens: 2 sequences x 3 micro-batches x 2,048 tokens at 4,000 tokens/s against 5,000:
    # 12,288 x (1/4,000 - 1/5,000) = 0.6144 s
    assert vs.added_ms(2 * 3 * 2048, 4000, 5000) == pytest.approx(614.4)
    assert vs.added_ms(100, 50, 50) == 0  # perfect scaling adds nothing


@pytest.mark.parametrize("name", ["published_training.csv", "published_scaling.csv"])
def test_every_validation_row_has_exactly_the_headers_columns(name):
    # A comma inside an unquoted note shifts every later column: a flagged row of the B200
    # once read its source as "076 img/s) is no faster than its TF32 (2" and grouped under it.
    import csv

    lines = [line for line in (ROOT / "benchmarks/validation" / name).read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    header, *rows = list(csv.reader(lines))
    bad = [row[0] for row in rows if len(row) != len(header)]
    assert not bad, f"{name}: rows with {len(header)} columns expected: {bad}"


def test_validate_tp_compares_tensor_parallel_with_fsdp_on_as_many_gpus():
    tp = load_benchmark("validate_tp")
    rows = [{"run": "FSDP=4", "gpus": 4, "tp": 1, "measured_per_gpu": 100.0,
             "predicted_per_gpu": 60.0},
            {"run": "TP=4", "gpus": 4, "tp": 4, "measured_per_gpu": 65.0,
             "predicted_per_gpu": 51.0},
            # no FSDP row on 8 GPUs: nothing to compare against
            {"run": "TP=4+FSDP=2", "gpus": 8, "tp": 4, "measured_per_gpu": 55.0,
             "predicted_per_gpu": 50.0}]
    pairs = tp.relative(rows)
    # TP=4 over FSDP=4: measured 65 / 100 = 0.65, predicted 51 / 60 = 0.85, 0.85 / 0.65 = 1.308
    assert [p["run"] for p in pairs] == ["TP=4"]
    assert pairs[0]["measured"] == pytest.approx(0.65)
    assert pairs[0]["predicted"] == pytest.approx(0.85)
    assert pairs[0]["ratio"] == pytest.approx(0.85 / 0.65)
    # the runs are the report's: GPUs = tp x FSDP degree, and every count fills the nodes of 4
    for run, gpus, degree, strategy, batch, accum, measured in tp.RUNS:
        assert gpus % degree == 0 and (gpus <= 4 or gpus % 4 == 0) and measured > 0


def test_megatron_flops_are_the_tables_teraflops():
    tp = load_benchmark("validate_tp")
    # 1B on a DGX A100: 96 x 16 x 1,024 x 24 x 1,920^2 = 1.39157e14, x (1 + 1,024 / 11,520 +
    # 51,200 / (16 x 24 x 1,920) = 1.15833) = 1.61190e14 FLOPs; over 1.076 s: 149.8 TFLOP/s
    assert tp.megatron_flops(24, 1920, 16) == pytest.approx(1.61190e14, rel=1e-5)
    # every published TeraFLOP/s is that count over the iteration time and the GPUs
    for _, _, _, batch, _, cases in tp.MEGATRON_SYSTEMS:
        for case, (ms, tflops) in cases.items():
            layers, hidden, _, degree = tp.MEGATRON_CASES[case]
            flops = tp.megatron_flops(layers, hidden, batch) / degree / (ms / 1000)
            assert flops / 1e12 == pytest.approx(tflops, rel=1e-3), case  # to 0.07 of 109.3


def test_megatron_core_flops_are_its_training_loop_s_count():
    tp = load_benchmark("validate_tp")

    def megatron(layers, hidden, batch, seq=4096, vocab=131072):
        # megatron/training/training.py num_floating_point_operations (r0.8.0), multi-head
        # attention (query groups = heads, kv channels x heads = hidden), 4h MLP, no SwiGLU
        return 12 * batch * seq * layers * hidden * hidden * (
            (1 + 1 + seq / hidden) * 1 + 4 * hidden / hidden * 1 * 1
            + vocab / (2 * layers * hidden))

    # 1.7B: 72 x 192 x 4,096 x 24 x 2,048^2 = 5.7000e15, x (1 + 4,096 / 12,288 + 131,072 /
    # (12 x 24 x 2,048) = 1.55556) = 8.8667e15 FLOPs an iteration
    assert tp.megatron_core_flops(24, 2048, 192) == pytest.approx(8.8667e15, rel=1e-4)
    for model, heads, hidden, layers, degree, stages, gpus, batch, tflops in tp.MCORE_2024:
        assert tp.megatron_core_flops(layers, hidden, batch) == pytest.approx(
            megatron(layers, hidden, batch), rel=1e-12)
        # the table's shape: 48 replicas of TP x PP, each stage an equal share of the blocks
        assert gpus == degree * stages * tp.MCORE_REPLICAS and layers % stages == 0
        assert hidden % heads == 0 and hidden // heads == 128  # every head 128 wide
    # the variants where the table is silent: micro-batches (no stages) or the schedule
    assert tp.mcore_variants(tp.MCORE_2024[0]) == [(1, 1), (1, 4)]
    assert tp.mcore_variants(tp.MCORE_2024[-1]) == [(1, 1), (7, 1)]
    args = tp.mcore_args(112, 18432, 144, 8, 16, 6144, 3072, virtual=7)
    # 64 micro-batches of one, interleaved and overlapped; 48M-parameter fp32 buckets
    assert args[args.index("--grad-accum") + 1] == "64" and "--pp-overlap-p2p" in args
    assert args[args.index("--bucket-cap-mb") + 1] == "183.1"
    assert "--pp-overlap-p2p" not in tp.mcore_args(112, 18432, 144, 8, 16, 6144, 3072)


def test_megatron_runs_are_compared_with_tp1_and_with_one_node():
    tp = load_benchmark("validate_tp")

    def row(system, case, degree, replicas, flops, measured, predicted):
        return {"system": system, "case": case, "run": f"{case} TP={degree}",
                "device": "a100-40gb", "tp": degree, "replicas": replicas,
                "model_flops": flops, "measured_step_s": measured,
                "predicted_step_s": predicted}

    rows = [row("node", "1B", 1, 1, 100.0, 1.0, 1.2), row("node", "8B", 8, 1, 720.0, 1.25, 1.4),
            row("dp", "1B", 1, 128, 100.0, 1.1, 1.25), row("dp", "8B", 8, 128, 720.0, 1.3, 1.5)]
    pairs = tp.against_tp1(rows)
    # node 8B: 720 / 8 / 1.25 = 72 FLOP/s a GPU over 100 / 1.0 = 0.72 measured; predicted
    # 90 / 1.4 = 64.29 over 100 / 1.2 = 83.33: 0.7714; ratio 0.7714 / 0.72 = 1.0714
    first = pairs[0]
    assert (first["system"], first["run"], first["against"]) == ("node", "8B TP=8", "1B TP=1")
    assert first["measured"] == pytest.approx(0.72)
    assert first["predicted"] == pytest.approx(0.771428, rel=1e-5)
    assert first["ratio"] == pytest.approx(1.071428, rel=1e-5)
    assert [p["system"] for p in pairs] == ["node", "dp"]
    # with Megatron's fused kernels both steps faster (TP=1 1.0 s, TP=8 1.3 s): 90 / 1.3 =
    # 69.23 over 100 / 1.0 = 100: 0.6923, over 0.72 measured = 0.9615
    fused = tp.against_tp1([dict(rows[0], predicted_fused_step_s=1.0),
                            dict(rows[1], predicted_fused_step_s=1.3)])
    assert fused[0]["ratio_fused"] == pytest.approx(0.961538, rel=1e-5)
    assert "ratio_fused" not in first  # no fused prediction: no such ratio
    # 128 replicas over one node: 1B measured 1.0 / 1.1 = 0.9091, predicted 1.2 / 1.25 = 0.96
    dp = tp.against_one_node(rows)
    assert [(p["run"], p["against"]) for p in dp] == [("1B TP=1", "node"), ("8B TP=8", "node")]
    assert dp[0]["measured"] == pytest.approx(1 / 1.1)
    assert dp[0]["predicted"] == pytest.approx(0.96)
    assert dp[1]["ratio"] == pytest.approx((1.4 / 1.5) / (1.25 / 1.3))


def test_megatron_2022_layer_times_add_the_blocks_collectives():
    tp = load_benchmark("validate_tp")

    def result(sp, recompute, beside=0, exposed=5.0):
        kernel = [("blocks.1.attn.qkv", "mm", "forward", 3.0),
                  ("blocks.1.attn", "bmm", "forward", 1.0),
                  ("blocks.1.attn.qkv", "mm", "dgrad", 3.0),
                  ("blocks.1.attn.qkv", "mm", "wgrad", 3.0),
                  ("blocks.0.attn.qkv", "mm", "forward", 50.0)]  # another block: not counted
        if recompute:
            kernel.append(("blocks.1.attn.qkv", "mm", "recompute", 3.0))
        layers = [{"module": m, "op": op, "phase": ph, "predicted_time_s": t}
                  for m, op, ph, t in kernel]
        # 10 collectives a micro-batch busy 5 s in all: 0.5 s each
        tensor = {"busy_s": 5.0, "exposed_s": exposed, "collectives_per_micro_batch": 10,
                  "sequence_parallel": sp, "beside_gemms": beside}
        return {"layers": layers, "scale_out": {"at_requested_scale": {
            "grad_accum": 1, "communication": {"tensor_parallel": tensor}}}}

    # all-reduces: forward 4 + 2 x 0.5 = 5; backward 3 + 3 + 2 x 0.5 = 7
    assert tp.layer_times(result(False, False), 2) == pytest.approx((5.0, 7.0))
    # sequence parallel: an all-gather and a reduce-scatter per region: 4 calls a pass
    assert tp.layer_times(result(True, False), 2) == pytest.approx((6.0, 8.0))
    # a replayed GEMM: its 3 s and the replay's 2 all-reduces
    assert tp.layer_times(result(False, True), 2) == pytest.approx((5.0, 11.0))
    # Megatron's (2 blocks: 5 column-parallel layers). Without sequence parallelism the
    # backward's 2 all-reduces of the block run beside its GEMMs: of the 10, 5 beside, and 4
    # exposed in all, so the 5 beside leave 4 - 5 x 0.5 = 1.5 s, the block's 2 / 5 of it 0.6:
    # backward 3 + 3 + 0.6
    assert tp.layer_times(result(False, False, beside=5, exposed=4.0), 2) == pytest.approx(
        (5.0, 6.6))
    # with it: of the pair's 4 calls, the all-gather of the backward stays exposed and the
    # reduce-scatter runs beside (with the re-gathers): 2 x 0.5 a block, then 2 / 5 of the
    # 4 - 5 x 0.5 the 5 beside leave: 3 + 3 + 1 + 0.6
    assert tp.layer_times(result(True, False, beside=5, exposed=4.0), 2) == pytest.approx(
        (6.0, 7.6))


def test_narayanan_runs_are_compared_with_their_fewest_replicas():
    tp = load_benchmark("validate_tp")
    rows = [{"model": "175B", "gpus": 384, "replicas": 4, "measured_tflops": 153.0,
             "predicted_tflops": 139.0},
            {"model": "175B", "gpus": 1536, "replicas": 16, "measured_tflops": 141.0,
             "predicted_tflops": 125.0},
            {"model": "530B", "gpus": 560, "replicas": 2, "measured_tflops": 171.0,
             "predicted_tflops": 166.0}]
    pairs = tp.against_fewest_replicas(rows)
    # 175B: measured 141 / 153 = 0.9216, predicted 125 / 139 = 0.8993; 0.9758 of it
    assert [(p["model"], p["gpus"], p["against_gpus"]) for p in pairs] == [("175B", 1536, 384)]
    assert pairs[0]["measured"] == pytest.approx(141 / 153)
    assert pairs[0]["ratio"] == pytest.approx((125 / 139) / (141 / 153))
    # and the runs are whole pipelines of TP=8: GPUs a multiple of 8 x stages
    for model, layers, hidden, heads, stages, batch, gpus, tflops in tp.NARAYANAN_PTD:
        assert gpus % (8 * stages) == 0 and layers % stages == 0
        assert batch % (gpus // (8 * stages)) == 0
    # Megatron-LM's README example (held out): 1,024 GPUs = 8 replicas of TP=8 x 16 stages of 6
    # blocks, 192 micro-batches each; its two figures agree by Megatron's count: 96 x 1,536 x
    # 2,048 x 96 x 12,288^2 x (1 + 2,048 / (6 x 12,288) + 51,200 / (16 x 96 x 12,288))
    # = 4.377e18 x 1.0305 = 4.511e18 FLOP an iteration, / 32 s / 1,024 = 137.7 TFLOP/s ("138")
    model, layers, hidden, heads, stages, batch, gpus, tflops, step = tp.MEGATRON_README_2021
    assert gpus // (8 * stages) == 8 and layers // stages == 6 and batch // 8 == 192
    assert tp.megatron_flops(layers, hidden, batch, seq=2048) == pytest.approx(4.511e18,
                                                                               rel=1e-3)
    assert tp.megatron_flops(layers, hidden, batch, seq=2048) / step / gpus / 1e12 \
        == pytest.approx(tflops, abs=0.5)


def test_compile_bounds_remove_what_each_bound_says():
    import dataclasses
    from types import SimpleNamespace

    exp = load_benchmark("experiment_compile_bounds")

    @dataclasses.dataclass(frozen=True)
    class Cost:
        op: str
        bytes: int
        output_bytes: int
        kernels: int

    def pred(op, bound, t, nbytes=100, out=40, kernels=1):
        return SimpleNamespace(cost=Cost(op, nbytes, out, kernels), bound=bound, time_s=t)

    # a GEMM 5 s (compute), a LayerNorm 2 s (memory, not pointwise), an add 1 s and a mul 1 s
    # (memory, pointwise), and a mul already fused away (no kernel: left alone)
    preds = [pred("mm", "compute", 5.0), pred("native_layer_norm", "memory", 2.0),
             pred("add", "memory", 1.0), pred("mul", "memory", 1.0),
             pred("mul", "memory", 0.0, kernels=0)]
    # re-timed when fused: 100 - 2 x 40 = 20 bytes, at 1 s per 100 bytes: 0.2 s
    b = exp.bounds(preds, lambda c: SimpleNamespace(time_s=c.bytes / 100), frozenset({"add",
                                                                                         "mul"}))
    assert b["predicted"] == pytest.approx(9.0)
    assert b["producer"] == pytest.approx(9.0 - 2 * (1.0 - 0.4))  # max(20, 40) bytes: 0.4 s
    assert b["pointwise"] == pytest.approx(7.0)  # the add and the mul gone
    assert b["math"] == pytest.approx(5.0)  # every memory-bound kernel gone


def test_published_memory_rows_join_the_scaling_table_and_their_differences_subtract():
    # every measured peak names a row of published_scaling.csv; the differences between runs
    # are the later run's peak less the earlier's, measured and predicted (8 -> 128 GPUs:
    # 67.0 - 82.4 = -15.4 GiB measured)
    vm = load_benchmark("validate_memory")
    vs = load_benchmark("validate_scaling")
    measured = vm.read_measured(vm.MEMORY_CSV)
    ids = {r["id"] for r in vs.read_rows(vm.SCALING_CSV)}
    assert measured and set(measured) <= ids
    assert measured["tt-llama3-8b-h100-x8"] == {"measured_gib": 82.4, "kind": "reserved"}
    rows = [{"id": "tt-llama3-8b-h100-x8", "measured_gib": 82.4, "predicted_gib": 52.5},
            {"id": "tt-llama3-8b-h100-x128", "measured_gib": 67.0, "predicted_gib": 38.5}]
    (pair,) = vm.differences(rows)
    assert pair["what"] == "8 -> 128 GPUs (eager)"
    assert pair["measured_gib"] == pytest.approx(-15.4)
    assert pair["predicted_gib"] == pytest.approx(-14.0)


def test_the_memory_record_says_how_far_the_peaks_were():
    from dlperf.hardware.track_record import build_memory, describe_memory

    # two runs: 50 of 80 GiB (0.625x, 30 GiB short over 16,384 tokens: 1.97 MB a token) and
    # 30 of 40 (0.75x, 10 GiB over 8,192 tokens: 1.31 MB a token)
    result = {"rows": [{"id": "a", "source": "s", "measured_gib": 80.0, "predicted_gib": 50.0,
                        "ratio": 0.625, "missing_gib": 30.0, "kind": "reserved",
                        "tokens": 16384},
                       {"id": "b", "source": "s", "measured_gib": 40.0, "predicted_gib": 30.0,
                        "ratio": 0.75, "missing_gib": 10.0, "kind": "reserved",
                        "tokens": 8192}],
              "summary": {"median_ratio": 0.6875}}
    text = describe_memory({"memory": build_memory(result)})
    assert "against 2 published peaks (s:" in text and "0.62-0.75x" in text
    assert "median 0.69x" in text and "1.31-1.97 MB a token" in text
    assert "judged at the step's peak" in text
    assert describe_memory({}) is None


def test_a_token_models_memory_per_gpu_carries_the_published_peaks(capsys):
    # the scale-out's memory per GPU of a token model is followed by what the published
    # peaks said of it (the shipped record, benchmarks/validate_memory.py); an image model's
    # (no logits over a vocabulary, no published peak) is not
    gpt = ["analyze", "gpt", "--layers", "2", "--d-model", "256", "--heads", "4",
           "--seq-len", "256", "--batch-size", "2", "--train", "--precision", "fsdp",
           "--dtype", "bf16", "--gpus", "8", "--strategy", "fsdp"]
    code, out, err = run_cli(gpt, capsys)
    assert code == 0, err
    assert "Memory per GPU is judged at the step's peak" in " ".join(out.split())
    assert "against 12 published peaks" in " ".join(out.split())
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--batch-size", "32",
                              "--gpus", "8"], capsys)
    assert code == 0, err
    assert "published peaks" not in out


def test_llm_foundry_2023_05_rows_are_its_pure_bf16_tables():
    # llm-foundry 5f43bf16, "A100 40GB" and "A100 80GB": every row PURE (bf16 reduce), RoCE at
    # 1600 Gbps per node of 8 (roce-200g), tokens/s per GPU as published. Their MFU column
    # checks the reading: MFU = tokens/s/GPU x (6 N + 12 L d s) / 312 TFLOP/s (A100 bf16), e.g.
    # 7B at 2,048 tokens on 8 x 40GB: 3,679 x (6 x 6,658,859,008 + 12 x 32 x 4,096 x 2,048)
    # / 312e12 = 3,679 x 4.3174e10 / 312e12 = 50.91% (published 50.92); 70B on 128 x 40GB:
    # 376 x (6 x 64,862,437,376 + 12 x 80 x 8,192 x 2,048) / 312e12 = 376 x 4.0528e11 / 312e12
    # = 48.84% (published 48.91: the table rounds 48,194 / 128 = 376.5 tokens/s down)
    vs = load_benchmark("validate_scaling")
    rows = [r for r in vs.read_rows(ROOT / "benchmarks/validation/published_scaling.csv")
            if r["source"] == "llm-foundry-mpt-2023-05"]
    assert len(rows) == 164
    assert sum(r["device"] == "a100-40gb" for r in rows) == 78
    assert all(r["reduce_dtype"] == "bf16" and r["strategy"] == "fsdp" for r in rows)
    assert all(r["interconnect"] == "nvlink3-a100,roce-200g" for r in rows)
    by_id = {r["id"]: r for r in rows}
    flops = {"lf2305-mpt-7b-a100-40gb-x8-s2048": (6 * 6658859008 + 12 * 32 * 4096 * 2048, 0.5092),
             "lf2305-mpt-70b-a100-40gb-x128-s2048": (6 * 64862437376 + 12 * 80 * 8192 * 2048,
                                                     0.4891)}
    for id_, (per_token, mfu) in flops.items():
        assert by_id[id_]["measured_per_gpu"] * per_token / 312e12 == pytest.approx(mfu, abs=1e-3)


def test_llm_foundry_fp8_rows_pair_only_with_identical_bf16_runs():
    # the "H100 80GB FP8" table (llm-foundry b2a43a147): 7 TransformerEngine runs, 5 of them
    # with a BF16 run of the same micro-batch, accumulation and checkpointing (the pairs
    # validate_scaling.py scores FP8's speed-up on)
    vs = load_benchmark("validate_scaling")
    rows = vs.read_rows(ROOT / "benchmarks/validation/published_scaling.csv")
    te = [r for r in rows if r["source"] == "llm-foundry-mpt-fp8"]
    assert len(te) == 7 and all(r["fp8"] == "delayed" and not r["fp8_all_gather"] for r in te)
    scored = [{**r, "predicted_per_gpu": 1.0} for r in rows]
    pairs = [p for p in vs.float8_pairs(scored) if p["recipe"] == "delayed"]
    assert len(pairs) == 5
    by_id = {r["id"]: r for r in rows}
    same = ("model", "image_size", "batch", "grad_accum", "gpus", "device", "strategy",
            "activation_checkpointing", "attention_kernel", "loss", "train_metrics")
    for p in pairs:
        fp8, bf16 = by_id[p["float8"]], by_id[p["bf16"]]
        assert all(fp8[k] == bf16[k] for k in same), p
        assert bf16["fp8"] is None and bf16["source"] == "llm-foundry-mpt"
