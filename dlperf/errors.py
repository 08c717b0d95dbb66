"""The one error type that means "the user asked for something we cannot do".

The CLI turns a :class:`DlperfError` into a single line on stderr and exit code 2; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib


class DlperfError(Exception):
    """A user mistake (bad flag, unknown model, unreadable file), reported as one line."""


def close_matches(word: str, choices, n: int = 4) -> str:
    """' (did you mean: a, b?)' for the closest names, or '' when nothing is close."""
    found = difflib.get_close_matches(word.lower(), [c.lower() for c in choices], n=n, cutoff=0.5)
    lookup = {c.lower(): c for c in choices}
    return f" (did you mean: {', '.join(lookup[f] for f in found)}?)" if found else ""
