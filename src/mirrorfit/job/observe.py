"""Watching a run: TensorBoard scalars, CPU/GPU utilisation, and a useful out-of-memory error.
``ScalarWriter``: a trainer hook (after every compiled execution) and epoch callback writing
TensorBoard's event files with TensorBoard's own writer (no TensorFlow: the JAX engine writes
them too). ``CpuGpuSampler``: utilisation on a background thread (psutil for the CPU; NVML
through nvidia-ml-py for GPUs when a driver is present).
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from typing import Iterator

import psutil

from mirrorfit._io import is_disk_full
from mirrorfit.errors import MirrorfitError, StorageError
from mirrorfit.fitting.guards import out_of_memory


class ScalarWriter:
    """TensorBoard scalars under ``logdir``: per execution (x axis: optimizer step) loss,
    accuracy, learning rate, examples/s and fp16's loss scale; per epoch the validation
    metrics. ``logdir`` None: read the metrics (a collective in a multi-worker run, so every
    worker must) but write nothing: what the workers other than the chief do."""

    def __init__(self, logdir: str | None) -> None:
        from mirrorfit._frameworks import install_hint, tensorflow_start_filtered

        # TensorBoard's writer loads TensorFlow where it is installed (for its file system),
        # on the JAX engine too: its start-up lines filtered as the TF engine's are.
        with tensorflow_start_filtered():
            try:
                from tensorboard.summary.writer.event_file_writer import EventFileWriter
            except ImportError as e:
                if (e.name or "").split(".")[0] != "tensorboard":
                    raise
                raise MirrorfitError(
                    "--logdir writes TensorBoard scalars with the tensorboard package, which "
                    f"is not installed: {install_hint('jax')} (TensorFlow brings it too)"
                ) from None

            self._writer = EventFileWriter(logdir) if logdir else None
        self._last: tuple[int, float] | None = None

    def _write(self, step: int, values: dict[str, float]) -> None:
        """One event of scalars at ``step``, as ``tf.summary.scalar`` writes them."""
        if self._writer is None:
            return
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb

        summary = summary_pb2.Summary(
            value=[scalar_pb(tag, float(value)).value[0] for tag, value in values.items()]
        )
        self._writer.add_event(
            event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary)
        )

    def after_call(
        self, step: int, logs: dict[str, float], learning_rate: float | None, global_batch: int
    ) -> None:
        """The scalars of a compiled execution that ended at optimizer step ``step``: each of
        ``logs`` as ``train/NAME``, the learning rate, and the examples/s (``global_batch`` a
        step) since the previous execution ended."""
        now = time.perf_counter()
        values = {f"train/{name}": value for name, value in logs.items()}
        if learning_rate is not None:
            values["train/learning_rate"] = learning_rate
        if self._last is not None and step > self._last[0]:
            # the first execution traces and compiles: no rate from it
            rate = (step - self._last[0]) * global_batch / (now - self._last[1])
            values["train/examples_per_sec"] = rate
        self._write(step, values)
        self._last = (step, time.perf_counter())

    def epoch_callback(self, epoch: int, logs: dict[str, float]) -> None:
        self._write(epoch, {f"epoch/{name}": value for name, value in logs.items()})
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Write what is queued and close the file (its writer thread ends)."""
        if self._writer is not None:
            self._writer.close()


class CpuGpuSampler:
    """Context manager sampling CPU (psutil) and GPU (NVML) utilisation every ``interval_s``.

    ``summary()`` gives the mean CPU utilisation in % of all cores and, with NVIDIA GPUs, the
    mean GPU utilisation in % (None without NVML).
    """

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.cpu: list[float] = []
        self.gpu: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._nvml = _nvml_handles()

    def __enter__(self) -> "CpuGpuSampler":
        psutil.cpu_percent()  # the first call only sets the baseline
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.cpu.append(psutil.cpu_percent())
            if self._nvml:
                import pynvml

                self.gpu.append(
                    statistics.mean(pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._nvml)
                )

    def summary(self) -> dict[str, float | None]:
        return {
            "cpu_percent": statistics.mean(self.cpu) if self.cpu else None,
            "gpu_percent": statistics.mean(self.gpu) if self.gpu else None,
        }


def _nvml_handles() -> list:
    try:
        import pynvml

        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no package, no driver, no GPU: CPU-only utilisation
        return []


@contextlib.contextmanager
def out_of_memory_hint(per_replica_batch: int) -> Iterator[None]:
    """Turn the framework's out-of-memory error into one line saying what to try (TensorFlow
    reports a full disk with the same error: that says "disk full")."""
    try:
        yield
    except Exception as e:
        if not out_of_memory(e):
            raise
        text = str(getattr(e, "message", e)).strip()
        if is_disk_full(e):
            raise StorageError(f"disk full ({text[:200]}); free some space and rerun") from None
        first = (text.splitlines() or [type(e).__name__])[0][:200]
        raise MirrorfitError(
            f"out of memory at a batch of {per_replica_batch} per replica ({first}); try a "
            "smaller --batch-size with --accum-steps K to keep the effective batch, --remat, "
            "--precision bf16 or fp16, or on GPUs leave memory growth on and set "
            "--gpu-memory-limit MB"
        ) from None


__all__ = ["ScalarWriter", "CpuGpuSampler", "out_of_memory_hint"]
