"""What the server does, independent of transport: status, metadata, predict, classify,
regress. The REST and gRPC handlers translate their wire formats to these calls and back."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from collections.abc import Callable, Sequence
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

    def __init__(
        self,
        repository: ModelRepository,
        batcher: Batcher | None = None,
        timeout_s: float | None = None,
        model_threads: int = 2,
        max_rows: int = MAX_ROWS,
        max_in_flight: int = 64,
        max_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.repository = repository
        self.batcher = batcher
        self.timeout_s = timeout_s
        self.max_rows = max_rows  # rows per request (--max_rows_per_request)
        self.max_bytes = max_bytes  # tf.Examples one request may build (--max_request_bytes)
        # Unbatched model calls run on a few threads, not one per request: dozens of
        # concurrent TF calls on a few cores only fight over them.
        self._model_pool = _ModelPool(model_threads, max_in_flight)

    def status(self, spec: Spec) -> list[VersionStatus]:
        return self.repository.status(spec.name, spec.version)

    def metadata(self, spec: Spec) -> LoadedVersion:
        return self.repository.resolve(spec.name, spec.version, spec.label)

    def resolve_signature(
        self, spec: Spec, *, api: str = "predict", entrypoint: str = "REST"
    ) -> tuple[LoadedVersion, Signature]:
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
            raise ServingError(
                grpc.StatusCode.FAILED_PRECONDITION, f'Serving signature key "{name}" not found.'
            )
        raise invalid(f'Serving signature name: "{name}" not found in signature def')

    def predict(
        self,
        servable: LoadedVersion,
        sig: Signature,
        inputs: dict[str, np.ndarray],
        output_filter: list[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run ``sig`` on ``inputs`` (checked against its inputs), batched when enabled."""
        check_inputs(sig, inputs, self.max_rows)
        _check_filter(sig, output_filter)
        return _filter(self._wait(self._submit(servable, sig, inputs)), output_filter)

    def _wait(self, future: Future) -> dict[str, np.ndarray]:
        try:
            return future.result(self.timeout_s)
        except TimeoutError:
            future.cancel()  # if it has not started, it never will: its slot is free again
            raise ServingError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "Timed out running the model"
            ) from None

    async def predict_async(
        self,
        servable: LoadedVersion,
        sig: Signature,
        inputs: dict[str, np.ndarray],
        output_filter: list[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """:meth:`predict` for an asyncio server: waits without holding a thread."""
        check_inputs(sig, inputs, self.max_rows)  # before it costs a queue or a thread
        _check_filter(sig, output_filter)
        loop = asyncio.get_running_loop()
        outputs = await self._wait_async(self._submit(servable, sig, inputs, loop), loop)
        return _filter(outputs, output_filter)

    async def _wait_async(self, future: Future | asyncio.Future, loop: asyncio.AbstractEventLoop):
        """The result of ``future`` within the model timeout, waited for without a thread."""
        if not isinstance(future, asyncio.Future):
            future = asyncio.wrap_future(future)
        # A timer that cancels the future, not asyncio.wait_for: that wraps every request in
        # one more task.
        timer = (
            loop.call_later(self.timeout_s, future.cancel) if self.timeout_s is not None else None
        )
        try:
            return await future
        except asyncio.CancelledError:
            if timer is not None and loop.time() >= timer.when():
                raise ServingError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "Timed out running the model"
                ) from None
            raise  # the request itself was cancelled (client gone, shutdown)
        finally:
            if timer is not None:
                timer.cancel()

    def _submit(
        self,
        servable: LoadedVersion,
        sig: Signature,
        inputs: dict[str, np.ndarray],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Future | asyncio.Future:
        batchable = (
            self.batcher is not None
            and sig.batched
            and inputs
            and all(np.ndim(v) >= 1 for v in inputs.values())
        )
        if not batchable:
            return self._model_pool.submit(sig.run, inputs)
        arrays = {
            k: np.asarray(v, dtype=sig.inputs[k].dtype.as_numpy_dtype) for k, v in inputs.items()
        }
        return self.batcher.submit(
            (servable.name, servable.version, sig.name), servable.name, sig.run, arrays, loop
        )

    async def classify_async(
        self,
        servable: LoadedVersion,
        sig: Signature,
        context,
        examples: Sequence,
        to_example: Callable | None = None,
    ) -> list[list[tuple[str, float]]]:
        """[(label, score), ...] per example, for a signature with one string input and ``classes``
        and/or ``scores`` outputs (TF Serving's classifier contract). ``context`` (or None) and
        ``examples``: tf.Examples or what ``to_example`` makes them from; checked before any is
        built, then built and run in a slot of the unbatched pool (--max_unbatched_in_flight).
        """
        alias = self._check_examples(sig, "classify", len(examples))
        if "classes" not in sig.outputs and "scores" not in sig.outputs:
            raise invalid(
                f"Expected classification signature outputs to contain classes or "
                f"scores; signature {sig.name} has {','.join(sorted(sig.outputs))}"
            )

        def run():
            serialized = serialize_examples(context, examples, self.max_bytes, to_example)
            return _classifications(
                sig.run({alias: np.array(serialized, dtype=object)}), len(serialized)
            )

        return await self._run_async(run)

    async def regress_async(
        self,
        servable: LoadedVersion,
        sig: Signature,
        context,
        examples: Sequence,
        to_example: Callable | None = None,
    ) -> list[float]:
        """One value per example, for a signature with one string input and an ``outputs``
        output of shape [batch] or [batch, 1]. Arguments and bounds as :meth:`classify_async`."""
        alias = self._check_examples(sig, "regress", len(examples))
        if "outputs" not in sig.outputs:
            raise invalid(f"No output named 'outputs' in regression signature {sig.name}")

        def run():
            serialized = serialize_examples(context, examples, self.max_bytes, to_example)
            values = sig.run({alias: np.array(serialized, dtype=object)})["outputs"]
            if values.ndim == 2 and values.shape[1] != 1 or values.ndim > 2:
                raise invalid(
                    f"Expected output Tensor shape to be either [batch_size] or "
                    f"[batch_size, 1] but got {list(values.shape)}"
                )
            return values.reshape(-1).astype(float).tolist()

        return await self._run_async(run)

    def _check_examples(self, sig: Signature, method: str, count: int) -> str:
        alias = _example_input(sig, method)
        check_rows(count, self.max_rows)
        return alias

    async def _run_async(self, fn):
        """``fn()`` on the bounded model pool, awaited within the model timeout."""
        loop = asyncio.get_running_loop()
        return await self._wait_async(self._model_pool.submit(fn), loop)


def _classifications(out: dict[str, np.ndarray], n: int) -> list[list[tuple[str, float]]]:
    scores, classes = out.get("scores"), out.get("classes")
    width = (scores if scores is not None else classes).reshape(n, -1).shape[1]
    result = []
    for i in range(n):
        labels = (
            [c.decode() if isinstance(c, bytes) else str(c) for c in classes.reshape(n, -1)[i]]
            if classes is not None
            else [""] * width
        )
        values = (
            scores.reshape(n, -1)[i].astype(float).tolist() if scores is not None else [0.0] * width
        )
        result.append(list(zip(labels, values)))
    return result


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
            raise ServingError(
                grpc.StatusCode.UNAVAILABLE,
                (
                    f"Server busy: {self.max_in_flight} model calls are already running or waiting "
                    "(--max_unbatched_in_flight); retry later"
                ),
            )
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
        raise invalid(
            f"output tensor alias not found in signature: {unknown[0]} Outputs "
            f"expected to be in the set {{{','.join(sorted(sig.outputs))}}}."
        )


def _filter(outputs: dict[str, np.ndarray], output_filter: list[str] | None) -> dict:
    return {a: outputs[a] for a in output_filter} if output_filter else outputs


def _example_input(sig: Signature, method: str) -> str:
    if len(sig.inputs) != 1 or next(iter(sig.inputs.values())).dtype != tf.string:
        raise invalid(
            f"Expected one input Tensor of type DT_STRING (serialized tf.Examples) "
            f"for {method}; signature {sig.name} does not take one"
        )
    return next(iter(sig.inputs))


def serialize_examples(
    context, examples: Sequence, max_bytes: int, to_example: Callable | None = None
) -> list[bytes]:
    """Serialized tf.Examples; with a context, each example merged over it (example wins).

    The context is copied into every example, so a small request can ask for examples x
    context bytes: the merged size is bounded by ``max_bytes`` before it is built (from the
    context's size, then as each example is made)."""
    make = to_example or (lambda item: item)
    ctx = make(context) if context is not None else None
    ctx_bytes = ctx.ByteSize() if ctx is not None else 0
    total = len(examples) * ctx_bytes
    if total > max_bytes:
        raise invalid(
            f"{len(examples)} examples with a context of {ctx_bytes} bytes would be "
            f"{total} bytes of tf.Examples, more than the limit of {max_bytes} bytes "
            "(--max_request_bytes); send a smaller context or fewer examples"
        )
    out = []
    for i, item in enumerate(examples):
        example = make(item)
        total += example.ByteSize()
        if total > max_bytes:
            raise invalid(
                f"The examples merged with their context are more than the limit of "
                f"{max_bytes} bytes (--max_request_bytes) at example {i}; send "
                "smaller or fewer examples"
            )
        if ctx is not None:
            merged = tf.train.Example()
            merged.CopyFrom(ctx)
            for key, feature in example.features.feature.items():
                merged.features.feature[key].CopyFrom(feature)
            example = merged
        out.append(example.SerializeToString())
    return out


__all__ = ["ModelService", "Spec", "serialize_examples", "DEFAULT_SIGNATURE", "ServingError"]
