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
