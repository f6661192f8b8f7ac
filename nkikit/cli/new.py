"""``nkikit new NAME [--dialect beta1|nki]``: a kernel folder that tests and publishes as created.

The folder is a Python package (so several can be tested in one pytest run) holding

    NAME/__init__.py      the public function
    NAME/kernel.py        the kernel: ``a + b`` over [N, D] arrays, 128 rows per tile
    NAME/reference.py     its numpy reference
    NAME/test_NAME.py     hypothesis property tests against the reference, and the manifest
    NAME/kernel.toml      the manifest `nkikit publish` reads
    NAME/README.md        what the kernel card shows under "From the kernel's README"

``--dialect beta1`` (the default) writes an NKI Beta 1 kernel (``nl.load``/``nl.store``,
tiles returned); ``--dialect nki`` an NKI 0.x kernel (``nisa`` instructions with ``dst=``).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import keyword
import os
import re
import sys
from pathlib import Path

from .options import UsageError, add_out, output_folder

KERNEL_BETA1 = '''"""{name}: ``a + b`` for two [N, D] arrays of one dtype (NKI Beta 1).

128 rows (the partition count, nl.tile_size.pmax) per tile; the last tile is masked, so any
number of rows works.
"""

import nkikit as nki
import nkikit.language as nl


@nki.jit
def {name}(a, b):
    """a, b: [N, D] of one dtype -> a + b, computed in fp32 and rounded once to that dtype."""
    n, d = a.shape
    out = nl.ndarray((n, d), dtype=a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(nl.tile_size.pmax)[:, None]
    i_f = nl.arange(d)[None, :]
    for t in nl.affine_range((n + nl.tile_size.pmax - 1) // nl.tile_size.pmax):
        rows = t * nl.tile_size.pmax + i_p
        valid = rows < n
        at = nl.load(a[rows, i_f], mask=valid)
        bt = nl.load(b[rows, i_f], mask=valid)
        nl.store(out[rows, i_f], value=nl.add(at, bt, mask=valid), mask=valid)
    return out
'''

KERNEL_NKI = '''"""{name}: ``a + b`` for two [N, D] arrays of one dtype (NKI 0.x).

128 rows (the partition count) per tile; the last tile is as tall as the rows left.
"""

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl

P = 128  # partitions per tile


@nki.jit
def {name}(a, b):
    """a, b: [N, D] of one dtype -> a + b, computed in fp32 and rounded once to that dtype."""
    n, d = a.shape
    out = nl.ndarray((n, d), dtype=a.dtype, buffer=nl.shared_hbm)
    for start in range(0, n, P):
        rows = min(P, n - start)
        at = nl.ndarray((rows, d), dtype=a.dtype, buffer=nl.sbuf)
        bt = nl.ndarray((rows, d), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a[start : start + rows, :])
        nisa.dma_copy(dst=bt, src=b[start : start + rows, :])
        nisa.tensor_tensor(dst=at, data1=at, data2=bt, op=nl.add)
        nisa.dma_copy(dst=out[start : start + rows, :], src=at)
    return out
'''

REFERENCE = '''"""numpy reference of {name}."""

import numpy as np


def {name}(a, b):
    """``a + b`` in float64."""
    return np.asarray(a, dtype=np.float64) + np.asarray(b, dtype=np.float64)
'''

TEST = '''"""{name} against its numpy reference: hypothesis over shapes (ragged last tiles) and
dtypes, and the manifest."""

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from nkikit.testing import check_kernel, check_manifest, random_inputs

from . import kernel, reference

DTYPES = ["float32", "bfloat16"]


@settings(max_examples=10, deadline=None)
@given(
    rows=st.integers(1, 300),
    cols=st.integers(1, 256),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_{name}_matches_reference(rows, cols, dtype, seed):
    a, b = random_inputs([(rows, cols), (rows, cols)], dtype, seed)
    check_kernel(kernel.{name}, reference.{name}, a, b, dtype=dtype)


def test_{name}_manifest():
    check_manifest(Path(__file__).parent, __package__)
'''

INIT = '''"""{name}: ``a + b`` for two [N, D] arrays (see kernel.py)."""

from .kernel import {name}

__all__ = ["{name}"]
'''

MANIFEST = """[kernel]
name = "{name}"
version = 1
license = "Apache-2.0"
description = "a + b for two [N, D] arrays, 128 rows per tile ({dialect})"

[functions.{name}]
entry = "kernel:{name}"
reference = "reference:{name}"
inputs = ["a", "b"]
dtypes = ["float32", "bfloat16"]
example = {{ a = [256, 512], b = [256, 512] }}
"""

README = """# {name}

`a + b` for two `[N, D]` arrays of one dtype, 128 rows per tile ({dialect}).

```
nkikit test {name}                              # the property tests
nkikit run {name}/kernel.py::{name} --args a=256x512,b=256x512
nkikit profile {name}/kernel.py::{name} --args a=4096x4096:bfloat16,b=4096x4096:bfloat16
nkikit publish {name} --repo ORG/{name}
```
"""

DIALECTS = {"beta1": ("NKI Beta 1", KERNEL_BETA1), "nki": ("NKI 0.x", KERNEL_NKI)}


def add_new(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "new",
        help="create a kernel folder (kernel, reference, tests, kernel.toml)",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "name",
        metavar="NAME",
        help="the kernel's name: a lowercase ASCII Python identifier, e.g. my_add",
    )
    p.add_argument(
        "--dialect",
        choices=sorted(DIALECTS),
        default="beta1",
        help="beta1: NKI Beta 1 (nl.load/nl.store); nki: NKI 0.x (nisa with dst=)",
    )
    add_out(p, "folder to create it in (default: .)", default=".")
    p.set_defaults(fn=cmd_new)


# a lowercase ASCII identifier that is also a Hub kernel name once "_" is "-" (the Hub's
# rule, nkikit.registry.names: a letter first, a letter or digit last, two characters at least)
_NAME = re.compile(r"[a-z][a-z0-9_]*[a-z0-9]")
# the folder's own modules: `from .kernel import NAME` in __init__.py would replace them
_OWN_MODULES = ("kernel", "reference")


def check_name(name: str) -> None:
    """Raise UsageError for a NAME the scaffold cannot use as its package, its function and its
    Hub repo name."""
    if keyword.iskeyword(name):
        raise UsageError(f"NAME {name!r} is a Python keyword; choose another, e.g. my_{name}")
    if not _NAME.fullmatch(name):
        raise UsageError(
            "NAME must be a lowercase Python identifier of ASCII letters, digits and _, "
            f"starting with a letter and ending with a letter or digit (e.g. my_add), got {name!r}"
        )
    if name in _OWN_MODULES:
        raise UsageError(
            f"NAME {name!r} is the name of a module in the kernel folder "
            f"({', '.join(m + '.py' for m in _OWN_MODULES)}); choose another, e.g. my_{name}"
        )
    # pytest imports the folder as a top-level package: it would hide the module of that name
    # (a folder named json breaks every `import json` run from beside it, nkikit's own too)
    path = [p for p in sys.path if p not in ("", os.getcwd())]  # not what lies beside it now
    if name in sys.stdlib_module_names or importlib.machinery.PathFinder.find_spec(name, path):
        raise UsageError(
            f"NAME {name!r} is the name of an installed Python module, which the kernel "
            f"folder would hide; choose another, e.g. {name}_kernel"
        )


def create(name: str, parent: Path, dialect: str = "beta1") -> Path:
    """Write the kernel folder ``parent/name``; return its path. Raises UsageError for a name
    :func:`check_name` refuses or a folder that already exists."""
    check_name(name)
    folder = parent / name
    if folder.exists():
        raise UsageError(f"{folder} already exists")
    label, kernel = DIALECTS[dialect]
    files = {
        "__init__.py": INIT,
        "kernel.py": kernel,
        "reference.py": REFERENCE,
        f"test_{name}.py": TEST,
        "kernel.toml": MANIFEST,
        "README.md": README,
    }
    folder.mkdir(parents=True)
    for file, text in files.items():
        (folder / file).write_text(text.format(name=name, dialect=label), encoding="utf-8")
    return folder


def cmd_new(ns: argparse.Namespace) -> int:
    folder = create(ns.name, output_folder(ns.out), ns.dialect)
    print(f"created {folder}/ ({', '.join(sorted(p.name for p in folder.iterdir()))})")
    print(f"next: nkikit test {folder}   then: nkikit publish {folder} --repo ORG/{ns.name}")
    return 0
