"""Every package folder is listed in pyproject (hub/ and kernels/ are mapped explicitly)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _package_folders() -> set[str]:
    found = set()
    for top, name in (("nkikit", "nkikit"), ("hub", "nkikit.hub"), ("kernels", "nkikit.library")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            if "__pycache__" in rel.parts or any(p.startswith(".") for p in rel.parts):
                continue
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    return found


def test_every_package_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    assert _package_folders() - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - _package_folders() == set(), "these listed packages have no folder"
