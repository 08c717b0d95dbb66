"""Build the optional C extension (region-of-interest JPEG decoding against the system's
libjpeg-turbo). Everything else is in pyproject.toml.

When a compiler or libjpeg's headers are missing the build is skipped and dlperf still works,
1.4-2x slower on its CPU input path and without restart markers in prepared shards (issue
#10). That is never silent: the build prints a warning here, `make install` prints the
extension's status (``python -m dlperf.data.native``), and `dlperf data prepare`, `data inspect`
and `bench data` say so in their output.

The extension uses only CPython's limited API (3.11+), so one build (``_jpegroi.abi3.so``)
loads on every later Python too: scripts/build_device_ext.sh relies on that to carry it to a
machine with another Python. Its core (jpegroi.c) has no Python in it, so
tests/fuzz/fuzz_jpegroi.c builds the same code under sanitizers."""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExtWarn(build_ext):
    """build_ext that says loudly when the optional extension could not be built."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # optional=True swallows it; we still say so
            print("\n" + "!" * 78 + f"\nWARNING: dlperf's JPEG extension {ext.name} was not "
                  f"built ({exc}).\nInstall a C compiler and libjpeg-turbo's headers (Debian: "
                  "apt-get install gcc libjpeg62-turbo-dev)\nand reinstall: without it the CPU "
                  "input pipeline is 1.4-2x slower and prepared\nshards carry no restart "
                  "markers.\n" + "!" * 78 + "\n", file=sys.stderr)
            raise


setup(ext_modules=[Extension("dlperf.data._jpegroi",
                             ["dlperf/data/_jpegroi.c", "dlperf/data/jpegroi.c"],
                             depends=["dlperf/data/jpegroi.h"],
                             libraries=["jpeg"], optional=True, py_limited_api=True,
                             define_macros=[("Py_LIMITED_API", "0x030B0000")],
                             extra_compile_args=["-O2"])],
      cmdclass={"build_ext": BuildExtWarn},
      options={"bdist_wheel": {"py_limited_api": "cp311"}})
