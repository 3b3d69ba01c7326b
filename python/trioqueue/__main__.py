"""``python -m trioqueue demo`` (also the ``trioqueue`` console script)."""

from __future__ import annotations

import sys

from ._demo import main

if __name__ == "__main__":
    sys.exit(main())
