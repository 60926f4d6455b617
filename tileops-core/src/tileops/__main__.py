"""`python -m tileops`: the `tileops` command, for environments without the console script."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
