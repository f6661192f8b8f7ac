"""CLI tests: `nkikit` driven through subprocesses (clihelp.py) and `main(argv)`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
