"""``nki.collectives`` (``ncc``): collective communication between ranks.

nkikit simulates one NeuronCore (or one LNC=2 pair); collectives across ranks are not
modeled, so each call is a named error at the user's line.  ``ReplicaGroup`` exists so
kernels that build one at trace time import and run up to their first collective.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nkikit.errors import NkiError, caller_loc


@dataclass
class ReplicaGroup:
    """Non-overlapping groups of ranks."""

    groups: list = field(default_factory=list)


def _not_modeled(name: str):
    def fn(*args, **kwargs):
        raise NkiError(
            "err_unsupported_api",
            caller_loc(),
            api=f"nki.collectives.{name}",
            why="collectives across ranks are not modeled by the simulator",
        )

    fn.__name__ = name
    return fn


for _n in (
    "all_reduce",
    "all_gather",
    "all_gather_v",
    "reduce_scatter",
    "all_to_all",
    "all_to_all_v",
    "collective_permute",
    "collective_permute_implicit",
    "collective_permute_implicit_reduce",
    "collective_permute_implicit_current_processing_rank_id",
    "rank_id",
):
    globals()[_n] = _not_modeled(_n)
