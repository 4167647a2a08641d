"""engine.jax.feed: the calls a fit makes, and their blocks of batches in the seeded order (the
order itself is compared with TensorFlow's pipeline in test_jax_runner)."""

import numpy as np
import pytest

from mirrorfit.engine.jax.feed import Feed, plan


def test_the_plan_is_the_controllers_calls():
    # 10 steps an epoch, 4 per call, resumed in epoch 1 after 3 steps, up to epoch 3
    assert plan(steps_per_epoch=10, start_epoch=1, epochs=3, skip=3, steps_per_execution=4) == [
        (1, 3, 4),
        (1, 7, 3),
        (2, 0, 4),
        (2, 4, 4),
        (2, 8, 2),
    ]
    assert plan(steps_per_epoch=10, start_epoch=2, epochs=2, skip=0, steps_per_execution=4) == []


class _Arrays:
    """An array source as mirrorfit.train_batches is one: indices of (seed, epoch)."""

    def __init__(self, n=40, batch=4):
        self.x = np.arange(n * 2 * 2, dtype=np.uint8).reshape(n, 2, 2)
        self.y = np.arange(n, dtype=np.int32)
        self.steps_per_epoch, self.batch = n // batch, batch

    def epoch_batches(self, epoch, worker=0, workers=1):
        order = np.random.default_rng([1, epoch]).permutation(len(self.x))
        return order.reshape(self.steps_per_epoch, self.batch)


def test_blocks_hold_each_calls_batches_in_order_and_pad_the_rest():
    jax = pytest.importorskip("jax")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    source = _Arrays()
    calls = plan(steps_per_epoch=10, start_epoch=0, epochs=2, skip=7, steps_per_execution=4)
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    feed = Feed(source, calls, block_steps=4, batch_sharding=NamedSharding(mesh, P(None, "data")))
    try:
        seen = []
        for epoch, first, n in calls:
            xs, ys = (np.asarray(a) for a in feed.next(n))
            assert xs.shape == (4, 4, 2, 2) and xs.dtype == np.uint8  # pixels stay uint8
            want = source.epoch_batches(epoch)[first : first + n]
            np.testing.assert_array_equal(ys[:n], want)
            np.testing.assert_array_equal(xs[:n], source.x[want])
            assert not ys[n:].any()  # padding the step never reads
            seen += list(ys[:n].ravel())
        assert len(seen) == (3 + 10) * 4  # epoch 0's last 3 steps, all of epoch 1
        with pytest.raises(RuntimeError, match="the feed planned"):
            Feed(
                source, calls, block_steps=4, batch_sharding=NamedSharding(mesh, P(None, "data"))
            ).next(1)
    finally:
        feed.close()
