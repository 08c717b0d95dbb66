"""The native JPEG core under AddressSanitizer and UndefinedBehaviorSanitizer (issue #10).

tests/fuzz/fuzz_jpegroi.c drives every entry point of dlperf/data/jpegroi.c (decode_region,
cut_region, transcode, jpeg_info) on mutated good JPEGs and crafted cases. `make test` runs it
for DLPERF_FUZZ_SECONDS (default 20 s); CI runs `make fuzz` (90 s) as well. Skipped, with the
reason, where gcc, libjpeg's headers or the sanitizer runtimes are missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hostile import category15_gray, seed_jpegs

ROOT = Path(__file__).resolve().parents[1]
SAN_FLAGS = ["-g", "-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
             "-fno-omit-frame-pointer"]
SAN_ENV = {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:abort_on_error=0",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
SANITIZER_REPORT = re.compile(r"ERROR: (Address|Leak)Sanitizer|runtime error:")


def _sanitizer_build(tmp: Path, sources: list[str], name: str) -> Path:
    cc = shutil.which(os.environ.get("CC", "gcc"))
    if cc is None:
        pytest.skip("no C compiler (gcc) to build the sanitizer fuzz harness")
    exe = tmp / name
    cmd = [cc, *SAN_FLAGS, f"-I{ROOT / 'dlperf/data'}", *sources, "-ljpeg", "-o", str(exe)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        if "jpeglib.h" in done.stderr or "cannot find -l" in done.stderr or "asan" in done.stderr:
            pytest.skip(f"cannot build with sanitizers here: {done.stderr.strip()[:200]}")
        raise AssertionError(done.stderr)
    return exe


def _run(exe: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, **SAN_ENV}
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_sanitizers_are_live(tmp_path):
    """The toolchain reports a double free and a one-byte overread: a fuzz run that finds
    nothing means something only if these two are caught."""
    src = tmp_path / "bug.c"
    src.write_text("#include <stdlib.h>\n#include <string.h>\nint main(int c, char **v) {\n"
                   "  char *p = malloc(8); memset(p, 0, 8);\n"
                   "  if (c > 1) { free(p); free(p); return 0; }\n"
                   "  volatile char x = p[8]; (void)x; return 0; }\n")
    exe = _sanitizer_build(tmp_path, [str(src)], "bug")
    for args in ((), ("double",)):
        done = _run(exe, *args, timeout=60)
        assert done.returncode != 0 and SANITIZER_REPORT.search(done.stderr), done.stderr


def test_fuzz_every_entry_point_under_sanitizers(tmp_path):
    exe = _sanitizer_build(tmp_path, [str(ROOT / "tests/fuzz/fuzz_jpegroi.c"),
                                      str(ROOT / "dlperf/data/jpegroi.c")], "fuzz_jpegroi")
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    for name, data in seed_jpegs().items():
        (seeds / name).write_bytes(data)
    (seeds / "category15-noapp.jpg").write_bytes(category15_gray(0))
    seconds = float(os.environ.get("DLPERF_FUZZ_SECONDS", "20"))
    done = _run(exe, "--seconds", str(seconds), "--seed", "1",
                *sorted(str(p) for p in seeds.iterdir()), timeout=seconds * 4 + 120)
    assert done.returncode == 0 and not SANITIZER_REPORT.search(done.stderr), \
        done.stderr[-4000:]
    counts = {m[1]: (int(m[2]), int(m[3]))
              for m in re.finditer(r"^(\w+) calls (\d+) ok (\d+)$", done.stdout, re.M)}
    iterations = int(re.search(r"iterations (\d+)", done.stdout)[1])
    print(done.stdout)
    assert iterations >= 500, done.stdout
    # depth: each entry point must also have succeeded on damaged input, or the run only
    # exercised the header checks
    for entry in ("jpeg_info", "decode_region", "cut_region", "transcode", "decode_transcoded"):
        calls, ok = counts[entry]
        assert ok >= 20 and calls > ok, (entry, counts)


def test_category15_file_no_longer_aborts_transcode():
    """The regression, in a child process so an abort fails this test instead of the run:
    the old code died with SIGABRT ("double free or corruption")."""
    pytest.importorskip("dlperf.data._jpegroi")
    code = ("import sys; sys.path.insert(0, 'tests'); from hostile import category15_gray\n"
            "from dlperf.data import _jpegroi\n"
            "for n in (0, 8192, 60000):\n"
            "    assert _jpegroi.transcode(category15_gray(n), 32) is None\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
