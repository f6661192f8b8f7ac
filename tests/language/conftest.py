"""Fixtures for the nl tests: the same ``rejects`` / ``type_error_at_bad_line`` as the nisa
tests (tests/isa/conftest.py), loaded from there so there is one copy."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_nisa_test_fixtures", Path(__file__).parents[1] / "isa" / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)

rejects = _fixtures.rejects
type_error_at_bad_line = _fixtures.type_error_at_bad_line
bad_line = _fixtures.bad_line
