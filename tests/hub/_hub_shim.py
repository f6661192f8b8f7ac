"""Make `nkikit.hub` importable from this checkout even before the package is (correctly) installed.

pyproject maps `nkikit.hub` to the top-level `hub/` folder. If the installed package lacks that
mapping, `ensure_importable()` loads `hub/` under the name `nkikit.hub`. Run as a script, this file
is the hub's CLI (used to start a server subprocess in that situation).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def installed() -> bool:
    """True if `nkikit.hub` is importable the normal way."""
    try:
        return importlib.util.find_spec("nkikit.hub") is not None
    except ModuleNotFoundError:
        return False


def ensure_importable() -> None:
    if "nkikit.hub" in sys.modules or installed():
        return
    try:
        import nkikit
    except ModuleNotFoundError:
        sys.path.insert(0, str(REPO))
        import nkikit
    hub_dir = REPO / "hub"
    spec = importlib.util.spec_from_file_location(
        "nkikit.hub", hub_dir / "__init__.py", submodule_search_locations=[str(hub_dir)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["nkikit.hub"] = module
    spec.loader.exec_module(module)
    nkikit.hub = module  # type: ignore[attr-defined]


if __name__ == "__main__":
    ensure_importable()
    from nkikit.hub import main

    sys.exit(main())
