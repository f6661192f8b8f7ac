"""Every package folder is listed in pyproject (hub/ and kernels/ are mapped explicitly), and
the repository root does not shadow Hugging Face's `kernels` package."""

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
    # kernels/ itself has no __init__.py (see test_the_repo_root_does_not_shadow_hf_kernels);
    # nkikit/library.py makes it the package nkikit.library
    found.add("nkikit.library")
    return found


def test_every_package_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    assert _package_folders() - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - _package_folders() == set(), "these listed packages have no folder"


def test_the_repo_root_does_not_shadow_hf_kernels():
    """`python` started in the repository root has the root on sys.path: `import kernels` must
    still be Hugging Face's package, and the library stays `nkikit.library`."""
    import subprocess
    import sys

    code = (
        "import kernels, nkikit.library.rmsnorm as r; "
        "print(kernels.__name__, hasattr(kernels, 'get_kernel'), r.__file__)"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    name, has_get_kernel, library_file = p.stdout.split()
    assert (name, has_get_kernel) == ("kernels", "True")
    assert library_file == str(ROOT / "kernels" / "rmsnorm" / "__init__.py")
    assert not (ROOT / "kernels" / "__init__.py").exists()
