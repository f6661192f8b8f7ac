"""``python -m benchmarks.docs DOCS_DIR``: see run.py."""

import sys

from .run import main

sys.exit(main())
