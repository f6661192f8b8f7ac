"""``python -m benchmarks.mxfp TUTORIAL_DIR``: see run.py."""

import sys

from .run import main

sys.exit(main())
