"""The emit-layer tests trace NKI 0.x kernels with the moves the 0.x tests share
(tests/nki0x/nki0x_helpers.py: load into SBUF, store to a new output)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nki0x"))
