"""``python -m benchmarks.tutorials TUTORIALS_DIR``: see run.py."""

import sys

from .run import main

sys.exit(main())
