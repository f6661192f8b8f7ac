"""The whole library through the Hub in one go: ``nkikit publish kernels --all --org ORG``
(tests skipped, as CI runs them per folder) to a local ``nkikit.hub``, then every kernel pulled
back and each function's manifest example (the inputs ``check_manifest`` uses) run in every declared dtype against its reference
(the pulled module's own entry and reference, i.e. the code that went through hub/).

The tolerance class of each kernel is its test file's ``OP_KIND`` (``matmul``, the loosest,
when the test file does not say)."""

from __future__ import annotations

import contextlib
import importlib
import io
from pathlib import Path

import pytest

from nkikit.registry.cli import main_publish
from nkikit.registry.manifest import load_manifest
from nkikit.registry.publish import discover_kernels
from nkikit.registry.pull import pull
from nkikit.testing import check_kernel, example_inputs
from nkikit.testing.manifest import dtype_variants

LIBRARY = Path(__file__).resolve().parents[2] / "kernels"
ORG = "roundtrip"
FOLDERS = discover_kernels(LIBRARY)


def _tolerance(folder: Path) -> tuple[str, float | None]:
    """The kernel's own test module's tolerance class (``OP_KIND``, default ``matmul``) and
    its absolute tolerance for 16-bit inputs (``BF16_ATOL``), if it sets one."""
    tests = importlib.import_module(f"nkikit.library.{folder.name}.test_{folder.name}")
    return getattr(tests, "OP_KIND", "matmul"), getattr(tests, "BF16_ATOL", None)


@pytest.fixture(scope="module")
def publish_run(hub_url: str) -> tuple[str, str, str]:
    """``nkikit publish kernels --all --org roundtrip --no-tests`` against the loopback hub, run
    once: (hub url, printed output, error text or "")."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main_publish(
            [str(LIBRARY), "--all", "--org", ORG, "--no-tests", "--endpoint", hub_url]
        )
    failure = (
        "" if rc == 0 else f"nkikit publish --all failed:\n{err.getvalue()}{out.getvalue()[-2000:]}"
    )
    return hub_url, out.getvalue(), failure


@pytest.fixture
def published(publish_run: tuple[str, str, str]) -> tuple[str, str]:
    url, printed, failure = publish_run
    if failure:
        pytest.fail(failure, pytrace=False)
    return url, printed


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def test_publish_all_published_every_kernel(published: tuple[str, str]) -> None:
    _, printed = published
    for folder in FOLDERS:
        manifest = load_manifest(folder)
        assert f"{ORG}/{manifest.hub_name} v{manifest.version}:" in printed, folder.name


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_pulled_kernel_matches_reference(
    published: tuple[str, str], cache: Path, folder: Path
) -> None:
    manifest = load_manifest(folder)
    mod = pull(
        f"{ORG}/{manifest.hub_name}",
        version=manifest.version,
        endpoint=published[0],
        cache_dir=cache,
        trust_remote_code=True,  # our own org on a loopback hub
    )
    kind, low_precision_atol = _tolerance(folder)
    for name, spec in manifest.functions.items():
        fn = getattr(mod, name)
        assert fn.reference is not None, f"{folder.name}.{name}: no reference in the pulled build"
        for dtype, per_input in dtype_variants(spec):
            # the inputs kernels' own manifest tests use (nkikit.testing.check_manifest): the
            # declared per-input dtypes (e.g. int class targets) and value ranges
            arrays = example_inputs(spec, dtype, seed=0, input_dtypes=per_input)
            atol = None if dtype == "float32" else low_precision_atol
            check_kernel(
                fn.entry,
                fn.reference,
                *arrays,
                dtype=dtype,
                op_kind=kind,
                atol=atol,
                **dict(spec.attrs),
            )
