"""`from nkikit import kernels`: share NKI kernels through the Hugging Face Hub.

    kernels.publish("kernels/rmsnorm", "org/rmsnorm")        # test, build, publish as v1
    k = kernels.pull("org/rmsnorm", version=1)               # download, verify, import
    y = k.rmsnorm(x, weight)                                  # numpy arrays or torch tensors
    kernels.lock(["org/rmsnorm@1"])                          # pin commits in kernels.lock

Published repos follow the HF `kernels` layout (branch vN, build/torch-cpu and
build/torch-neuron, metadata.json with digests), so `kernels.get_kernel` loads them too.
The machinery lives in `nkikit.registry`; this module is its public face.
"""

from __future__ import annotations

from .registry.errors import (
    BackendUnavailableError,
    BuildError,
    DownloadError,
    IntegrityError,
    KernelCallError,
    KernelNotFoundError,
    KernelTestsFailedError,
    LockMismatchError,
    ManifestError,
    NotInCacheError,
    PublishError,
    RegistryError,
    RevisionNotFoundError,
    UntrustedKernelError,
    VariantNotFoundError,
    VersionNotFoundError,
)
from .registry.lock import lock
from .registry.lockfile import LockEntry, read_lockfile
from .registry.module import KernelModule
from .registry.publish import PublishResult, publish, publish_all
from .registry.pull import locate, pull
from .registry.trust import DEFAULT_TRUSTED_ORGS, TRUSTED_ORGS_ENV

__all__ = [
    "DEFAULT_TRUSTED_ORGS",
    "TRUSTED_ORGS_ENV",
    "BackendUnavailableError",
    "BuildError",
    "DownloadError",
    "IntegrityError",
    "KernelCallError",
    "KernelModule",
    "KernelNotFoundError",
    "KernelTestsFailedError",
    "LockEntry",
    "LockMismatchError",
    "ManifestError",
    "NotInCacheError",
    "PublishError",
    "PublishResult",
    "RegistryError",
    "RevisionNotFoundError",
    "UntrustedKernelError",
    "VariantNotFoundError",
    "VersionNotFoundError",
    "locate",
    "lock",
    "publish",
    "publish_all",
    "pull",
    "read_lockfile",
]
