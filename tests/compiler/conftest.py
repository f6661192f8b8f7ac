"""Shared helpers for the compiler tests: small kernels and a target with round numbers."""

from __future__ import annotations

import pytest

from nkikit.targets import get_target


@pytest.fixture(autouse=True)
def _no_target_override(monkeypatch):
    """Tests pick their targets explicitly; a developer's environment must not leak in."""
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)


@pytest.fixture
def trn2():
    return get_target("trn2")
