"""Where autotuning results and sweep results live on disk, and how they are written.

Files are JSON, written atomically (a temporary file in the same folder, flushed and fsynced,
then ``os.replace``): a reader sees the old file or the new one, never half of one, even when a
process is killed mid-write or two processes write the same entry.  A file that does not parse
(written by something else, or damaged on disk) reads as missing and is overwritten by the next
write: a cache is never the reason a run fails.

The cache folder is ``$NKIKIT_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/nkikit``, else
``~/.cache/nkikit`` (the XDG base-directory convention the HF cache also follows).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """nkikit's cache folder (see the module docstring); not created here."""
    explicit = os.environ.get("NKIKIT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "nkikit"


def canonical_json(value: Any) -> str:
    """``value`` as JSON with sorted keys and no spaces: equal values give equal text, so the
    text can be hashed into a content address."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)


def digest(value: Any) -> str:
    """The content address of a JSON-serializable value: sha256 of its canonical JSON (hex)."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def write_json_atomic(path: Path, value: Any) -> None:
    """Write ``value`` as JSON to ``path`` so that readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_json(path: Path) -> Any | None:
    """The JSON value in ``path``; None if the file is missing or does not parse."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class JsonStore:
    """A folder of JSON entries addressed by a hex key (``<folder>/<key[:2]>/<key>.json``).

    ``get`` returns None for a missing or unreadable entry; ``put`` replaces an entry
    atomically.  Safe to share between processes: the last complete write wins."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)

    def path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> Any | None:
        return read_json(self.path(key))

    def put(self, key: str, value: Any) -> None:
        write_json_atomic(self.path(key), value)

    def keys(self) -> list[str]:
        """Every key with an entry file (readable or not), sorted."""
        if not self.folder.is_dir():
            return []
        return sorted(p.stem for p in self.folder.glob("??/*.json"))
