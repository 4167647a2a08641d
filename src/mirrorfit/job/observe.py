"""Watching a run: TensorBoard scalars, CPU/GPU utilisation, and a useful out-of-memory error.

``ScalarWriter`` plugs into the trainer as a hook (after every compiled execution) and an epoch
callback; ``CpuGpuSampler`` samples utilisation in a background thread (psutil for the CPU,
NVML through nvidia-ml-py for GPUs when a driver is present).
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from typing import Iterator

import psutil
import tensorflow as tf

from mirrorfit._io import is_disk_full
from mirrorfit.errors import MirrorfitError, StorageError


class ScalarWriter:
    """TensorBoard scalars under ``logdir``: per execution (x axis: optimizer step) loss,
    accuracy, learning rate, examples/s and fp16's loss scale; per epoch the validation
    metrics. ``logdir`` None: read the metrics (a collective in a multi-worker run, so every
    worker must) but write nothing: what the workers other than the chief do."""

    def __init__(self, logdir: str | None) -> None:
        self._writer = (tf.summary.create_file_writer(logdir) if logdir
                        else tf.summary.create_noop_writer())
        self._last: tuple[int, float] | None = None

    def step_hook(self, trainer) -> None:
        now = time.perf_counter()
        logs = trainer.train_logs()
        with self._writer.as_default(step=trainer.step):
            for name in ("loss", "accuracy", "loss_scale"):
                if name in logs:
                    tf.summary.scalar(f"train/{name}", logs[name])
            tf.summary.scalar("train/learning_rate", trainer.learning_rate())
            if self._last is not None and trainer.step > self._last[0]:
                # the first execution traces and compiles: no rate from it
                rate = (trainer.step - self._last[0]) * trainer.global_batch / (now - self._last[1])
                tf.summary.scalar("train/examples_per_sec", rate)
        self._last = (trainer.step, time.perf_counter())

    def epoch_callback(self, epoch: int, logs: dict[str, float]) -> None:
        with self._writer.as_default(step=epoch):
            for name, value in logs.items():
                tf.summary.scalar(f"epoch/{name}", value)
        self._writer.flush()


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
                self.gpu.append(statistics.mean(
                    pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._nvml))

    def summary(self) -> dict[str, float | None]:
        return {"cpu_percent": statistics.mean(self.cpu) if self.cpu else None,
                "gpu_percent": statistics.mean(self.gpu) if self.gpu else None}


def _nvml_handles() -> list:
    try:
        import pynvml
        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no package, no driver, no GPU: CPU-only utilisation
        return []


@contextlib.contextmanager
def out_of_memory_hint(per_replica_batch: int) -> Iterator[None]:
    """Turn TensorFlow's out-of-memory error into one line saying what to try (TensorFlow
    reports a full disk with the same error: that says "disk full")."""
    try:
        yield
    except tf.errors.ResourceExhaustedError as e:
        if is_disk_full(e):
            raise StorageError(f"disk full ({str(e.message).strip()[:200]}); free some space "
                               "and rerun") from None
        first = str(e.message).strip().splitlines()[0][:200]
        raise MirrorfitError(
            f"out of memory at a batch of {per_replica_batch} per replica ({first}); try a "
            "smaller --batch-size with --accum-steps K to keep the effective batch, --remat, "
            "--precision bf16 or fp16, or on GPUs leave memory growth on and set "
            "--gpu-memory-limit MB") from None


__all__ = ["ScalarWriter", "CpuGpuSampler", "out_of_memory_hint"]
