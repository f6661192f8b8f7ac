"""`python -m nkikit.cli`: the `nkikit` command."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
