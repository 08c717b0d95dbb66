"""dlperf: make deep-learning training on NVIDIA Tensor Core GPUs fast, and explain why it is slow.

Importing the package does no work; ``dlperf.analyze`` imports torch on first use.
"""

__version__ = "0.1.0"


def analyze(*args, **kwargs):
    """Per-layer roofline of a model; see :func:`dlperf.analysis.api.analyze`."""
    from dlperf.analysis.api import analyze as _analyze

    return _analyze(*args, **kwargs)


__all__ = ["analyze", "__version__"]
