"""Write dlperf/hardware/track_record.json from the saved validation results (issue #11).

Reads benchmarks/results/validation-published.json and validation-scaling.json (rerun them
first: validate_published.py, validate_scaling.py) and condenses them per device and class of
workload (dlperf/hardware/track_record.py), the record `dlperf analyze` prints beside every
prediction on a preset.

Usage: python benchmarks/track_record.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results"


def record_from_results(results: Path = RESULTS) -> dict:
    from dlperf.hardware.track_record import build

    published = json.loads((results / "validation-published.json").read_text())
    scaling = json.loads((results / "validation-scaling.json").read_text())
    return build(published["results"]["rows"], scaling["results"]["rows"])


def main(argv: list[str]) -> int:
    from dlperf.files import write_json_atomic
    from dlperf.hardware.track_record import PATH

    record = record_from_results()
    write_json_atomic(PATH, record)
    for device, entry in record.items():
        s = entry.get("all") or entry["classes"].get("decoder")
        print(f"{device:16s} {s['rows']:4d} rows  median {s['median']:.2f}x  "
              f"({s['low']:.2f}-{s['high']:.2f})")
    print(f"Wrote {PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
