"""`python -m evq.ops.cli ...` is `evq ...` (for environments without the console script on PATH)."""

from evq.ops.cli import main

main()
