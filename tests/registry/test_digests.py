"""Digests in the formats their consumers expect, and the verification that refuses tampering."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from nkikit.registry.digests import (
    digest_folder,
    git_blob_sha1,
    local_lock_hash,
    lock_hash,
    verify_folder,
)
from nkikit.registry.errors import IntegrityError


def _variant(tmp_path: Path) -> Path:
    d = tmp_path / "v"
    (d / "sub").mkdir(parents=True)
    (d / "__pycache__").mkdir()
    (d / "a.py").write_text("hi\n")
    (d / "sub" / "b.py").write_text("x\n")
    (d / "metadata.json").write_text("{}")
    (d / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    return d


def test_digest_format(tmp_path: Path) -> None:
    """base64 of the raw sha256, metadata.json and bytecode left out (the HF kernels format;
    test_interop_hf_kernels.py checks it against `kernels`' own hashing)."""
    d = _variant(tmp_path)
    assert digest_folder(d) == {
        "a.py": "mOpuTyFvL7S2n/+bOkSELDhobKaF8/VdxIxdP7EQe+Q=",
        "sub/b.py": "c8s4WKaHqElMozIwUwFigvPa051Cz2LKTnndoqrH2aw=",
    }


def test_git_blob_sha1() -> None:
    # `printf 'hello\n' | git hash-object --stdin`
    assert git_blob_sha1(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_verify_folder(tmp_path: Path) -> None:
    d = _variant(tmp_path)
    digest = {"algorithm": "sha256", "files": digest_folder(d)}
    verify_folder(d, digest)  # passes
    (d / "a.py").write_text("evil\n")
    with pytest.raises(IntegrityError, match=r"a\.py: content does not match") as e:
        verify_folder(d, digest)
    assert e.value.path.endswith("a.py")
    (d / "a.py").write_text("hi\n")
    (d / "planted.py").write_text("import os\n")
    with pytest.raises(IntegrityError, match=r"planted\.py: not part of the published build"):
        verify_folder(d, digest)
    (d / "planted.py").unlink()
    (d / "sub" / "b.py").unlink()
    with pytest.raises(IntegrityError, match=r"b\.py: missing"):
        verify_folder(d, digest)
    with pytest.raises(IntegrityError, match="no usable digest"):
        verify_folder(d, {"algorithm": "md5", "files": {}})


def test_lock_hash_definition(tmp_path: Path) -> None:
    """sha256 over (path, raw oid) pairs sorted by path: the HF kernels `git_lfs_concat` hash."""
    d = _variant(tmp_path)
    files = {"a.py": b"hi\n", "metadata.json": b"{}", "sub/b.py": b"x\n"}
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + bytes.fromhex(git_blob_sha1(files[rel])))
    assert (
        local_lock_hash(d)
        == lock_hash((r, git_blob_sha1(b)) for r, b in files.items())
        == "sha256-" + h.hexdigest()
    )
