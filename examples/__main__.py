"""`python -m snapmesh.examples [--path]`: as `snapmesh examples`."""

from __future__ import annotations

import sys

from snapmesh.commands.examples import main

sys.exit(main())
