"""``python -m benchmarks.registry``: see run.py."""

import sys

from .run import main

sys.exit(main())
