"""The fast path's arena plan places each tile first fit among the tiles live when it
starts; ``_Gaps`` keeps the free bytes between them.  Checked against the definition: the
lowest offset at which the tile overlaps no live tile."""

from __future__ import annotations

import heapq
import random

from nkikit.sim.fast.plan import _Gaps


def _first_fit(live: list[tuple[int, int, int]]) -> list[int]:
    """(start, end, size) per tile, by start -> the definition's offsets: the lowest of 0
    and the live tiles' ends at which the tile overlaps none of them."""
    placed: list[tuple[int, int, int]] = []  # (end, offset, size)
    out = []
    for b, e, size in live:
        alive = [(o, o + sz) for end, o, sz in placed if end >= b]
        for off in sorted({0, *(hi for _, hi in alive)}):
            if all(off + size <= lo or hi <= off for lo, hi in alive):
                break
        placed.append((e, off, size))
        out.append(off)
    return out


def _with_gaps(live: list[tuple[int, int, int]]) -> list[int]:
    """The arena plan's loop (``Planner.plan_arena``)."""
    active: list[tuple[int, int, int]] = []
    free = _Gaps()
    out = []
    for b, e, size in live:
        while active and active[0][0] < b:
            _, o, sz = heapq.heappop(active)
            free.release(o, o + sz)
        off = free.take(size)
        heapq.heappush(active, (e, off, size))
        out.append(off)
    return out


def test_gaps_place_every_tile_first_fit():
    rng = random.Random(0)
    for _ in range(2000):
        live = []
        for _ in range(rng.randint(1, 40)):
            b = rng.randint(0, 60)
            e = b + rng.choice([0, 1, 2, 5, 20, 80])
            live.append((b, e, 64 * rng.choice([1, 1, 2, 3, 8])))
        live.sort()
        assert _with_gaps(live) == _first_fit(live), live


def test_freed_top_tiles_lower_the_top_and_gaps_merge():
    g = _Gaps()
    assert [g.take(64), g.take(128), g.take(64)] == [0, 64, 192]
    g.release(64, 192)  # a gap in the middle
    assert g.take(256) == 256 and g.take(64) == 64
    assert (g.lo, g.hi) == ([128], [192])
    g.release(64, 128)  # merges with the gap above it
    assert (g.lo, g.hi) == ([64], [192])
    g.release(256, 512)  # the top tile: the top falls
    g.release(192, 256)  # merges both ways and reaches the top
    assert (g.lo, g.hi, g.top) == ([], [], 64)
