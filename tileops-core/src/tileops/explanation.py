"""The report `Op.explain` returns: every key's verdict, and what dispatch does with the call."""

from __future__ import annotations

from dataclasses import dataclass

from . import hints
from .selection import CHOSEN, UNAVAILABLE, Candidate, Judgement


@dataclass(frozen=True)
class Explanation:
    judgement: Judgement
    candidates: tuple[Candidate, ...]
    error: Exception | None

    @property
    def chosen(self) -> str | None:
        winner = self.judgement.winner
        return winner.key if winner else None

    @property
    def winner_source(self) -> str | None:
        """The distribution (and entry point) of the chosen key, or None."""
        winner = self.judgement.winner
        return winner.source if winner else None

    def verdict(self, key: str) -> str:
        """The status of `key`: unavailable, refused, outranked, tied or chosen."""
        return next(v.status for v in self.judgement.verdicts if v.key == key)

    def verdicts(self) -> dict[str, str]:
        """Every key -> its verdict as one line of text (`status: reason`)."""
        return {v.key: f"{v.status}: {v.reason}" for v in self.judgement.verdicts}

    def notes(self) -> list[str]:
        """Declarations behind these verdicts that are valid yet probably mistakes."""
        op, interface = self.judgement.op, self.judgement.interface
        found = [h.text for h in hints.dangling_preferences(op, interface, self.candidates)]
        unavailable = {v.key for v in self.judgement.verdicts if v.status == UNAVAILABLE}
        device_type = self.judgement.call.device.type
        for cand in self.candidates:
            note = cand.key in unavailable and hints.default_devices_note(cand, device_type)
            if note:
                found.append(note)
        return found

    @property
    def text(self) -> str:
        lines = [self.judgement.text(), *(f"  note: {n}" for n in self.notes())]
        if self.error is None:
            lines.append(f"=> {self.chosen} ({CHOSEN})")
        else:
            lines.append(f"=> {type(self.error).__name__}: {str(self.error).splitlines()[0]}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text
