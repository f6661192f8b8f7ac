"""``python -m benchmarks.calibration``: see run.py."""

import sys

from .run import main

sys.exit(main())
