"""serving.service: the transport-independent operations. Here: predict_async waits on the
batcher (or the model threads) without a thread of its own, and turns its deadline into
DEADLINE_EXCEEDED; a request cancelled by its caller stays cancelled."""

import asyncio
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf

from mirrorfit.serving.batcher import Batcher
from mirrorfit.serving.errors import ServingError
from mirrorfit.serving.loader import LoadedVersion, Signature, TensorInfo
from mirrorfit.serving.model_config import BatchingParameters
from mirrorfit.serving.service import ModelService


def _servable(delay_s: float = 0.0) -> LoadedVersion:
    def double(x):
        time.sleep(delay_s)
        return {"y": x * 2}

    sig = Signature(
        "serving_default",
        {"x": TensorInfo("x", tf.float32, (None, 1))},
        {"y": TensorInfo("y", tf.float32, (None, 1))},
        "tensorflow/serving/predict",
        double,
    )
    return LoadedVersion("m", 1, "/nowhere", {"serving_default": sig}, {})


def _service(batching: bool, timeout_s: float | None) -> ModelService:
    batcher = (
        Batcher(
            BatchingParameters(max_batch_size=8, batch_timeout_micros=1000, num_batch_threads=1)
        )
        if batching
        else None
    )
    return ModelService(repository=None, batcher=batcher, timeout_s=timeout_s)


@pytest.mark.parametrize("batching", [False, True])
def test_predict_async_returns_the_model_outputs(batching):
    servable = _servable()
    service = _service(batching, timeout_s=10)
    x = np.array([[1.0], [2.0]], np.float32)
    out = asyncio.run(
        service.predict_async(servable, servable.signatures["serving_default"], {"x": x})
    )
    np.testing.assert_array_equal(out["y"], x * 2)


@pytest.mark.parametrize("batching", [False, True])
def test_a_model_slower_than_the_timeout_answers_deadline_exceeded(batching):
    servable = _servable(delay_s=0.5)
    service = _service(batching, timeout_s=0.05)
    with pytest.raises(ServingError) as e:
        asyncio.run(
            service.predict_async(
                servable, servable.signatures["serving_default"], {"x": np.ones((1, 1), np.float32)}
            )
        )
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "Timed out" in e.value.message


def test_a_request_cancelled_by_its_caller_is_not_reported_as_a_timeout():
    servable = _servable(delay_s=0.3)
    service = _service(batching=True, timeout_s=10)

    async def main():
        task = asyncio.create_task(
            service.predict_async(
                servable, servable.signatures["serving_default"], {"x": np.ones((1, 1), np.float32)}
            )
        )
        await asyncio.sleep(0.05)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


@pytest.mark.parametrize(
    "x, message",
    [
        (np.ones((1, 5), np.float32), "shape [1, 5] does not match the signature's [-1,1]"),
        (np.ones((1, 1, 1), np.float32), "does not match the signature's [-1,1]"),
        (np.ones((1, 1), np.float64), "Expected input x to be float but get double."),
        (np.ones((1, 1), np.uint8), "Expected input x to be float but get uint8."),
        (np.array([[b"a"]], object), "Expected input x to be float but get string."),
        (np.ones((9, 1), np.float32), "9 rows is more than the limit of 8 rows per request"),
    ],
)
def test_bad_inputs_are_refused_before_they_make_a_batch_queue(x, message):
    # Issue 10 items 1 and 6: a wrong shape used to make a queue (and threads) before the
    # signature refused it; a wrong dtype was silently cast.
    servable = _servable()
    service = _service(batching=True, timeout_s=10)
    service.max_rows = 8
    with pytest.raises(ServingError) as e:
        asyncio.run(
            service.predict_async(servable, servable.signatures["serving_default"], {"x": x})
        )
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and message in e.value.message
    assert service.batcher.queue_count == 0 and service.batcher.thread_count == 0


def test_a_model_error_reaches_the_client_as_tensorflows_words_without_the_stack():
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def pick(x):
        return {"y": tf.gather(x, [5])}

    sig = Signature(
        "s",
        {"x": TensorInfo("x", tf.float32, (None,))},
        {"y": TensorInfo("y", tf.float32, (None,))},
        "tensorflow/serving/predict",
        lambda x: pick(x),
    )
    with pytest.raises(ServingError) as e:
        sig.run({"x": np.zeros(2, np.float32)})
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(e.value.message) == "indices[0] = 5 is not in [0, 2)"
