"""Build the optional C extension (region-of-interest JPEG decoding against the system's
libjpeg-turbo). Everything else is in pyproject.toml. When libjpeg's headers are missing the
build is skipped (optional=True) and dlperf falls back to full-image DCT-scaled decoding.

The extension uses only CPython's limited API (3.11+), so one build (``_jpegroi.abi3.so``)
loads on every later Python too: scripts/build_device_ext.sh relies on that to carry it to a
machine with another Python."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("dlperf.data._jpegroi", ["dlperf/data/_jpegroi.c"],
                             libraries=["jpeg"], optional=True, py_limited_api=True,
                             define_macros=[("Py_LIMITED_API", "0x030B0000")],
                             extra_compile_args=["-O2"])],
      options={"bdist_wheel": {"py_limited_api": "cp311"}})
