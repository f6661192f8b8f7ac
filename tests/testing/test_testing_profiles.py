"""The hypothesis profiles: ``ci`` is deterministic, the environment picks the profile."""

from __future__ import annotations

from hypothesis import settings

from nkikit.testing import load_profile, profile_name, profiles, register_profiles


def test_ci_profile_is_deterministic():
    register_profiles()
    ci = settings.get_profile("ci")
    assert ci.derandomize is True
    assert ci.database is None
    assert ci.deadline is None
    assert ci.print_blob is True
    assert 10 <= ci.max_examples <= 25


def test_dev_and_thorough_profiles():
    register_profiles()
    assert settings.get_profile("dev").deadline is None
    assert settings.get_profile("thorough").max_examples > settings.get_profile("ci").max_examples


def test_profile_chosen_by_environment():
    assert profile_name({}) == "dev"
    assert profile_name({"CI": "true"}) == "ci"
    assert profile_name({"CI": "1"}) == "ci"
    assert profile_name({"CI": "false"}) == "dev"
    assert profile_name({"CI": "0"}) == "dev"
    assert profile_name({"CI": "1", "HYPOTHESIS_PROFILE": "thorough"}) == "thorough"


def test_conftest_loaded_the_profile():
    # tests/conftest.py loads profile_name(); the active settings carry its values
    expected = settings.get_profile(profile_name())
    assert settings.default.max_examples == expected.max_examples
    assert settings.default.derandomize == expected.derandomize


def test_load_profile_returns_the_name():
    name = profile_name()
    assert load_profile() == name
    assert profiles.CI_MAX_EXAMPLES <= 25
