"""NKI 0.x random numbers: ``nisa.rng``, ``rand2``, ``set_rng_seed``, ``rand_set_state``,
``rand_get_state`` (and ``dropout``'s draws) [reference/nki-0x.md §4.12].  Argument parsing
only: each engine's PRNG state is an IR tensor the emit layer adds to the op
(``nkikit/trace/rng.py``), the records, the verifier and the generator (``nkikit/sim/prng.py``,
XORWOW per lane; deterministic, not the hardware's bits) hold the rest."""

from __future__ import annotations

from ...errors import SourceLoc, caller_loc
from ...ir.core import Access
from ...isa import engine
from ...trace import instructions as E
from ..launch import launch
from ..tensor import access_of, require_tensor
from . import _done, _engine_arg, _scalar_or_vector  # imported last by the package


def program() -> tuple:
    """The program being traced: each core of an LNC launch has its own generators."""
    return tuple(launch()[1])


def _tensor(x, loc: SourceLoc, op: str, role: str) -> Access:
    require_tensor(x, loc, f"nisa.{op}", role)
    return access_of(x, loc, f"{op} {role}")


def _bound(x, loc: SourceLoc, role: str, like: Access) -> Access | float:
    return _scalar_or_vector(x, loc, f"nisa.rand2 {role}", like)


def rng(dst, engine=engine.vector, name=None):
    """``dst`` = 32 random bits per element, truncated to the least significant bits of its
    integer dtype (int8/16/32, uint8/16/32), from the VectorE's generator (or the GpSimd's,
    NC-v3+, SBUF only)."""
    loc = caller_loc()
    d = _tensor(dst, loc, "rng", "dst")
    return _done(E.emit_rng(d, engine=_engine_arg(engine, "rng", loc), loc=loc, key=program()))


def rand2(dst, min, max, name=None):  # noqa: A002 - NKI's parameter names
    """``dst`` uniform in ``[min, max]`` from the VectorE's XORWOW generator (NC-v4);
    ``min`` / ``max`` fp32 scalars or (P, 1) fp32 tensors, ``min < max``."""
    loc = caller_loc()
    d = _tensor(dst, loc, "rand2", "dst")
    lo, hi = _bound(min, loc, "min", d), _bound(max, loc, "max", d)
    return _done(E.emit_rand2(d, lo, hi, loc=loc, key=program()))


def set_rng_seed(src_seeds, name=None):
    """Seed the VectorE's generator (every lane) from the 32-bit value of a ``[1, 1]``
    SBUF/PSUM tensor; the state persists for the rest of the kernel."""
    loc = caller_loc()
    s = _tensor(src_seeds, loc, "set_rng_seed", "src_seeds")
    return _done(E.emit_set_rng_seed(s, loc=loc, key=program()))


def rand_set_state(src_seeds, engine=engine.gpsimd, name=None):
    """Set the per-lane XORWOW state of the GpSimd's (NC-v3+) or VectorE's (NC-v4) generator
    from a uint32 SBUF tensor of 6 (GpSimd) or 24 (VectorE: 4 states) words per partition."""
    loc = caller_loc()
    s = _tensor(src_seeds, loc, "rand_set_state", "src_seeds")
    eng = _engine_arg(engine, "rand_set_state", loc)
    return _done(E.emit_rand_set_state(s, engine=eng, loc=loc, key=program()))


def rand_get_state(dst, engine=engine.gpsimd, name=None):
    """``dst`` (uint32, 6 or 24 words per partition) = the per-lane XORWOW state of the
    GpSimd's or the VectorE's generator (the inverse of ``rand_set_state``)."""
    loc = caller_loc()
    d = _tensor(dst, loc, "rand_get_state", "dst")
    eng = _engine_arg(engine, "rand_get_state", loc)
    return _done(E.emit_rand_get_state(d, engine=eng, loc=loc, key=program()))
