"""Torch binding tests share the registry's hub fixtures (tests/registry/hubfixtures.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))

from hubfixtures import _isolated_env, cache_dir, hub_url, library_repos, rmsnorm_repo, tiny_repo  # noqa: E402, F401
