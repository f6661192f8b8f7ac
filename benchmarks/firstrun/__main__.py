"""``python -m benchmarks.firstrun``: see ``benchmarks/firstrun/run.py``."""

from .run import main

raise SystemExit(main())
