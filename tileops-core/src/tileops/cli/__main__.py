"""`python -m tileops.cli`: the `tileops` command."""

from __future__ import annotations

import sys

from . import main

sys.exit(main())
