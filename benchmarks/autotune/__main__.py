"""``python -m benchmarks.autotune``: see ``benchmarks/autotune/run.py``."""

from .run import main

raise SystemExit(main())
