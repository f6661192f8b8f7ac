"""`python -m nkikit.hub --root DIR --port N [--token T]`: serve a folder as a Hub."""

import sys

from .server import main

sys.exit(main())
