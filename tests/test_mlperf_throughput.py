"""benchmarks/mlperf_throughput.py: the measured rate of MLPerf Training logs (issue #14)."""

from __future__ import annotations

import pytest
from conftest import load_benchmark


def _line(key, value):
    return (':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", '
            f'"key": "{key}", "value": {value}, "metadata": {{"file": "fit.py", "lineno": 1}}}}')


def test_parse_log_and_steady_rate():
    mod = load_benchmark("mlperf_throughput")
    # epochs 1-2 are the warm-up (141,708 and 300,000 img/s), then 317,000 / 318,000 / 317,500
    rates = [141708.5, 300000.0, 317000.0, 318000.0, 317500.0]
    text = "\n".join([_line("global_batch_size", 3200), _line("eval_accuracy", 0.5)]
                     + [_line("tracked_stats", f'{{"throughput": {r}}}') for r in rates])
    log = mod.parse_log(text)
    assert log == {"throughput": rates, "global_batch": 3200}
    # the median of the last three: 317,500 img/s, i.e. 4,961 per GPU of 64
    assert mod.steady_rate(log["throughput"]) == 317500.0
    with pytest.raises(ValueError, match="too few"):
        mod.steady_rate(rates[:2])
    # step times: 3,200 images a step at 317,000 img/s = 10.0946 ms, at 318,000 10.0629, at
    # 317,500 10.0787; ten epochs or fewer, so the 10th percentile is the fastest
    steps = mod.step_ms(rates[2:], 3200)
    assert steps["min"] == pytest.approx(10.0629, abs=1e-4)
    assert steps["median"] == pytest.approx(10.0787, abs=1e-4)
    assert steps["max"] == pytest.approx(10.0946, abs=1e-4)
    assert steps["p10"] == steps["min"]


def test_v05_logs_give_epoch_rates_from_their_timestamps():
    mod = load_benchmark("mlperf_throughput")

    def line(t, key, value=None):
        return (f":::MLPv0.5.0 resnet {t} (/workspace/mlperf_log_utils.py:49) {key}"
                + ("" if value is None else f": {value}"))

    # 1,200 images an epoch, 26 a GPU on 8 GPUs. Epochs start at 0, 2, 3 (then an evaluation
    # from 4.5 to 5), 5 and 6.5; the run stops at 7.5. Rates: 1,200 / 2 = 600 and 1,200 / 1 =
    # 1,200; epoch 3's span holds the evaluation (left out), then 1,200 / 1.5 = 800; the last
    # epoch ends at run_stop, not at an epoch start (left out)
    text = "\n".join([line(0.0, "input_batch_size", 26),
                      line(0.0, "preproc_num_train_examples", 1200),
                      line(0.0, "train_epoch", 0), line(2.0, "train_epoch", 1),
                      line(3.0, "train_epoch", 2), line(4.5, "eval_start"),
                      line(4.9, "eval_accuracy", '{"epoch": 2, "value": 0.25}'),
                      line(5.0, "eval_stop"), line(5.0, "train_epoch", 3),
                      line(6.5, "train_epoch", 4), line(7.5, "run_stop")])
    log = mod.parse_log_v05(text, gpus=8)
    assert log == {"throughput": [600.0, 1200.0, 800.0], "global_batch": 208}
    with pytest.raises(ValueError, match="not a v0.5"):
        mod.parse_log_v05(line(0.0, "train_epoch", 0), gpus=8)
