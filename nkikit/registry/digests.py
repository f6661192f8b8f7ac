"""Digests: what a build promises about its files, and the checks that hold it to that promise.

Three kinds, each in the format its consumer expects:

- per-file digests in `metadata.json` (`digest.files`: relative path -> base64 of the raw
  sha256/sha512), the format HF `kernels verify-signature` re-hashes (hub.md §1.6);
- git blob ids (sha1 of "blob <size>\\0" + content), which the Hub reports for regular files;
- the `kernels.lock` variant hash (`hash_type = "git_lfs_concat"`): one sha256 over, for every
  file of the variant sorted by its path relative to the variant folder, the UTF-8 path followed
  by the raw bytes of the file's git blob id (or its LFS sha256) (hub.md §1.4).
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from .errors import IntegrityError

METADATA_FILE = "metadata.json"
ALGORITHMS = ("sha256", "sha512")
LOCK_HASH_TYPE = "git_lfs_concat"

# Files of a variant folder that its own digest cannot cover (metadata.json holds the digest,
# the signature signs it) or that are never part of a build (bytecode).
_UNDIGESTED = {METADATA_FILE, METADATA_FILE + ".sigstore"}


def _is_bytecode(rel: str) -> bool:
    return rel.endswith(".pyc") or "__pycache__" in rel.split("/")


def file_digest(data: bytes, algorithm: str = "sha256") -> str:
    """Base64 of the raw digest of `data`. Raises ValueError for an unknown algorithm."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown digest algorithm {algorithm!r}: expected one of {ALGORITHMS}")
    return base64.b64encode(hashlib.new(algorithm, data).digest()).decode("ascii")


def git_blob_sha1(data: bytes) -> str:
    """The id git and the Hub give a file's content (hex)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def variant_files(variant_dir: Path) -> list[str]:
    """Relative POSIX paths of every file of a variant folder, bytecode excluded, sorted."""
    out = []
    for root, dirs, files in os.walk(variant_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            rel = Path(root, f).relative_to(variant_dir).as_posix()
            if not _is_bytecode(rel):
                out.append(rel)
    return sorted(out)


def digest_folder(variant_dir: Path, algorithm: str = "sha256") -> dict[str, str]:
    """The `digest.files` table of a variant folder: every file but metadata.json and bytecode."""
    return {
        rel: file_digest((variant_dir / rel).read_bytes(), algorithm)
        for rel in variant_files(variant_dir)
        if rel not in _UNDIGESTED
    }


def verify_folder(variant_dir: Path, digest: Mapping[str, object], *, label: str = "") -> None:
    """Check every file of `variant_dir` against a metadata `digest` table.

    Raises IntegrityError naming the file when one is missing, differs from its digest, or is
    present but not listed (a file slipped into the cache could otherwise be imported).
    """
    algorithm = digest.get("algorithm")
    files = digest.get("files")
    where = f" of {label}" if label else ""
    if algorithm not in ALGORITHMS or not isinstance(files, Mapping):
        raise IntegrityError(
            f"{variant_dir / METADATA_FILE}: no usable digest (need 'digest': {{'algorithm': "
            f"'sha256', 'files': {{...}}}}); refusing to load an unverifiable build{where}",
            path=str(variant_dir / METADATA_FILE),
        )
    for rel, expected in files.items():
        path = variant_dir / rel
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise IntegrityError(
                f"{path}: missing from the downloaded build{where} (listed in metadata.json)",
                path=str(path),
            ) from None
        if file_digest(data, algorithm) != expected:
            raise IntegrityError(
                f"{path}: content does not match the {algorithm} digest in metadata.json{where}; "
                "the file was modified after publishing. Refusing to load it. Delete the cached "
                "snapshot folder and pull again.",
                path=str(path),
            )
    extra = [
        rel for rel in variant_files(variant_dir) if rel not in files and rel not in _UNDIGESTED
    ]
    if extra:
        path = variant_dir / extra[0]
        raise IntegrityError(
            f"{path}: not part of the published build{where} (not listed in metadata.json); "
            "refusing to load. Delete the cached snapshot folder and pull again.",
            path=str(path),
        )


def lock_hash(entries: Iterable[tuple[str, str]]) -> str:
    """The `kernels.lock` hash of a variant from (path relative to the variant, hex oid) pairs,
    where oid is the LFS sha256 for LFS files and the git blob sha1 otherwise."""
    h = hashlib.sha256()
    for rel, oid in sorted(entries, key=lambda e: e[0].encode("utf-8")):
        h.update(rel.encode("utf-8"))
        h.update(bytes.fromhex(oid))
    return "sha256-" + h.hexdigest()


def local_lock_hash(variant_dir: Path) -> str:
    """The `kernels.lock` hash of a variant folder on disk (e.g. a cached snapshot).

    In the HF cache a snapshot file links to `blobs/<etag>`, where the etag is the LFS sha256
    (64 hex) for LFS files and the git blob sha1 otherwise; the oid is recomputed from the
    content in the matching form, so the result proves the content, not just the link name.
    """
    entries = []
    for rel in variant_files(variant_dir):
        path = variant_dir / rel
        data = path.read_bytes()
        target = os.path.basename(os.path.realpath(path))
        is_lfs = len(target) == 64 and all(c in "0123456789abcdef" for c in target)
        entries.append((rel, hashlib.sha256(data).hexdigest() if is_lfs else git_blob_sha1(data)))
    return lock_hash(entries)


def content_hash(files: Mapping[str, bytes]) -> str:
    """A hex sha256 over named contents (sorted by name): the identity of a build's sources."""
    h = hashlib.sha256()
    for name in sorted(files):
        data = files[name]
        h.update(name.encode("utf-8") + b"\0" + str(len(data)).encode() + b"\0")
        h.update(data)
    return h.hexdigest()
