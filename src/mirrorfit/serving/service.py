"""What the server does, independent of transport: status, metadata, predict, classify,
regress. The REST and gRPC handlers translate their wire formats to these calls and back."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import numpy as np
import tensorflow as tf

from mirrorfit.serving.batcher import Batcher
from mirrorfit.serving.errors import ServingError, invalid
from mirrorfit.serving.loader import DEFAULT_SIGNATURE, LoadedVersion, Signature
from mirrorfit.serving.repository import ModelRepository, VersionStatus
from mirrorfit.serving.validation import MAX_ROWS, check_inputs, check_rows


@dataclass(frozen=True)
class Spec:
    """A request's model spec: name, and a version or a label (or neither: latest)."""

    name: str
    version: int | None = None
    label: str | None = None
    signature_name: str = ""


class ModelService:
    """The operations both APIs serve, over a repository and an optional batcher."""

    def __init__(self, repository: ModelRepository, batcher: Batcher | None = None,
                 timeout_s: float | None = None, model_threads: int = 2,
                 max_rows: int = MAX_ROWS, max_in_flight: int = 64) -> None:
        self.repository = repository
        self.batcher = batcher
        self.timeout_s = timeout_s
        self.max_rows = max_rows  # rows per request (--max_rows_per_request)
        # Unbatched model calls run on a few threads, not one per request: dozens of
        # concurrent TF calls on a few cores only fight over them.
        self._model_pool = _ModelPool(model_threads, max_in_flight)

    def status(self, spec: Spec) -> list[VersionStatus]:
        return self.repository.status(spec.name, spec.version)

    def metadata(self, spec: Spec) -> LoadedVersion:
        return self.repository.resolve(spec.name, spec.version, spec.label)

    def resolve_signature(self, spec: Spec, *, api: str = "predict",
                          entrypoint: str = "REST") -> tuple[LoadedVersion, Signature]:
        """The servable and signature a request names, with TF Serving's message (which
        differs by API and entrypoint) for an unknown signature."""
        servable = self.repository.resolve(spec.name, spec.version, spec.label)
        name = spec.signature_name or DEFAULT_SIGNATURE
        sig = servable.signatures.get(name)
        if sig is not None:
            return servable, sig
        if api != "predict":
            raise invalid(f"No signature was found with the name: {name}")
        if entrypoint == "GRPC":
            raise ServingError(grpc.StatusCode.FAILED_PRECONDITION,
                               f'Serving signature key "{name}" not found.')
        raise invalid(f'Serving signature name: "{name}" not found in signature def')

    def predict(self, servable: LoadedVersion, sig: Signature, inputs: dict[str, np.ndarray],
                output_filter: list[str] | None = None) -> dict[str, np.ndarray]:
        """Run ``sig`` on ``inputs`` (checked against its inputs), batched when enabled."""
        check_inputs(sig, inputs, self.max_rows)
        _check_filter(sig, output_filter)
        return _filter(self._wait(self._submit(servable, sig, inputs)), output_filter)

    def _run(self, sig: Signature, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """An unbatched call (classify, regress) on the bounded model pool."""
        return self._wait(self._model_pool.submit(sig.run, inputs))

    def _wait(self, future: Future) -> dict[str, np.ndarray]:
        try:
            return future.result(self.timeout_s)
        except TimeoutError:
            future.cancel()  # if it has not started, it never will: its slot is free again
            raise ServingError(grpc.StatusCode.DEADLINE_EXCEEDED, "Timed out running the "
                               "model") from None

    async def predict_async(self, servable: LoadedVersion, sig: Signature,
                            inputs: dict[str, np.ndarray],
                            output_filter: list[str] | None = None) -> dict[str, np.ndarray]:
        """:meth:`predict` for an asyncio server: waits without holding a thread."""
        check_inputs(sig, inputs, self.max_rows)  # before it costs a queue or a thread
        _check_filter(sig, output_filter)
        loop = asyncio.get_running_loop()
        future = self._submit(servable, sig, inputs, loop)
        if not isinstance(future, asyncio.Future):
            future = asyncio.wrap_future(future)
        # A timer that cancels the future, not asyncio.wait_for: that wraps every request in
        # one more task.
        timer = (loop.call_later(self.timeout_s, future.cancel)
                 if self.timeout_s is not None else None)
        try:
            outputs = await future
        except asyncio.CancelledError:
            if timer is not None and loop.time() >= timer.when():
                raise ServingError(grpc.StatusCode.DEADLINE_EXCEEDED, "Timed out running the "
                                   "model") from None
            raise  # the request itself was cancelled (client gone, shutdown)
        finally:
            if timer is not None:
                timer.cancel()
        return _filter(outputs, output_filter)

    def _submit(self, servable: LoadedVersion, sig: Signature, inputs: dict[str, np.ndarray],
                loop: asyncio.AbstractEventLoop | None = None) -> Future | asyncio.Future:
        batchable = (self.batcher is not None and sig.batched and inputs
                     and all(np.ndim(v) >= 1 for v in inputs.values()))
        if not batchable:
            return self._model_pool.submit(sig.run, inputs)
        arrays = {k: np.asarray(v, dtype=sig.inputs[k].dtype.as_numpy_dtype)
                  for k, v in inputs.items()}
        return self.batcher.submit((servable.name, servable.version, sig.name), servable.name,
                                   sig.run, arrays, loop)

    def classify(self, servable: LoadedVersion, sig: Signature,
                 examples: list[bytes]) -> list[list[tuple[str, float]]]:
        """[(label, score), ...] per example, for a signature with one string input and
        ``classes`` and/or ``scores`` outputs (TF Serving's classifier contract)."""
        alias = _example_input(sig, "classify")
        check_rows(len(examples), self.max_rows)
        if "classes" not in sig.outputs and "scores" not in sig.outputs:
            raise invalid(f"Expected classification signature outputs to contain classes or "
                          f"scores; signature {sig.name} has {','.join(sorted(sig.outputs))}")
        out = self._run(sig, {alias: np.array(examples, dtype=object)})
        scores, classes = out.get("scores"), out.get("classes")
        n = len(examples)
        width = (scores if scores is not None else classes).reshape(n, -1).shape[1]
        result = []
        for i in range(n):
            labels = ([c.decode() if isinstance(c, bytes) else str(c)
                       for c in classes.reshape(n, -1)[i]] if classes is not None
                      else [""] * width)
            values = (scores.reshape(n, -1)[i].astype(float).tolist() if scores is not None
                      else [0.0] * width)
            result.append(list(zip(labels, values)))
        return result

    def regress(self, servable: LoadedVersion, sig: Signature, examples: list[bytes]) \
            -> list[float]:
        """One value per example, for a signature with one string input and an ``outputs``
        output of shape [batch] or [batch, 1]."""
        alias = _example_input(sig, "regress")
        check_rows(len(examples), self.max_rows)
        if "outputs" not in sig.outputs:
            raise invalid(f"No output named 'outputs' in regression signature {sig.name}")
        values = self._run(sig, {alias: np.array(examples, dtype=object)})["outputs"]
        if values.ndim == 2 and values.shape[1] != 1 or values.ndim > 2:
            raise invalid(f"Expected output Tensor shape to be either [batch_size] or "
                          f"[batch_size, 1] but got {list(values.shape)}")
        return values.reshape(-1).astype(float).tolist()


class _ModelPool:
    """Unbatched model calls: ``threads`` run at once and at most ``max_in_flight`` run or
    wait. One more is refused at once with UNAVAILABLE (HTTP 503), as TF Serving's full batch
    queue is, instead of queueing (with its inputs in memory) without bound."""

    def __init__(self, threads: int, max_in_flight: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="model")
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self.max_in_flight = max_in_flight

    def submit(self, fn, *args) -> Future:
        if not self._slots.acquire(blocking=False):
            raise ServingError(grpc.StatusCode.UNAVAILABLE, (
                f"Server busy: {self.max_in_flight} model calls are already running or waiting "
                "(--max_unbatched_in_flight); retry later"))
        try:
            future = self._executor.submit(fn, *args)
        except BaseException:
            self._slots.release()
            raise
        # done, failed or cancelled (a timed-out request that never started) frees the slot
        future.add_done_callback(lambda _: self._slots.release())
        return future


def _check_filter(sig: Signature, output_filter: list[str] | None) -> None:
    unknown = [a for a in output_filter or () if a not in sig.outputs]
    if unknown:
        raise invalid(f"output tensor alias not found in signature: {unknown[0]} Outputs "
                      f"expected to be in the set {{{','.join(sorted(sig.outputs))}}}.")


def _filter(outputs: dict[str, np.ndarray], output_filter: list[str] | None) -> dict:
    return {a: outputs[a] for a in output_filter} if output_filter else outputs


def _example_input(sig: Signature, method: str) -> str:
    if len(sig.inputs) != 1 or next(iter(sig.inputs.values())).dtype != tf.string:
        raise invalid(f"Expected one input Tensor of type DT_STRING (serialized tf.Examples) "
                      f"for {method}; signature {sig.name} does not take one")
    return next(iter(sig.inputs))


def merge_context(context: tf.train.Example | None, examples: list) -> list[bytes]:
    """Serialized tf.Examples; with a context, each example merged over it (example wins)."""
    out = []
    for example in examples:
        if context is not None:
            merged = tf.train.Example()
            merged.CopyFrom(context)
            for key, feature in example.features.feature.items():
                merged.features.feature[key].CopyFrom(feature)
            example = merged
        out.append(example.SerializeToString())
    return out


__all__ = ["ModelService", "Spec", "merge_context", "DEFAULT_SIGNATURE", "ServingError"]
