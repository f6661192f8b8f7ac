"""Test setup for the kernel library: the same hypothesis profile as the main suite, so
``pytest kernels`` alone behaves like ``pytest`` (``ci`` when ``CI`` is set, else ``dev``)."""

from nkikit.testing.profiles import load_profile

load_profile()
