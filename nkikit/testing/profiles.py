"""Hypothesis settings profiles for kernel tests.

* ``ci``: deterministic (``derandomize=True``, no example database), so a CI run fails or
  passes the same way every time; ``print_blob=True`` prints the reproduction blob on failure.
* ``dev``: random exploration with the local example database, same budget.
* ``thorough``: ten times the examples, for a nightly or a pre-release run
  (``HYPOTHESIS_PROFILE=thorough pytest``).

No deadline anywhere: simulation time varies with the shape drawn, and the first call of a
shape includes tracing.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# Kernel tests simulate a kernel per example; 20 keeps each property test to a few seconds.
CI_MAX_EXAMPLES = 20
DEV_MAX_EXAMPLES = 20
THOROUGH_MAX_EXAMPLES = 200

_SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large]
_registered = False


def register_profiles() -> None:
    """Register the ``ci``, ``dev`` and ``thorough`` profiles (idempotent)."""
    global _registered
    if _registered:
        return
    settings.register_profile(
        "ci",
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=True,
        max_examples=CI_MAX_EXAMPLES,
        suppress_health_check=_SLOW_DATA,
    )
    settings.register_profile(
        "dev", deadline=None, max_examples=DEV_MAX_EXAMPLES, suppress_health_check=_SLOW_DATA
    )
    settings.register_profile(
        "thorough",
        deadline=None,
        print_blob=True,
        max_examples=THOROUGH_MAX_EXAMPLES,
        suppress_health_check=_SLOW_DATA,
    )
    _registered = True


def profile_name(environ: os._Environ | dict | None = None) -> str:
    """The profile to use: ``$HYPOTHESIS_PROFILE`` if set, else ``ci`` when ``$CI`` is set to
    anything but ``""``/``0``/``false``, else ``dev``."""
    env = os.environ if environ is None else environ
    explicit = env.get("HYPOTHESIS_PROFILE")
    if explicit:
        return explicit
    ci = env.get("CI", "").strip().lower()
    return "ci" if ci not in ("", "0", "false", "no") else "dev"


def load_profile(name: str | None = None) -> str:
    """Register the profiles and load ``name`` (default: ``profile_name()``).  Returns the name
    loaded.  Raises ``hypothesis.errors.InvalidArgument`` for an unknown profile."""
    register_profiles()
    chosen = name or profile_name()
    settings.load_profile(chosen)
    return chosen
