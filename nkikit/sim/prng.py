"""The engines' pseudo-random generators: XORWOW per lane, as the ISA names for the NC-v4
VectorE [nki-0x.md §4.12].

A lane's state is ``G`` XORWOW states of 6 uint32 words ``(x, y, z, w, v, d)`` (``G = 1`` on
the GpSimd, 4 on the VectorE, which draws 4 x 32 bits per lane per cycle): the layout
``rand_get_state`` returns and ``rand_set_state`` takes.  One step of a state is Marsaglia's
xorwow (``t = x ^ x >> 2``; shift ``x..v`` down; ``v ^= v << 4 ^ t ^ t << 1``;
``d += 362437``; out ``v + d``).  An instruction filling ``n`` elements per partition takes
``ceil(n / G)`` steps of every state of the lane; element ``j`` is step ``j // G`` of state
``j % G``.

What the hardware does beyond that is not documented (the seeding, which state feeds which
element, the LFSR of NC-v2/v3 engines): streams here are deterministic functions of the seed
and reproducible from run to run, not the hardware's bits.  Seeding a state from a 32-bit seed
mixes (seed, lane, state, word) with SplitMix64.
"""

from __future__ import annotations

import numpy as np

_WORDS = 6  # x, y, z, w, v, d
_WEYL = np.uint32(362437)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def seed_state(seed: int, lanes: int, words: int) -> np.ndarray:
    """The (lanes, words) uint32 state every lane gets from ``seed`` (a 64-bit key: the
    32-bit seed of ``set_rng_seed``, or the simulation call's seed for the kernel start)."""
    index = np.arange(lanes * words, dtype=np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        z = np.uint64(seed & 0xFFFFFFFFFFFFFFFF) + index * _GOLDEN
        out = (_splitmix64(z) >> np.uint64(32)).astype(np.uint32).reshape(lanes, -1, _WORDS)
    # xorwow's (x, y, z, w, v) must not be all zero, or the state never leaves zero
    dead = ~out[..., :5].any(axis=-1)
    out[..., 4] |= dead.astype(np.uint32)
    return out.reshape(lanes, words)


def draw(state: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random uint32 per lane from ``state`` (lanes, 6 G): ``(bits (lanes, n), the
    advanced state)``."""
    lanes = state.shape[0]
    s = np.array(state, dtype=np.uint32).reshape(lanes, -1, _WORDS)
    g = s.shape[1]
    steps = -(-n // g)
    x, y, z, w, v, d = (s[..., k].copy() for k in range(_WORDS))
    out = np.empty((steps, lanes, g), dtype=np.uint32)
    two, one, four = np.uint32(2), np.uint32(1), np.uint32(4)
    for i in range(steps):
        t = x ^ (x >> two)
        x, y, z, w = y, z, w, v
        v = (v ^ (v << four)) ^ (t ^ (t << one))
        d = d + _WEYL
        out[i] = v + d
    new = np.stack([x, y, z, w, v, d], axis=-1).reshape(lanes, -1)
    bits = out.transpose(1, 0, 2).reshape(lanes, steps * g)[:, :n]
    return bits, new


def uniform(bits: np.ndarray) -> np.ndarray:
    """fp32 uniform in [0, 1) from 32 random bits: the top 24 bits over 2^24 (exact in fp32)."""
    return (bits >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)
