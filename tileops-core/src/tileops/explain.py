"""The report `Op.explain` returns: every key's verdict, and what dispatch does with the call."""

from __future__ import annotations

from dataclasses import dataclass

from .selection import CHOSEN, Candidate, Judgement


@dataclass(frozen=True)
class Explanation:
    judgement: Judgement
    candidates: tuple[Candidate, ...]
    error: Exception | None

    @property
    def chosen(self) -> str | None:
        winner = self.judgement.winner
        return winner.key if winner else None

    def verdict(self, key: str) -> str:
        """The status of `key`: unavailable, refused, outranked, tied or chosen."""
        return next(v.status for v in self.judgement.verdicts if v.key == key)

    @property
    def text(self) -> str:
        lines = [self.judgement.text(), *self._dangling_preferences()]
        if self.error is None:
            lines.append(f"=> {self.chosen} ({CHOSEN})")
        else:
            lines.append(f"=> {type(self.error).__name__}: {str(self.error).splitlines()[0]}")
        return "\n".join(lines)

    def _dangling_preferences(self) -> list[str]:
        installed = {c.key for c in self.candidates}
        return [
            f"  note: {c.key} is preferred over {missing!r}, which is not installed"
            for c in self.candidates
            for missing in sorted(c.cls.preferred_over - installed)
        ]

    def __str__(self) -> str:
        return self.text
