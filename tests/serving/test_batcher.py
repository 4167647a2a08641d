"""serving.batcher: concurrent requests merged into one model call and split back; padding to
allowed sizes; a full queue refused with UNAVAILABLE; an oversized request refused; requests
awaited on an event loop settled with one wake-up of that loop per batch."""

import asyncio
import threading
import time

import grpc
import numpy as np
import pytest

from mirrorfit.serving.batcher import Batcher
from mirrorfit.serving.errors import ServingError
from mirrorfit.serving.model_config import BatchingParameters


class _Model:
    """Doubles its input; records the batch sizes it was called with."""

    def __init__(self, delay_s=0.0):
        self.calls, self.delay_s = [], delay_s
        self.lock = threading.Lock()

    def __call__(self, inputs):
        x = inputs["x"]
        with self.lock:
            self.calls.append(len(x))
        time.sleep(self.delay_s)
        return {"y": x * 2, "n": np.full(len(x), len(x))}


def _concurrently(batcher, model, sizes):
    results, errors = [None] * len(sizes), []
    start = threading.Barrier(len(sizes))

    def client(i, n):
        start.wait()
        try:
            x = np.arange(n, dtype=np.float32).reshape(n, 1) + 100 * i
            results[i] = (x, batcher.run(("m", 1, "sig"), "m", model, {"x": x}))
        except ServingError as e:
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i, n)) for i, n in enumerate(sizes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def test_concurrent_requests_share_one_call_and_get_their_own_rows():
    params = BatchingParameters(
        max_batch_size=64, batch_timeout_micros=200_000, num_batch_threads=1
    )
    batches = []
    model = _Model()
    results, errors = _concurrently(
        Batcher(params, on_batch=lambda m, n, s: batches.append(n)), model, [1, 2, 3, 4] * 4
    )
    assert errors == []
    assert sum(model.calls) == 40 and len(model.calls) < 16  # merged
    assert max(model.calls) > 4
    for x, out in results:
        np.testing.assert_array_equal(out["y"], x * 2)  # each gets exactly its own rows back
    assert batches == model.calls


def test_batches_are_padded_to_the_allowed_sizes():
    params = BatchingParameters(
        max_batch_size=16,
        batch_timeout_micros=100_000,
        num_batch_threads=1,
        allowed_batch_sizes=(4, 8, 16),
    )
    model = _Model()
    results, errors = _concurrently(Batcher(params), model, [3])
    assert errors == [] and model.calls == [4]  # 3 padded to 4
    x, out = results[0]
    assert out["y"].shape == (3, 1)  # the padding is cut off again


def test_a_full_queue_answers_unavailable():
    params = BatchingParameters(
        max_batch_size=2, batch_timeout_micros=0, max_enqueued_batches=1, num_batch_threads=1
    )
    model = _Model(delay_s=0.3)
    results, errors = _concurrently(Batcher(params), model, [2] * 6)
    assert errors, "some requests must be refused while the model is busy"
    assert all(e.code == grpc.StatusCode.UNAVAILABLE and e.http_status == 503 for e in errors)
    assert "queue" in errors[0].message
    assert sum(r is not None for r in results) + len(errors) == 6


def test_a_request_larger_than_the_max_batch_is_refused():
    batcher = Batcher(BatchingParameters(max_batch_size=4, num_batch_threads=1))
    with pytest.raises(ServingError, match="Task size 5 is larger than maximum input batch size 4"):
        batcher.run(("m", 1, "s"), "m", _Model(), {"x": np.zeros((5, 1), np.float32)})


def test_model_errors_reach_every_request_of_the_batch():
    def broken(inputs):
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, "bad batch")

    params = BatchingParameters(max_batch_size=8, batch_timeout_micros=100_000, num_batch_threads=1)
    results, errors = _concurrently(Batcher(params), broken, [1, 1, 1])
    assert len(errors) == 3 and all(e.message == "bad batch" for e in errors)


def test_requests_awaited_on_a_loop_are_settled_with_one_wakeup_per_batch():
    params = BatchingParameters(max_batch_size=8, batch_timeout_micros=200_000, num_batch_threads=1)
    batcher, model = Batcher(params), _Model()

    async def main():
        loop = asyncio.get_running_loop()
        wakeups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a, **k: (wakeups.append(a[0]), real(*a, **k))[1]
        xs = [np.full((1, 1), i, np.float32) for i in range(8)]
        futures = [batcher.submit(("m", 1, "s"), "m", model, {"x": x}, loop) for x in xs]
        assert all(isinstance(f, asyncio.Future) for f in futures)
        outs = await asyncio.gather(*futures)
        return xs, outs, wakeups

    xs, outs, wakeups = asyncio.run(main())
    assert model.calls == [8]
    assert len(wakeups) == 1  # not one per request
    for x, out in zip(xs, outs):
        np.testing.assert_array_equal(out["y"], x * 2)


def test_a_cancelled_waiter_does_not_disturb_the_rest_of_its_batch():
    params = BatchingParameters(max_batch_size=2, batch_timeout_micros=200_000, num_batch_threads=1)
    batcher, model = Batcher(params), _Model(delay_s=0.05)

    async def main():
        loop = asyncio.get_running_loop()
        gone = batcher.submit(("m", 1, "s"), "m", model, {"x": np.ones((1, 1), np.float32)}, loop)
        kept = batcher.submit(("m", 1, "s"), "m", model, {"x": np.ones((1, 1), np.float32)}, loop)
        gone.cancel()  # e.g. its client timed out
        return await kept

    out = asyncio.run(main())
    np.testing.assert_array_equal(out["y"], [[2.0]])


def test_the_timeout_runs_from_the_oldest_request_not_from_when_the_model_is_free():
    params = BatchingParameters(max_batch_size=8, batch_timeout_micros=300_000, num_batch_threads=1)
    starts = []

    def slow(inputs):
        starts.append(time.monotonic())
        time.sleep(0.4)
        return {"y": inputs["x"]}

    batcher = Batcher(params)
    first = batcher.submit(("m", 1, "s"), "m", slow, {"x": np.ones((1, 1), np.float32)})
    while not starts:  # the first batch is running (after its 300 ms)
        time.sleep(0.01)
    second = batcher.submit(("m", 1, "s"), "m", slow, {"x": np.ones((1, 1), np.float32)})
    first.result(5)
    done = time.monotonic()
    second.result(5)
    # the second request waited longer than the timeout while the model was busy: it runs
    # at once, not 300 ms after the model became free
    assert starts[1] - done < 0.15


def test_many_shapes_share_one_pool_of_threads_and_a_bounded_number_of_queues():
    # Issue 10 item 1: each new shape used to start num_batch_threads threads, never freed.
    params = BatchingParameters(max_batch_size=8, batch_timeout_micros=0, num_batch_threads=2)
    batcher = Batcher(params, max_queues=4)
    before = threading.active_count()
    for width in range(1, 21):  # 20 shapes, one at a time: old queues are empty, evicted
        out = batcher.run(
            ("m", 1, "s"), "m", _Model(), {"x": np.ones((1, width), np.float32)}, timeout_s=5
        )
        np.testing.assert_array_equal(out["y"], np.full((1, width), 2.0))
    assert batcher.thread_count == 2 and threading.active_count() - before == 2
    assert batcher.queue_count == 4


def test_a_new_shape_is_refused_when_every_queue_holds_waiting_requests():
    params = BatchingParameters(
        max_batch_size=8, batch_timeout_micros=2_000_000, num_batch_threads=1
    )
    batcher = Batcher(params, max_queues=2)
    model = _Model()
    waiting = [
        batcher.submit(("m", 1, "s"), "m", model, {"x": np.ones((1, w), np.float32)})
        for w in (1, 2)
    ]  # both wait 2 s for their batches to fill
    with pytest.raises(ServingError) as e:
        batcher.submit(("m", 1, "s"), "m", model, {"x": np.ones((1, 3), np.float32)})
    assert (
        e.value.code == grpc.StatusCode.UNAVAILABLE and "Too many batch queues" in e.value.message
    )
    batcher.close()  # closing runs what waits at once
    assert [f.result(5)["y"].shape for f in waiting] == [(1, 1), (1, 2)]


def test_idle_queues_are_dropped_when_a_new_one_is_made():
    params = BatchingParameters(max_batch_size=8, batch_timeout_micros=0, num_batch_threads=1)
    batcher = Batcher(params, idle_queue_s=0.05)
    batcher.run(("m", 1, "s"), "m", _Model(), {"x": np.ones((1, 1), np.float32)}, timeout_s=5)
    time.sleep(0.1)
    batcher.run(("m", 1, "s"), "m", _Model(), {"x": np.ones((1, 2), np.float32)}, timeout_s=5)
    assert batcher.queue_count == 1


def test_an_unloaded_versions_waiting_requests_still_run():
    params = BatchingParameters(
        max_batch_size=8, batch_timeout_micros=5_000_000, num_batch_threads=1
    )
    batcher = Batcher(params)
    future = batcher.submit(("m", 1, "s"), "m", _Model(), {"x": np.ones((1, 1), np.float32)})
    batcher.forget("m", 1)  # does not wait the 5 s timeout
    assert future.result(2)["y"].tolist() == [[2.0]]
    assert batcher.queue_count == 0
