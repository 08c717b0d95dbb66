"""Build the optional C extension (region-of-interest JPEG decoding against the system's
libjpeg-turbo). Everything else is in pyproject.toml. When libjpeg's headers are missing the
build is skipped (optional=True) and dlperf falls back to full-image DCT-scaled decoding."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("dlperf.data._jpegroi", ["dlperf/data/_jpegroi.c"],
                             libraries=["jpeg"], optional=True,
                             extra_compile_args=["-O2"])])
