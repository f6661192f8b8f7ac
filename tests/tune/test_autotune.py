"""nki.autotune: ranking by the cost model, pruning by the verifier, the numeric check, the disk
cache, and both dialects, on kernels whose best config is known (tests/tune/kernels.py)."""

from __future__ import annotations

import numpy as np
import pytest

import nkikit as nki
import nkikit.nki as nki0x
from nkikit.errors import NkiError
from nkikit.tune.cache import JsonStore

from .kernels import scale_kernel, scale_kernel_0x

COLS = [{"cols": 128}, {"cols": 512}, {"cols": 2048}]


@pytest.fixture
def x():
    return np.random.default_rng(0).standard_normal((256, 4096)).astype(np.float32)


def test_widest_tile_wins_and_the_winner_runs(x):
    tuned = nki.autotune(configs=COLS, key=["x"], cache=False)(scale_kernel)
    out = tuned(x)
    assert tuned.report.best == {"cols": 2048}
    np.testing.assert_array_equal(out, 2 * x)
    times = [c.total_us for c in tuned.report.candidates]
    assert times[0] > times[1] > times[2]  # one DMA per tile: fewer, larger tiles are faster
    assert tuned.report.speedup == pytest.approx(times[0] / times[2])


def test_configs_breaking_a_hardware_rule_are_pruned_with_the_rule(x):
    tuned = nki.autotune(configs=nki.tune.space(rows=[128, 256], cols=[512]), cache=False)(
        scale_kernel
    )
    report = tuned.tune(x)
    pruned = report.pruned
    assert [c.config for c in pruned] == [{"rows": 256, "cols": 512}]
    assert pruned[0].rule == "err_num_partition_exceed_arch_limit"
    assert pruned[0].stage == "verify"  # rejected before it was compiled or modeled
    assert pruned[0].total_us is None
    assert "kernels.py" in pruned[0].detail  # the kernel's own line
    assert "err_num_partition_exceed_arch_limit" in str(report)


def test_when_every_config_breaks_a_rule_the_first_error_is_raised(x):
    tuned = nki.autotune(configs=[{"rows": 256}, {"rows": 512}], cache=False)(scale_kernel)
    with pytest.raises(NkiError) as info:
        tuned(x)
    assert info.value.name == "err_num_partition_exceed_arch_limit"
    assert any("rows': 512" in n for n in info.value.__notes__)


def test_a_wrong_config_is_skipped_by_the_numeric_check():
    # 5120 columns: cols=2048 is the fastest but leaves the last 1024 columns unwritten
    x = np.random.default_rng(1).standard_normal((128, 5120)).astype(np.float32)
    unchecked = nki.autotune(configs=COLS, cache=False)(scale_kernel)
    assert unchecked.best_config(x) == {"cols": 2048}
    checked = nki.autotune(configs=COLS, cache=False, reference=lambda x: 2 * x)(scale_kernel)
    assert checked.best_config(x) == {"cols": 512}
    status = {c.config["cols"]: c.status for c in checked.report.candidates}
    assert status == {128: "ok", 512: "ok", 2048: "wrong"}
    assert checked.report.winner.checked


def test_the_winner_is_cached_on_disk_and_reused(x, tmp_path):
    def make():
        return nki.autotune(configs=COLS, key=["x"], cache=tmp_path)(scale_kernel)

    first = make()
    first.tune(x)
    assert not first.report.cached
    entries = JsonStore(tmp_path).keys()
    assert len(entries) == 1
    second = make()  # a new process would start like this: nothing in memory
    report = second.tune(x)
    assert report.cached and report.best == {"cols": 2048}
    assert report.profile.total_us == pytest.approx(first.report.profile.total_us)
    # another key (shape) is another entry
    second.tune(np.ones((128, 2048), np.float32))
    assert len(JsonStore(tmp_path).keys()) == 2


def test_a_damaged_cache_entry_is_searched_again_and_rewritten(x, tmp_path):
    tuned = nki.autotune(configs=COLS, key=["x"], cache=tmp_path)(scale_kernel)
    tuned.tune(x)
    (entry,) = JsonStore(tmp_path).keys()
    path = JsonStore(tmp_path).path(entry)
    path.write_text('{"kernel": "scale_ker')  # a torn write by some other program
    again = nki.autotune(configs=COLS, key=["x"], cache=tmp_path)(scale_kernel)
    assert not again.tune(x).cached
    assert JsonStore(tmp_path).get(entry)["best_index"] == 2


def test_the_cache_key_holds_the_configs_and_the_target(x, tmp_path):
    nki.autotune(configs=COLS, key=["x"], cache=tmp_path)(scale_kernel).tune(x)
    nki.autotune(configs=COLS[:2], key=["x"], cache=tmp_path)(scale_kernel).tune(x)
    trn1 = nki.autotune(configs=COLS, key=["x"], cache=tmp_path, target="trn1")(scale_kernel)
    assert trn1.tune(x).key["target"] == "trn1"
    assert len(JsonStore(tmp_path).keys()) == 3


def test_prune_configs_by_drops_configs_before_tracing(x):
    def narrow_only(configs, named):
        return [c for c in configs if c["cols"] <= named["x"].shape[1] // 8]

    tuned = nki.autotune(configs=COLS, cache=False, prune_configs_by=narrow_only)(scale_kernel)
    assert tuned.best_config(x) == {"cols": 512}
    assert tuned.report.pruned[0].rule == "prune_configs_by"


def test_tuned_parameters_cannot_also_be_passed(x):
    tuned = nki.autotune(configs=COLS, cache=False)(scale_kernel)
    with pytest.raises(TypeError, match="chosen by nki.autotune"):
        tuned(x, cols=128)


def test_autotune_goes_above_jit():
    with pytest.raises(TypeError, match="above @nki.jit"):
        nki.autotune(configs=COLS)(lambda x: x)


def test_the_0x_dialect_has_the_same_autotune(x):
    assert nki0x.autotune is nki.autotune
    # on trn2, as the Beta-1 kernel (a 0.x kernel's own default target is trn3)
    tuned = nki0x.autotune(configs=COLS, key=["x"], cache=False, target="trn2")(scale_kernel_0x)
    out = tuned(x)
    assert tuned.report.best == {"cols": 2048}
    np.testing.assert_array_equal(out, 2 * x)


def test_a_grid_launch_is_part_of_the_key(x):
    tuned = nki.autotune(configs=COLS, key=["x"], cache=False)(scale_kernel)
    assert tuned[2].key_of(x)["grid"] == [2]
    assert tuned.key_of(x)["grid"] == []


def test_the_numeric_check_needs_arrays():
    from nkikit.typing import TensorSpec

    spec = TensorSpec((256, 4096), np.dtype(np.float32))  # the shape of the x fixture
    tuned = nki.autotune(configs=COLS, cache=False, reference=lambda x: 2 * x)(scale_kernel)
    with pytest.raises(TypeError, match="needs arrays"):
        tuned.tune(spec)
    plain = nki.autotune(configs=COLS, cache=False)(scale_kernel)
    assert plain.best_config(spec) == {"cols": 2048}  # ranking needs only shapes and dtypes
