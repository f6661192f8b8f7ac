"""Suite-wide test setup: the hypothesis settings profile, and trace checking.

``ci`` (deterministic, no example database) when the ``CI`` environment variable is set,
``dev`` otherwise; ``HYPOTHESIS_PROFILE`` overrides both (see ``nkikit.testing.profiles``).

``NKIKIT_CHECK_TRACES=1``: every Perfetto/Chrome trace the tests write is checked (format, time
order, nesting, flows) by the writer itself (see ``nkikit.profiler.tracecheck``).
"""

import os

from nkikit.profiler.tracecheck import ENV as _CHECK_TRACES
from nkikit.testing.profiles import load_profile

load_profile()
os.environ.setdefault(_CHECK_TRACES, "1")
