"""The terminal: every rich Console dlperf prints to, and the few lines that carry a style.

Rich reads ``[...]`` in a printed string as markup, so a path, a model's module name or an
interconnect file's display name holding "[/]" crashed a command (MarkupError) and "[exp1]"
vanished from a printed path. dlperf's consoles therefore print every string as it is
(``markup=False``); a line that wants colour says so with ``styled``, whose template is
dlperf's own text and whose values are escaped.
"""

from __future__ import annotations


def new_console():
    """A rich Console that prints strings literally; 160 columns when output is not a terminal
    (logs, CI) so tables stay legible."""
    from rich.console import Console

    console = Console(markup=False)
    return console if console.is_terminal else Console(markup=False, width=160)


def styled(template: str, *values) -> "Text":
    """``template`` (rich markup, dlperf's own) with ``{}`` filled by ``values``, escaped so
    that what a user wrote is printed as written: styled("[yellow]skipped[/] {}", path)."""
    from rich.markup import escape
    from rich.text import Text

    return Text.from_markup(template.format(*(escape(str(v)) for v in values)))
