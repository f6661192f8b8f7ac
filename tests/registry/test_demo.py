"""The README demo: local hub, publish rmsnorm, pull it, run it in a torch module."""

from __future__ import annotations

from pathlib import Path

from nkikit.registry.demo import sharing_demo


def test_sharing_demo(tmp_path: Path) -> None:
    lines: list[str] = []
    result = sharing_demo(tmp_path, echo=lines.append)
    assert result["max_abs_error"] < 1e-4
    assert result["namespace"].startswith("_rmsnorm_cpu_")
    text = "\n".join(lines)
    assert "local hub at http://127.0.0.1:" in text and "published nkikit/rmsnorm v1" in text
    assert (
        "pulled <KernelModule nkikit/rmsnorm v1" in text
        and "max |kernel - numpy reference|" in text
    )
    assert (tmp_path / "cache").is_dir() and (tmp_path / "hub").is_dir()
