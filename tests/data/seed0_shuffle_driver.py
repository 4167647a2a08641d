"""Run by tests/data/test_pipeline.py: ``python seed0_shuffle_driver.py``. Shuffles seeded by
the epoch (a tensor inside flat_map) under TF's global seed 0 and 42, with
data.pipeline.shuffle and with a plain Dataset.shuffle. Prints one JSON line: what the plain
shuffle did at 0 (the exception's type, or "ran"), pipeline.shuffle's order at 0 twice, and
both orders at 42."""

import json

import tensorflow as tf

from mirrorfit.data.pipeline import shuffle


def orders(global_seed, shuffled):
    tf.random.set_seed(global_seed)
    ds = tf.data.Dataset.range(2).flat_map(
        lambda e: shuffled(
            tf.data.Dataset.range(8), 8, seed=e * 7 + 1, reshuffle_each_iteration=False
        )
    )
    return [int(v) for v in ds.as_numpy_iterator()]


def plain(ds, buffer, **kw):
    return ds.shuffle(buffer, **kw)


try:
    orders(0, plain)
    plain_at_0 = "ran"
except Exception as e:
    plain_at_0 = type(e).__name__
print(
    json.dumps(
        {
            "plain_at_0": plain_at_0,
            "at_0": [orders(0, shuffle) for _ in "ab"],
            "at_42": orders(42, shuffle),
            "plain_at_42": orders(42, plain),
        }
    )
)
