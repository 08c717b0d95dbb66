"""The guide's checklist as rules: each turns predictions into findings with a predicted gain."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    rule: str
    message: str
    saving_s: float = 0.0

    def to_dict(self) -> dict:
        return {"rule": self.rule, "message": self.message, "saving_s": self.saving_s}


def findings(analysis) -> list[Finding]:
    return []
