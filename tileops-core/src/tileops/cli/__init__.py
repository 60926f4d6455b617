"""The `tileops` command: what is installed, why a call gets its kernel, and the main job.

tileops list [--json]             backends, ops, interfaces, keys, targets, load failures
tileops explain OP --shape ...    every key's verdict on the call those inputs make
tileops audit [OP ...]            probe every op on simulated devices for gaps and ambiguities
tileops doctor                    versions, GPUs, load failures, settings, suspicious declarations
tileops warmup --op ... --shapes  build (compile) the entries those calls need, ahead of time
tileops demo                      run every op here, with the kernel that served it and its error

Exit status: 0 on success; 1 when the command found a problem it reports (dispatch would fail,
a gap or an ambiguity, a doctor finding, a build that failed); 2 on a usage error.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Sequence

from ..errors import TileOpsError
from . import audit, demo, doctor, explain_command, listing, warmup
from .output import Outcome

COMMANDS = (listing, explain_command, audit, doctor, warmup, demo)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv); returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        outcome: Outcome = args.run(args)
    except (TileOpsError, KeyError, ValueError, TypeError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"tileops: {message}", file=sys.stderr)
        return 2
    if outcome.text:
        print(outcome.text)
    return outcome.status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tileops",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]),
    )
    version = importlib.metadata.version("tileops-core")
    parser.add_argument("--version", action="version", version=f"tileops-core {version}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser
