"""What a subcommand hands back: the text to print and the exit status."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """`text` goes to stdout; `status` is the exit status (0 ok, 1 a problem was found)."""

    text: str
    status: int = 0

    @classmethod
    def of_json(cls, data: Any, status: int = 0) -> Outcome:
        return cls(json.dumps(data, indent=2, sort_keys=False, default=str), status)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])
