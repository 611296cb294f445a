"""``python -m bench`` in a checkout: the benchmark, with `evq admin bench`'s options and output."""

from __future__ import annotations

import sys

from evq.ops.cli import main

if __name__ == "__main__":
    main(["admin", "bench", *sys.argv[1:]])
