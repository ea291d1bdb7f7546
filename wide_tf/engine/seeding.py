"""Owns the seeding of a run's host-side draws: Python's, NumPy's and Keras's global seed (what
`keras.utils.set_random_seed` sets), without TensorFlow's global seed.

Why not TensorFlow's: `tf.random.set_seed` clears the eager context's kernel cache
(tensorflow/python/eager/context.py, `Context._set_global_seed` calls `TFE_ContextClearCaches`),
so every traced function a study keeps across its runs (engine/tf/reuse.py) was instantiated
again on its first call of the next run: 0.25-0.55 s for a local-study run's first training call
against 4-17 ms for the others, and more for its first passes and probe, in runs whose whole
training took 0.1-0.6 s (`python -m tools.bench.reuse_cost`, docs/benchmarks.md).
TensorFlow's global seed only seeds its stateful random ops (an op with no explicit seed); the
engine's traced functions hold none (their draws are stateless, keyed by the run's seed:
data.epoch_order, data.augment_key, and Keras's SeedGenerator), which
tests/engine/test_seeding.py checks on every kept function's graph, so a run seeded here computes
what a run seeded by `keras.utils.set_random_seed` does.
Keras's initializers and layers draw from its own global SeedGenerator, reset here."""

from __future__ import annotations

import random

import numpy as np
from keras.src.backend.common import global_state
from keras.src.random import seed_generator
from keras.src.utils import rng_utils


def seed_host(seed: int) -> None:
    """Python's, NumPy's and Keras's seeds, as keras.utils.set_random_seed sets them (Keras's
    global SeedGenerator is dropped and made again from `seed` on its next draw)."""
    seed = int(seed)
    global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, seed)
    global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)
    random.seed(seed)
    np.random.seed(seed)
