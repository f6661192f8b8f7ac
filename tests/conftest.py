"""Suite-wide test setup: the hypothesis settings profile.

``ci`` (deterministic, no example database) when the ``CI`` environment variable is set,
``dev`` otherwise; ``HYPOTHESIS_PROFILE`` overrides both (see ``nkikit.testing.profiles``).
"""

from nkikit.testing.profiles import load_profile

load_profile()
