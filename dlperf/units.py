"""Numbers for people: SI prefixes, GiB, seconds at a readable scale."""

from __future__ import annotations


def si(value: float, unit: str = "", digits: int = 3) -> str:
    """1.23e12 -> '1.23 T' + unit."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}".rstrip()


def gib(nbytes: float) -> str:
    """Memory in GiB (how GPU memory is sold: an "80 GB" H100 holds 80 GiB)."""
    value = nbytes / 2**30
    return f"{value:,.0f} GiB" if value >= 100 else f"{value:.3g} GiB"


def seconds(value: float) -> str:
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} µs"
