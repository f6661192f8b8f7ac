"""docs/beta1-api.md stays true: every name of the Beta-1 API table exists in the package with
the status the table gives it, and no public name of nkikit's Beta-1 modules is missing from it.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import nkikit as nki
import nkikit.compiler
import nkikit.isa as nisa
import nkikit.language as nl
import nkikit.typing as nt
from nkikit.errors import ErrUnsupportedApi
from nkikit.ir.prims import PRIMS
from nkikit.language.unsupported import NotSupported

TABLE = Path(__file__).resolve().parents[2] / "docs" / "beta1-api.md"
MODULES = {
    "nki": nki,
    "nki.language": nl,
    "nki.isa": nisa,
    "nki.typing": nt,
    "nki.compiler": nkikit.compiler,
}
STATUSES = {"implemented", "modeled", "not supported"}
ROW = re.compile(r"^\| `([\w.]+)` \| `(\w+)` \| ([\w ]+) \| (.*) \|$", re.M)


def rows() -> list[tuple[str, str, str, str]]:
    return ROW.findall(TABLE.read_text())


def test_the_table_is_well_formed():
    found = rows()
    assert len(found) > 150
    assert {m for m, *_ in found} == set(MODULES)
    assert {s for _, _, s, _ in found} <= STATUSES
    keys = [(m, n) for m, n, *_ in found]
    assert len(keys) == len(set(keys)), "a name is listed twice"


@pytest.mark.parametrize(("module", "name", "status", "note"), rows())
def test_each_name_is_what_the_table_says(module, name, status, note):
    obj = getattr(MODULES[module], name)  # AttributeError: the package lacks a listed name
    if status == "not supported":
        assert isinstance(obj, NotSupported), f"{module}.{name} is listed as not supported"
        with pytest.raises(ErrUnsupportedApi) as info:
            obj()
        assert name in str(info.value) and "not supported" in str(info.value)
        return
    assert not isinstance(obj, NotSupported), f"{module}.{name} raises err_unsupported_api"
    if module == "nki.isa" and status == "modeled":
        prim = re.fullmatch(r"primitive `(\w+)`", note)
        assert prim, f"nki.isa.{name}: a modeled instruction names its IR primitive"
        assert PRIMS[prim.group(1)].engines, f"{prim.group(1)} runs on no engine"
    if status == "modeled":
        assert callable(obj)


@pytest.mark.parametrize("module", ["nki.language", "nki.isa", "nki.typing"])
def test_no_public_name_is_missing_from_the_table(module):
    listed = {n for m, n, *_ in rows() if m == module}
    mod = MODULES[module]
    public = {
        n
        for n in dir(mod)
        if not n.startswith("_")
        and not inspect.ismodule(getattr(mod, n))
        and n != "annotations"  # from __future__ import annotations
    }
    assert public - listed == set()


def test_top_level_and_compiler_names_are_listed():
    listed = {(m, n) for m, n, *_ in rows()}
    assert {("nki", n) for n in nki.__all__} <= listed
    beta1 = set(nkikit.language.compiler.__all__) - {"Allocation", "Directive", "user_allocation"}
    assert {("nki.compiler", n) for n in beta1} <= listed
