"""Every library kernel, published and pulled, as a torch op: same values as on numpy, and
opcheck passes, in each dtype the manifest declares."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hubfixtures import LIBRARY  # noqa: E402

from nkikit.registry.manifest import load_manifest  # noqa: E402
from nkikit.registry.probe import example_inputs  # noqa: E402
from nkikit.registry.pull import pull  # noqa: E402
from nkikit.torch.convert import from_numpy, to_numpy  # noqa: E402

NAMES = sorted(p.parent.name for p in LIBRARY.glob("*/kernel.toml"))
CASES = [
    (n, f, d)
    for n in NAMES
    for f, spec in load_manifest(LIBRARY / n).functions.items()
    for d in spec.dtypes
]


@pytest.fixture(scope="module")
def pulled(library_repos, hub_url: str, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN001, ANN201
    cache = tmp_path_factory.mktemp("c")
    return {
        n: pull(f"nkikit/{n.replace('_', '-')}", version=1, endpoint=hub_url, cache_dir=cache)
        for n in NAMES
    }


@pytest.mark.parametrize(("name", "function", "dtype"), CASES)
def test_library_kernel_as_torch_op(pulled, name: str, function: str, dtype: str) -> None:  # noqa: ANN001
    fn = getattr(pulled[name], function)
    arrays = example_inputs(fn.spec, dtype, seed=3)
    tensors = [from_numpy(a.copy()) for a in arrays]
    got = fn(*tensors)
    want = fn(*arrays)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert isinstance(g, torch.Tensor) and g.dtype == from_numpy(np.asarray(w)).dtype
        np.testing.assert_array_equal(
            to_numpy(g).view(np.uint8), np.ascontiguousarray(w).view(np.uint8)
        )
    if dtype == "float32":  # registration checks; one dtype suffices (values are checked above)
        result = torch.library.opcheck(fn.op, tuple(tensors))
        assert set(result.values()) == {"SUCCESS"}, result
