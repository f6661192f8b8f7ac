"""Registry tests: see hubfixtures.py for the hub and the published kernels they share."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hubfixtures import _isolated_env, cache_dir, hub_url, library_repos, rmsnorm_repo, tiny_repo  # noqa: E402, F401

# The fixture kernel folders hold their own tests, run by publish in a subprocess, not here.
collect_ignore = ["fixtures"]
