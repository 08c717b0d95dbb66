"""Whether dlperf's C extension (the JPEG fast path, dlperf/data/jpegroi.c) is built, and what
its absence costs. `make install` runs ``python -m dlperf.data.native``; `dlperf data prepare`,
`data inspect` and `bench data` print :data:`MISSING` when it is absent (issue #10: a missing
compiler or libjpeg headers at install used to give a slower pipeline without a word)."""

from __future__ import annotations

import sys

from dlperf.data.decode import ROI_AVAILABLE

MISSING = ("dlperf's JPEG extension is not built (no C compiler or libjpeg-turbo headers at "
           "install): CPU decoding is 1.4-2x slower and `dlperf data prepare` stores JPEGs "
           "without restart markers; install gcc and libjpeg62-turbo-dev (Debian), then "
           "reinstall dlperf")


def warning() -> str | None:
    """The line to print, or None when the extension is there."""
    return None if ROI_AVAILABLE else MISSING


def main() -> int:
    line = warning()
    print(f"WARNING: {line}" if line else "dlperf's JPEG extension: built (region decoding, "
          "restart markers)", file=sys.stderr if line else sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
