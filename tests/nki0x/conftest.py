"""Every NKI 0.x test kernel runs on both simulators, which must agree bit for bit (the
differential contract the Beta-1 suite checks in tests/sim/test_differential.py)."""

import pytest


@pytest.fixture(autouse=True)
def _both_simulators(monkeypatch):
    monkeypatch.setenv("NKIKIT_SIM", "check")
