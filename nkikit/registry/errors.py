"""The registry's errors: one class per thing that can go wrong, each message saying what to do.

Every class derives from `RegistryError`, and also from the builtin a caller would naturally
catch (`LookupError` for something missing, `PermissionError` for trust, `ValueError` for bad
input), so `except LookupError` keeps working for code that does not know nkikit.
"""

from __future__ import annotations


class RegistryError(Exception):
    """Base class of every error raised by `nkikit.kernels` and `nkikit.registry`."""


class ManifestError(RegistryError, ValueError):
    """A kernel folder's `kernel.toml` is missing, malformed or inconsistent."""


class KernelTestsFailedError(RegistryError):
    """A kernel's own tests failed (or could not run), so it was not published.

    `output` holds the tail of the pytest output; `returncode` its exit status.
    """

    def __init__(self, message: str, *, output: str = "", returncode: int | None = None):
        super().__init__(message)
        self.output = output
        self.returncode = returncode


class BuildError(RegistryError):
    """The kernel folder cannot be turned into a Hub build (e.g. a non-portable import)."""


class PublishError(RegistryError):
    """Publishing to the Hub failed; no partial version was made visible."""


class KernelNotFoundError(RegistryError, LookupError):
    """The kernel repository does not exist (or is private and no valid token was given)."""


class RevisionNotFoundError(RegistryError, LookupError):
    """The requested revision (branch, tag or commit) does not exist in the repository."""


class VersionNotFoundError(RegistryError, LookupError):
    """The requested major version (branch `v<N>`) does not exist, or no version was published."""


class VariantNotFoundError(RegistryError, LookupError):
    """The revision holds no build for the requested backend (e.g. no `build/torch-cpu/`)."""


class NotInCacheError(RegistryError, LookupError):
    """Offline (HF_HUB_OFFLINE=1) and what was asked for is not in the local cache."""


class DownloadError(RegistryError, OSError):
    """The download failed part way (network error, server gone). The cache stays consistent:
    finished files are complete, unfinished ones are resumed or redone by the next pull."""


class UntrustedKernelError(RegistryError, PermissionError):
    """The kernel's organization is not trusted and `trust_remote_code=True` was not given."""


class IntegrityError(RegistryError):
    """A file of a downloaded build does not match the digest published in its metadata.json
    (or is missing, or is not listed there). `path` names the offending file."""

    def __init__(self, message: str, *, path: str | None = None):
        super().__init__(message)
        self.path = path


class LockMismatchError(RegistryError):
    """What the Hub or the cache holds differs from what `kernels.lock` pins."""


class BackendUnavailableError(RegistryError, ImportError):
    """The build was downloaded and verified but cannot run here (e.g. a Neuron build without
    the Neuron SDK)."""


class KernelCallError(RegistryError, TypeError, ValueError):
    """A kernel function was called with arguments it does not accept (dtype, device, shape,
    number of arguments). Both a TypeError and a ValueError, as numpy and torch would raise."""
