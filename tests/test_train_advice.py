"""The advice a finished run's summary gives (pure function, no training needed)."""

from dlperf.train.advice import advice
from dlperf.train.recipes import TrainConfig


def test_input_bound_run_is_told_how_to_feed_the_model():
    lines = advice({"data_wait_share": 0.4, "compute_img_per_s": 900.0}, TrainConfig(data="x"),
                   "cpu")
    assert len(lines) == 1 and "input-bound: 40%" in lines[0] and "--max-side 256" in lines[0]
    assert "restart markers" not in lines[0]  # unknown source: no lossless step to offer
    # a JPEG folder: the lossless prepare step comes first
    files = advice({"data_wait_share": 0.4, "data_source": "files"}, TrainConfig(data="x"), "cpu")
    assert "`dlperf data prepare SRC DST`: the same pixels" in files[0]
    assert "`dlperf data inspect x`" in files[0]
    assert files[0].index("restart markers") < files[0].index("--max-side 256")
    shards = advice({"data_wait_share": 0.4, "compute_img_per_s": 900.0, "data_source": "shards"},
                    TrainConfig(data="x"), "cpu")
    assert shards == lines
    # synthetic data waits for nothing that a pipeline change would fix
    assert advice({"data_wait_share": 0.4}, TrainConfig(data="synthetic"), "cpu") == []


def test_gpu_checklist_in_the_guides_order():
    cfg = TrainConfig(dtype="fp32", channels_last=False, nonfinite_check="step")
    lines = advice({"data_wait_share": 0.0, "nonfinite_check": "step", "mfu": 0.12}, cfg, "cuda")
    keys = ["dtype=bf16", "channels_last=true", "nonfinite_check=deferred", "cuda_graphs=true",
            "dlperf analyze resnet50 --train --batch-size 256 --dtype fp32 --measure"]
    assert len(lines) == len(keys)
    for line, key in zip(lines, keys):
        assert key in line, (key, line)
    # the recipe's defaults on a GPU with a healthy MFU: nothing to say but graphs/compile
    fast = advice({"nonfinite_check": "deferred", "mfu": 0.5}, TrainConfig(compile="default"),
                  "cuda")
    assert fast == []


def test_skipped_steps_are_explained():
    lines = advice({"skipped_steps": 3}, TrainConfig(), "cpu")
    assert len(lines) == 1 and "3 steps were skipped" in lines[0]
