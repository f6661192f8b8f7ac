"""Torch binding tests share the registry's hub fixtures (tests/registry/hubfixtures.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))

from hubfixtures import (  # noqa: E402
    _isolated_env,  # noqa: F401
    _trust_the_session_hub,  # noqa: F401
    cache_dir,  # noqa: F401
    hub_url,  # noqa: F401
    library_repos,  # noqa: F401
    rmsnorm_repo,  # noqa: F401
    tiny_repo,  # noqa: F401
)
