"""Library integration tests share the registry's hub fixtures (tests/registry/hubfixtures.py):
a real `nkikit.hub` on loopback, kernels published to it and pulled back."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))

from hubfixtures import _isolated_env, hub_url  # noqa: E402, F401
