"""What dlperf's one-time set-up costs on this machine, and how its own corpus compares.

* wall time of `dlperf probe --quick` and of the full `dlperf probe --sweep` (issue #11's limit:
  the sweep within 3 minutes on a 2-core CPU), each in a fresh process;
* JPEG decode rate (simplejpeg, one thread, best of 3 passes) of dlperf's own corpus
  (`dlperf data corpus`, the defaults) against a reference corpus given on the command line
  (the workplace's ImageNet-like corpus), passes alternating so both see the same machine.

Usage: python benchmarks/bench_setup_costs.py [REFERENCE_CORPUS] [OUT.json]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks/results/setup-costs.json"


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dlperf", *argv], check=True, capture_output=True)
    return time.perf_counter() - start


def decode_rates(corpora: dict, passes: int = 3) -> dict:
    import simplejpeg

    data = {name: [p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.suffix.lower()
                   in (".jpeg", ".jpg")] for name, root in corpora.items()}
    best = {name: 0.0 for name in data}
    for _ in range(passes):
        for name, files in data.items():  # alternating: a slow spell hits both
            start = time.perf_counter()
            for blob in files:
                simplejpeg.decode_jpeg(blob)
            best[name] = max(best[name], len(files) / (time.perf_counter() - start))
    sizes = {name: statistics.mean(len(b) for b in files) for name, files in data.items()}
    return {name: {"files": len(data[name]), "mean_bytes": sizes[name],
                   "img_per_s": best[name]} for name in data}


def main(argv: list[str]) -> int:
    from dlperf.provenance import save_result
    from dlperf.data.corpus import CorpusConfig, make_corpus

    reference = argv[0] if argv else None
    out = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUT
    with tempfile.TemporaryDirectory() as tmp:
        results = {"probe_quick_s": wall(["probe", "--quick", "--out", f"{tmp}/q.json"]),
                   "probe_sweep_s": wall(["probe", "--sweep", "--out", f"{tmp}/s.json"])}
        own = Path(tmp) / "corpus"
        summary = make_corpus(own, CorpusConfig())
        corpora = {"dlperf_corpus": own, **({"reference": reference} if reference else {})}
        results["decode"] = decode_rates(corpora)
        results["dlperf_corpus"] = {k: v for k, v in summary.items() if k != "config"}
    if reference:
        d = results["decode"]
        results["decode_rate_ratio"] = d["dlperf_corpus"]["img_per_s"] / d["reference"]["img_per_s"]
    save_result(out, "setup-costs", {"reference_corpus": Path(reference).name if reference
                                     else None, "corpus": CorpusConfig().__dict__}, results)
    print({k: v for k, v in results.items() if k != "decode"}, results["decode"])
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
