"""nkikit.errors: one class per catalogue entry, dispatch by name, and every raise site in the
package naming a catalogue entry with exactly the fields its template formats."""

from __future__ import annotations

import ast
import pickle
import string
from pathlib import Path

import numpy as np
import pytest

import nkikit as nki
import nkikit.errors as errors
import nkikit.language as nl
from nkikit.errors import CATALOGUE, NkiError, NkiInternalError, SourceLoc

PACKAGE = Path(errors.__file__).parent


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _template_fields(template: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(template) if field}


def _raise_sites() -> tuple[list[tuple[str, str, set[str]]], list[str]]:
    """(name, file:line, keyword fields) of every ``NkiError("err_...", ...)`` and
    ``<site>.fail("err_...", ...)`` call in the package, and the sites skipped (a name that is
    not a string literal, or fields passed as ``**dict``)."""
    sites, skipped = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            callee = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            is_class = callee in errors.__dict__ and callee.startswith("Err")
            if callee not in ("NkiError", "fail") and not is_class:
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            if is_class:
                name = errors.__dict__[callee].name
            elif node.args and isinstance(node.args[0], ast.Constant):
                name = node.args[0].value
                if not isinstance(name, str) or not name.startswith("err_"):
                    continue  # some other .fail(...)
            else:
                if callee == "NkiError":
                    skipped.append(f"{where} (name is not a literal)")
                continue
            if any(k.arg is None for k in node.keywords):
                skipped.append(f"{where} (fields passed as **dict)")
                continue
            sites.append((name, where, {k.arg for k in node.keywords}))
    return sites, skipped


def test_the_scan_finds_the_raise_sites():
    sites, skipped = _raise_sites()
    assert len(sites) > 100  # the package has well over a hundred; a broken scan finds none
    files = {w.split(":")[0] for _, w, _ in sites}
    assert {"nkikit/isa/instructions.py", "nkikit/ir/verify.py", "nkikit/trace/index.py"} <= files
    # the verifier's Site.fail(name, **fields) helper forwards a variable name: its callers are
    # scanned instead
    assert all("not a literal" in s or "**dict" in s for s in skipped)


def test_every_raise_site_names_an_entry_and_passes_its_fields():
    sites, _ = _raise_sites()
    problems = []
    for name, where, fields in sites:
        if name not in CATALOGUE:
            problems.append(f"{where}: {name} is not in the catalogue")
            continue
        need = _template_fields(CATALOGUE[name])
        if fields != need:
            problems.append(
                f"{where}: {name} gets fields {sorted(fields)}, its template uses {sorted(need)}"
            )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_one_class_per_entry(name):
    cls = getattr(errors, _camel(name))
    assert issubclass(cls, NkiError) and cls is not NkiError
    assert cls.name == name and cls.template == CATALOGUE[name]
    fields = {f: f"<{f}>" for f in _template_fields(cls.template)}
    loc = SourceLoc(__file__, 1)
    by_name = NkiError(name, loc, **fields)
    assert type(by_name) is cls
    direct = cls(loc, **fields)
    assert str(direct) == str(by_name)
    assert direct.name == name and direct.loc == loc and direct.fields == fields
    assert direct.detail == cls.template.format(**fields)


def test_unknown_names_and_bad_fields_are_internal_errors():
    with pytest.raises(NkiInternalError, match="unknown error name 'err_no_such_thing'"):
        NkiError("err_no_such_thing", None, why="x")
    with pytest.raises(NkiInternalError, match="needs field 'limit'"):
        NkiError("err_num_partition_exceed_arch_limit", None, size=256)
    with pytest.raises(NkiInternalError, match="constructed as"):
        errors.ErrInvalidArgument("err_unsupported_api", None, api="a", why="b")
    with pytest.raises(TypeError):
        NkiError()
    assert not issubclass(NkiInternalError, NkiError)  # a bug in nkikit is not a kernel error


def test_errors_pickle_as_their_class():
    loc = SourceLoc(__file__, 3, "f")
    e = NkiError("err_unsupported_memory", loc, op="load", what="src", allowed="HBM", got="sbuf")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is errors.ErrUnsupportedMemory
    assert (back.loc, back.fields, str(back)) == (e.loc, e.fields, str(e))
    bare = pickle.loads(pickle.dumps(errors.ErrInvalidArgument(None, op="x", why="y")))
    assert str(bare) == "err_invalid_argument: x: y"  # no location stays no location


def test_a_kernel_error_is_caught_by_its_class():
    @nki.jit
    def too_many_partitions(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out[0:256, :], value=nl.load(x[0:256, :]))
        return out

    with pytest.raises(errors.ErrNumPartitionExceedArchLimit) as e:
        too_many_partitions(np.zeros((256, 8), np.float32))
    assert e.value.name == "err_num_partition_exceed_arch_limit"
    assert e.value.loc.file == __file__ and "nl.load(x[0:256" in e.value.loc.text
    assert isinstance(e.value, NkiError)
