"""The one error type that means "the user asked for something we cannot do".

The CLI turns a :class:`DlperfError` into a single line on stderr and exit code 2; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
import math


class DlperfError(Exception):
    """A user mistake (bad flag, unknown model, unreadable file), reported as one line."""


def finite_number(value) -> bool:
    """A finite int or float from a user's file or flag: not a bool (JSON's true is 1 to
    Python), a string ("4e10"), NaN or Infinity (Python's json reads both)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def close_matches(word: str, choices, n: int = 4) -> str:
    """' (did you mean: a, b?)' for the closest names, or '' when nothing is close."""
    found = difflib.get_close_matches(word.lower(), [c.lower() for c in choices], n=n, cutoff=0.5)
    lookup = {c.lower(): c for c in choices}
    return f" (did you mean: {', '.join(lookup[f] for f in found)}?)" if found else ""
