"""Durable, crash-safe storage of Hub repos in a local folder.

Layout under `root`::

    repos/<models|datasets|spaces|kernels>/<namespace>/<name>/
        repo.json                     repo metadata (visibility, creation time)
        refs.json                     {"branches": {name: sha}, "tags": {name: {commit, message}}}
        commits/<sha[:2]>/<sha>.json  immutable commit objects; <sha> is the sha1 of the file's bytes
        blobs/<sha256[:2]>/<sha256>   file contents, content-addressed
    locks/   one lock file per repo (cross-process writer lock)
    tmp/     staging area for repo creation
    trash/   repos being deleted

Contract:
- Every file is written to a temporary name, fsynced and moved into place with `os.replace`, so a
  reader sees a whole file or none. Blobs and commits are immutable once named.
- `refs.json` is the only mutable state of a repo and the only thing that makes a commit visible.
  It is replaced after the commit's blobs and object are durable, so a process killed at any point
  of a commit leaves the repo at its previous commit (at worst with unreferenced blobs).
- All writes to one repo (commit, branch, tag, settings, delete) run under that repo's lock, held
  across threads and processes; reads take no lock.
- A commit is a full snapshot: path -> (git blob sha1, sha256, size). The git sha1 is what the Hub
  reports as a regular file's `oid` and `ETag`, so `huggingface_hub` can skip unchanged uploads.
- A repo whose path under the root goes through a symlink does not exist: a link out of the root
  would read and write elsewhere, a link to another repo would give it two names and two locks.
- A blob is served only after its size and sha256 are checked against the commit (once per
  version of the file on disk), so storage corruption is an error, never wrong bytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

from .errors import (
    BadRequest,
    Conflict,
    CorruptBlob,
    EntryNotFound,
    Forbidden,
    PreconditionFailed,
    RepoNotFound,
    RevisionNotFound,
)
from .locks import RepoLocks
from .names import REPO_TYPES, RepoRef, check_ref_name, is_commit_sha

DEFAULT_BRANCH = "main"

log = logging.getLogger("nkikit.hub")

#: Environment variable naming a failpoint, for crash tests of a server running in a subprocess.
FAILPOINT_ENV = "NKIKIT_HUB_FAILPOINT"


# ---------------------------------------------------------------------------------------------
# Data model


@dataclass(frozen=True)
class FileEntry:
    """One file of a commit's tree."""

    oid: str  # git blob sha1 of the content: the Hub's `oid` / `ETag` for a regular file
    sha256: str  # storage key of the blob
    size: int


@dataclass(frozen=True, eq=False)
class Commit:
    """An immutable commit: a full snapshot of the repo's files plus history metadata."""

    sha: str
    parents: tuple[str, ...]
    title: str
    message: str
    author: str
    date: str  # ISO 8601, UTC, millisecond precision: what huggingface_hub's parse_datetime reads
    files: Mapping[str, FileEntry]

    @cached_property
    def folders(self) -> dict[str, str]:
        """Every folder of the tree ('' is the root) -> a tree oid that changes when anything under it does."""
        children: dict[str, dict[str, tuple[str, str]]] = {"": {}}
        for path, entry in self.files.items():
            parts = path.split("/")
            for i in range(1, len(parts)):
                children.setdefault("/".join(parts[:i]), {})
            parent, _, name = path.rpartition("/")
            children[parent][name] = ("blob", entry.oid)
        oids: dict[str, str] = {}
        # Deepest folders first, so each parent sees its children's final oids; the root is last.
        for folder in sorted(children, key=lambda f: f.count("/") if f else -1, reverse=True):
            listing = "".join(
                f"{kind} {oid} {name}\n" for name, (kind, oid) in sorted(children[folder].items())
            )
            oids[folder] = hashlib.sha1(listing.encode()).hexdigest()
            if folder:
                parent, _, name = folder.rpartition("/")
                children[parent][name] = ("tree", oids[folder])
        return oids

    def entry_oid(self, path: str) -> str | None:
        """The oid of a file or folder at `path`, or None if the commit has neither."""
        entry = self.files.get(path)
        return entry.oid if entry is not None else self.folders.get(path)


@dataclass
class Refs:
    """A repo's branches (name -> commit sha) and tags (name -> {"commit", "message"})."""

    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, dict] = field(default_factory=dict)


@dataclass(frozen=True)
class RepoMeta:
    ref: RepoRef
    private: bool
    created_at: str


@dataclass(frozen=True)
class AddFile:
    """Add or replace `path`; `data` is the content, or a staged file holding it (large uploads
    are streamed to disk and moved into the blob store without being read into memory)."""

    path: str
    data: bytes | Path


@dataclass(frozen=True)
class DeleteFile:
    path: str


@dataclass(frozen=True)
class DeleteFolder:
    path: str


CommitOp = AddFile | DeleteFile | DeleteFolder


def now_iso() -> str:
    t = datetime.now(UTC)
    return f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z"


def git_blob_sha1(data: bytes) -> str:
    """The id git (and the Hub) gives a file's content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# ---------------------------------------------------------------------------------------------
# Failpoints: deterministic crashes for tests of crash safety.


class Failpoint:
    """A named point where the hub fails on purpose: 'NAME' raises, 'NAME:exit' kills the process.

    Points: 'before-ref-update' (commit written, branch not yet moved), 'mid-download' (half of a
    file body sent). Used only by tests; unset in normal operation.
    """

    def __init__(self, spec: str | None):
        name, _, action = (spec or "").partition(":")
        self.name = name or None
        self.exit = action == "exit"

    def armed(self, name: str) -> bool:
        return self.name == name

    def hit(self, name: str) -> None:
        if self.name != name:
            return
        if self.exit:
            os._exit(75)  # a crash, not a shutdown: no cleanup, no flushing
        raise RuntimeError(f"failpoint {name!r} triggered")


# ---------------------------------------------------------------------------------------------
# Filesystem helpers


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so readers see the old file or the whole new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# ---------------------------------------------------------------------------------------------


class Storage:
    """All repos under one root folder. Thread-safe; several processes may share a root."""

    def __init__(self, root: str | os.PathLike[str], *, failpoint: str | None = None):
        self.root = Path(root).resolve()
        for sub in ("repos", "locks", "tmp", "trash"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._locks = RepoLocks(self.root / "locks")
        self.failpoint = Failpoint(failpoint)
        self._cache: OrderedDict[tuple[str, str], Commit] = OrderedDict()
        self._cache_guard = threading.Lock()
        self._verified: set[tuple] = set()  # blob files whose content was checked (checked_blob)
        self._sweep()

    # -- paths -------------------------------------------------------------------------------

    def _repo_dir(self, ref: RepoRef) -> Path:
        """The repo's folder, refused (RepoNotFound) when any part of its path below the root is
        a symlink: a link leaving the root would serve or write outside it, and a link to another
        repo would give one repo two names, two locks and lost commits."""
        path = self.root / "repos" / ref.plural / ref.namespace / ref.name
        if os.path.realpath(path) != str(path):
            log.error("refusing %s: its path goes through a symlink", path)
            raise RepoNotFound(f"Repository not found: {ref.id}")
        return path

    def _commit_path(self, ref: RepoRef, sha: str) -> Path:
        return self._repo_dir(ref) / "commits" / sha[:2] / f"{sha}.json"

    def blob_path(self, ref: RepoRef, entry: FileEntry) -> Path:
        """Where the content of `entry` lives (read-only: blobs are immutable)."""
        return self._repo_dir(ref) / "blobs" / entry.sha256[:2] / entry.sha256

    def checked_blob(self, ref: RepoRef, entry: FileEntry) -> Path:
        """`blob_path`, after checking that the file is the blob: a regular file inside the repo
        (no symlink), of the recorded size and sha256. The hash is computed once per version of
        the file (keyed by inode, size and change times), so serving stays cheap.

        Raises CorruptBlob when the file is missing or differs: nothing wrong is ever served.
        """
        path = self.blob_path(ref, entry)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise CorruptBlob(
                f"blob of {ref.id} is missing from storage ({entry.sha256})"
            ) from None
        key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        with self._cache_guard:
            if key in self._verified:
                return path
        if not stat.S_ISREG(st.st_mode) or os.path.realpath(path) != str(path):
            raise CorruptBlob(f"blob {entry.sha256} of {ref.id} is not a regular file")
        if st.st_size != entry.size or _file_sha256(path) != entry.sha256:
            log.error("blob %s of %s does not match its size or sha256", path, ref.id)
            raise CorruptBlob(f"blob {entry.sha256} of {ref.id} is corrupt in storage")
        with self._cache_guard:
            self._verified.add(key)
        return path

    @contextmanager
    def staging_area(self) -> Iterator[Path]:
        """A private folder under `<root>/tmp` for one request's uploads, removed afterwards
        (and by the start-up sweep if the process dies)."""
        area = Path(tempfile.mkdtemp(dir=self.root / "tmp", prefix="upload-"))
        try:
            yield area
        finally:
            shutil.rmtree(area, ignore_errors=True)

    def _lock(self, ref: RepoRef):
        return self._locks.hold(f"{ref.plural}--{ref.namespace}--{ref.name}")

    def _sweep(self) -> None:
        """Remove what crashed writers left behind; none of it was ever visible.

        Trash is finished off (the repos were already renamed away). Temporary files inside a repo
        are removed under the repo's lock, where no writer can be using them. Staging folders of
        repo creation are removed once an hour old (a live creation takes milliseconds). Blobs and
        commit objects written by a commit that never moved its branch stay: they are complete,
        unreferenced, and harmless.
        """
        for leftover in (self.root / "trash").iterdir():
            shutil.rmtree(leftover, ignore_errors=True)
        hour_ago = time.time() - 3600
        for staging in (self.root / "tmp").iterdir():
            try:
                if staging.stat().st_mtime < hour_ago:
                    shutil.rmtree(staging, ignore_errors=True)
            except FileNotFoundError:
                continue
        for repo_type in REPO_TYPES:
            for meta in self.list_repos(repo_type):
                with self._lock(meta.ref):
                    repo_dir = self._repo_dir(meta.ref)
                    for tmp in (
                        *repo_dir.glob(".tmp-*"),
                        *repo_dir.glob("blobs/*/.tmp-*"),
                        *repo_dir.glob("commits/*/.tmp-*"),
                    ):
                        tmp.unlink(missing_ok=True)

    # -- repos -------------------------------------------------------------------------------

    def create_repo(self, ref: RepoRef, *, private: bool = False, author: str = "") -> RepoMeta:
        """Create `ref` with an empty initial commit on 'main'. Raises Conflict if it exists."""
        with self._lock(ref):
            target = self._repo_dir(ref)
            if (target / "repo.json").exists():
                raise Conflict(f"You already created this {ref.type} repo: {ref.id}")
            if target.exists():  # debris of something that never became a repo
                os.replace(target, self.root / "trash" / uuid.uuid4().hex)
            # Build the whole repo aside and rename it into place: it appears complete or not at all.
            staging = Path(tempfile.mkdtemp(dir=self.root / "tmp"))
            try:
                (staging / "commits").mkdir()
                (staging / "blobs").mkdir()
                meta = RepoMeta(ref, private, now_iso())
                first = self._write_commit(
                    staging, parents=(), files={}, title="initial commit", message="", author=author
                )
                refs = Refs(branches={DEFAULT_BRANCH: first.sha})
                _atomic_write(staging / "refs.json", _canonical(refs.__dict__))
                _atomic_write(staging / "repo.json", self._meta_bytes(meta))
                target.parent.mkdir(parents=True, exist_ok=True)
                os.rename(staging, target)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            _fsync_dir(target.parent)
            return meta

    def delete_repo(self, ref: RepoRef) -> None:
        """Delete `ref` and all its content. Raises RepoNotFound."""
        with self._lock(ref):
            target = self._repo_dir(ref)
            if not (target / "repo.json").exists():
                raise RepoNotFound(f"Repository not found: {ref.id}")
            doomed = self.root / "trash" / uuid.uuid4().hex
            os.rename(target, doomed)  # the repo vanishes atomically; the bytes go after
            _fsync_dir(target.parent)
            shutil.rmtree(doomed, ignore_errors=True)

    def meta(self, ref: RepoRef) -> RepoMeta:
        """The repo's metadata. Raises RepoNotFound."""
        try:
            raw = json.loads((self._repo_dir(ref) / "repo.json").read_bytes())
        except FileNotFoundError:
            raise RepoNotFound(f"Repository not found: {ref.id}") from None
        return RepoMeta(ref, bool(raw["private"]), raw["createdAt"])

    def _meta_bytes(self, meta: RepoMeta) -> bytes:
        return _canonical(
            {
                "id": meta.ref.id,
                "type": meta.ref.type,
                "private": meta.private,
                "createdAt": meta.created_at,
            }
        )

    def set_private(self, ref: RepoRef, private: bool) -> None:
        with self._lock(ref):
            meta = self.meta(ref)
            new = RepoMeta(ref, private, meta.created_at)
            _atomic_write(self._repo_dir(ref) / "repo.json", self._meta_bytes(new))

    def list_repos(self, repo_type: str) -> list[RepoMeta]:
        """Every repo of one type, sorted by id."""
        base = self.root / "repos" / REPO_TYPES[repo_type]
        found = []
        for meta_file in sorted(base.glob("*/*/repo.json")):
            ref = RepoRef(repo_type, meta_file.parent.parent.name, meta_file.parent.name)
            try:
                found.append(self.meta(ref))
            except RepoNotFound:  # deleted while listing
                continue
        return found

    # -- refs and commits --------------------------------------------------------------------

    def refs(self, ref: RepoRef) -> Refs:
        """A consistent snapshot of the repo's branches and tags. Raises RepoNotFound."""
        try:
            raw = json.loads((self._repo_dir(ref) / "refs.json").read_bytes())
        except FileNotFoundError:
            raise RepoNotFound(f"Repository not found: {ref.id}") from None
        return Refs(branches=raw["branches"], tags=raw["tags"])

    def _write_refs(self, ref: RepoRef, refs: Refs) -> None:
        _atomic_write(self._repo_dir(ref) / "refs.json", _canonical(refs.__dict__))

    def resolve(self, ref: RepoRef, rev: str, refs: Refs | None = None) -> Commit:
        """The commit a branch, tag ('refs/heads/x', 'refs/tags/x' also work) or full sha names.

        Branches win over tags of the same name. Raises RepoNotFound, RevisionNotFound.
        """
        refs = refs if refs is not None else self.refs(ref)
        sha: str | None = None
        if rev.startswith("refs/heads/"):
            sha = refs.branches.get(rev[len("refs/heads/") :])
        elif rev.startswith("refs/tags/"):
            tag = refs.tags.get(rev[len("refs/tags/") :])
            sha = tag["commit"] if tag else None
        elif rev in refs.branches:
            sha = refs.branches[rev]
        elif rev in refs.tags:
            sha = refs.tags[rev]["commit"]
        elif is_commit_sha(rev) and self._commit_path(ref, rev).exists():
            sha = rev
        if sha is None:
            raise RevisionNotFound(f"Invalid rev id: {rev}")
        return self.read_commit(ref, sha)

    def read_commit(self, ref: RepoRef, sha: str) -> Commit:
        """Load an immutable commit object (cached; its name is verified against its bytes)."""
        key = (str(self._repo_dir(ref)), sha)
        with self._cache_guard:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        try:
            data = self._commit_path(ref, sha).read_bytes()
        except FileNotFoundError:
            raise RevisionNotFound(f"Invalid rev id: {sha}") from None
        if hashlib.sha1(data).hexdigest() != sha:
            raise RuntimeError(f"commit object {sha} of {ref.id} is corrupt")
        commit = self._parse_commit(sha, data)
        with self._cache_guard:
            self._cache[key] = commit
            while len(self._cache) > 256:
                self._cache.popitem(last=False)
        return commit

    @staticmethod
    def _parse_commit(sha: str, data: bytes) -> Commit:
        raw = json.loads(data)
        files = {p: FileEntry(oid, sha256, size) for p, (oid, sha256, size) in raw["files"].items()}
        return Commit(
            sha=sha,
            parents=tuple(raw["parents"]),
            title=raw["title"],
            message=raw["message"],
            author=raw["author"],
            date=raw["date"],
            files=files,
        )

    def _write_commit(
        self,
        repo_dir: Path,
        *,
        parents: tuple[str, ...],
        files: Mapping[str, FileEntry],
        title: str,
        message: str,
        author: str,
    ) -> Commit:
        body = {
            "parents": list(parents),
            "title": title,
            "message": message,
            "author": author,
            "date": now_iso(),
            "files": {p: [e.oid, e.sha256, e.size] for p, e in sorted(files.items())},
        }
        data = _canonical(body)
        sha = hashlib.sha1(data).hexdigest()
        path = repo_dir / "commits" / sha[:2] / f"{sha}.json"
        path.parent.mkdir(exist_ok=True)
        _atomic_write(path, data)
        return self._parse_commit(sha, data)

    def _write_blob(self, ref: RepoRef, data: bytes | Path) -> FileEntry:
        if isinstance(data, Path):
            return self._move_blob(ref, data)
        sha256 = hashlib.sha256(data).hexdigest()
        entry = FileEntry(git_blob_sha1(data), sha256, len(data))
        path = self.blob_path(ref, entry)
        if not path.exists():  # content-addressed: an existing blob already holds these bytes
            path.parent.mkdir(exist_ok=True)
            _atomic_write(path, data)
        return entry

    def _move_blob(self, ref: RepoRef, staged: Path) -> FileEntry:
        """Hash a staged file in chunks and move it into the blob store (same filesystem)."""
        size = staged.stat().st_size
        sha1 = hashlib.sha1(b"blob %d\0" % size)
        sha256 = hashlib.sha256()
        with open(staged, "rb") as f:
            while chunk := f.read(1 << 20):
                sha1.update(chunk)
                sha256.update(chunk)
            os.fsync(f.fileno())
        entry = FileEntry(sha1.hexdigest(), sha256.hexdigest(), size)
        path = self.blob_path(ref, entry)
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            os.replace(staged, path)
            _fsync_dir(path.parent)
        return entry

    def history(self, ref: RepoRef, commit: Commit) -> Iterator[Commit]:
        """`commit` and its first-parent ancestors, newest first."""
        current: Commit | None = commit
        while current is not None:
            yield current
            current = self.read_commit(ref, current.parents[0]) if current.parents else None

    def last_commits(self, ref: RepoRef, commit: Commit, paths: list[str]) -> dict[str, Commit]:
        """For each path of `commit`, the newest commit (first-parent history) that changed it."""
        target = {p: commit.entry_oid(p) for p in paths}
        pending = set(paths)
        found: dict[str, Commit] = {}
        for current in self.history(ref, commit):
            parent = self.read_commit(ref, current.parents[0]) if current.parents else None
            for p in list(pending):
                if parent is None or parent.entry_oid(p) != target[p]:
                    found[p] = current
                    pending.discard(p)
            if not pending:
                break
        return found

    def commit(
        self,
        ref: RepoRef,
        branch: str,
        ops: list[CommitOp],
        *,
        title: str,
        message: str = "",
        author: str = "",
        parent_commit: str | None = None,
    ) -> Commit:
        """Apply `ops` in order on top of `branch` and move the branch to the new commit.

        Raises RepoNotFound; RevisionNotFound if `branch` is not a branch (BadRequest if it is a
        tag or a sha); PreconditionFailed if `parent_commit` is given and is not the branch head;
        EntryNotFound if a deleted file or folder does not exist; BadRequest if the result would
        hold a file and a folder of the same name. On any error nothing becomes visible.
        """
        with self._lock(ref):
            refs = self.refs(ref)
            head_sha = refs.branches.get(branch)
            if head_sha is None:
                if branch in refs.tags or is_commit_sha(branch):
                    raise BadRequest(f"Cannot commit to {branch!r}: commits go to a branch")
                raise RevisionNotFound(f"Invalid rev id: {branch}")
            if parent_commit is not None and parent_commit != head_sha:
                raise PreconditionFailed(
                    f"A commit has happened since: parent commit {parent_commit} is not the head "
                    f"{head_sha} of branch {branch!r}. Please refresh and try again."
                )
            files = dict(self.read_commit(ref, head_sha).files)
            for op in ops:
                if isinstance(op, AddFile):
                    files[op.path] = self._write_blob(ref, op.data)
                elif isinstance(op, DeleteFile):
                    if files.pop(op.path, None) is None:
                        raise EntryNotFound(f"A file with this name doesn't exist: {op.path}")
                else:
                    prefix = op.path.rstrip("/") + "/"
                    doomed = [p for p in files if p.startswith(prefix)]
                    if not doomed:
                        raise EntryNotFound(f"A folder with this name doesn't exist: {op.path}")
                    for p in doomed:
                        del files[p]
            _check_no_file_folder_clash(files)
            new = self._write_commit(
                self._repo_dir(ref),
                parents=(head_sha,),
                files=files,
                title=title,
                message=message,
                author=author,
            )
            self.failpoint.hit("before-ref-update")
            refs.branches[branch] = new.sha
            self._write_refs(ref, refs)
            return new

    def create_branch(self, ref: RepoRef, branch: str, starting_point: str | None = None) -> str:
        """Create `branch` at `starting_point` (default: head of main); returns its sha.

        Raises BadRequest (invalid name), Conflict (exists), RevisionNotFound (bad start).
        """
        check_ref_name(branch, "branch")
        with self._lock(ref):
            refs = self.refs(ref)
            if branch in refs.branches:
                raise Conflict(f"Reference already exists: branch {branch!r}")
            start = self.resolve(ref, starting_point or DEFAULT_BRANCH, refs)
            refs.branches[branch] = start.sha
            self._write_refs(ref, refs)
            return start.sha

    def delete_branch(self, ref: RepoRef, branch: str) -> None:
        """Raises Forbidden for 'main', RevisionNotFound if the branch does not exist."""
        if branch == DEFAULT_BRANCH:
            raise Forbidden(f"Cannot delete the default branch {DEFAULT_BRANCH!r}")
        with self._lock(ref):
            refs = self.refs(ref)
            if refs.branches.pop(branch, None) is None:
                raise RevisionNotFound(f"Invalid rev id: {branch} (no such branch)")
            self._write_refs(ref, refs)

    def create_tag(self, ref: RepoRef, tag: str, revision: str, message: str | None = None) -> str:
        """Tag the commit `revision` names; returns its sha. Raises BadRequest, Conflict, RevisionNotFound."""
        check_ref_name(tag, "tag")
        with self._lock(ref):
            refs = self.refs(ref)
            if tag in refs.tags:
                raise Conflict(f"Reference already exists: tag {tag!r}")
            target = self.resolve(ref, revision, refs)
            refs.tags[tag] = {"commit": target.sha, "message": message}
            self._write_refs(ref, refs)
            return target.sha

    def delete_tag(self, ref: RepoRef, tag: str) -> None:
        """Raises RevisionNotFound if the tag does not exist."""
        with self._lock(ref):
            refs = self.refs(ref)
            if refs.tags.pop(tag, None) is None:
                raise RevisionNotFound(f"Invalid rev id: {tag} (no such tag)")
            self._write_refs(ref, refs)


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _check_no_file_folder_clash(files: Mapping[str, FileEntry]) -> None:
    # A path cannot be a file and a folder at once (git cannot represent it, checkouts break).
    for path in files:
        parts = path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in files:
                raise BadRequest(f"Cannot add {path!r}: {parent!r} is a file in this commit")
