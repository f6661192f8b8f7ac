"""Suite-wide test setup: the hypothesis settings profile, trace checking, and the
``unclean_refusal`` check of the misuse tests.

``ci`` (deterministic, no example database) when the ``CI`` environment variable is set,
``dev`` otherwise; ``HYPOTHESIS_PROFILE`` overrides both (see ``nkikit.testing.profiles``).

``NKIKIT_CHECK_TRACES=1``: every Perfetto/Chrome trace the tests write is checked (format, time
order, nesting, flows) by the writer itself (see ``nkikit.profiler.tracecheck``).
"""

import os
import traceback

import pytest

import nkikit
from nkikit.errors import NkiError
from nkikit.profiler.tracecheck import ENV as _CHECK_TRACES
from nkikit.testing.profiles import load_profile

load_profile()
os.environ.setdefault(_CHECK_TRACES, "1")

_PACKAGE = os.path.dirname(nkikit.__file__)


def _unclean_refusal(what: str, call) -> str | None:
    """Run ``call``: it may succeed, raise an NkiError, or raise an exception from outside
    nkikit (Python refusing the call itself); an exception raised inside nkikit is returned
    as a line naming ``what`` and where it came from."""
    try:
        call()
    except NkiError:
        pass
    except Exception as e:  # noqa: BLE001 - where it came from decides
        inner = traceback.extract_tb(e.__traceback__)[-1]
        if inner.filename.startswith(_PACKAGE):
            return f"{what}: {type(e).__name__} from {inner.filename}:{inner.lineno}: {e}"
    return None


@pytest.fixture(scope="session")
def unclean_refusal():
    """The misuse tests' check of one call (see ``_unclean_refusal``)."""
    return _unclean_refusal
