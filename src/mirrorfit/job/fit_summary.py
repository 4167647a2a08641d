"""What a ``mirrorfit train`` run (through ``mirrorfit.fit``) says: what each device holds, a
line per epoch where no progress bar shows, the "done" line, and ``--metrics-out``'s record
(the earlier loop's fields, so that a tool reading one reads the other); ``history`` is
Keras's own (a dict of lists), and ``test`` the compile's figures by name."""

from __future__ import annotations

import time
from typing import Any

from mirrorfit.config import TrainConfig, to_dict


def state_line(runner) -> str:
    """The start screen's line on what each device holds (``runner``: an engine's)."""
    return (
        f"state: {runner.describe_sharding()}; "
        f"{runner.state_bytes_per_device() / 2**20:,.1f} MiB per device"
    )


def state_fields(runner, shard: str) -> dict[str, Any]:
    """--metrics-out's fields on what each device holds."""
    return {
        "shard": shard,
        "state_bytes_per_device": runner.state_bytes_per_device(),
        "peak_device_bytes": runner.peak_device_bytes(),
    }  # GPUs; None elsewhere


def epoch_record(
    console, epochs: int, *, lines: bool, fp16: bool = False, examples: int = 0, batch: int = 0
):
    """A Keras callback: ``steps_before``, the optimizer's steps as the first epoch of this
    process begins (after a resume's restore), and with ``lines`` a line printed at each
    epoch's end, ``epoch 2/5: loss 0.3127 accuracy 0.9100 val_loss ... (4.1 s)``, as the
    built-in loop's ``--no-progress`` prints it. With ``fp16`` it counts the steps trained
    (``skipped(model)``: those fp16's loss scaling skipped) and the line ends with
    ``loss scale 32768, 3 skipped``; with ``examples`` (an epoch's; 0: unknown) and
    ``batch`` (the global batch) the examples/s of the steps the epoch trained in this
    process, validation left out (the first epoch's compile in), also kept as ``rate``."""
    import keras

    class EpochRecord(keras.callbacks.Callback):
        steps_before: int | None = None
        train_s = 0.0  # the epochs' seconds, validation left out
        trained = 0  # steps this process trained
        epoch_steps = 0  # of them, this epoch's
        rate: float | None = None  # the last epoch's examples/s (None: unknown)

        def skipped(self, model) -> int:
            """Steps this process trained whose update fp16's scaling skipped (Keras's
            LossScaleOptimizer counts only the applied ones)."""
            applied = optimizer_steps(model) - (self.steps_before or 0)
            return max(0, self.trained - applied)

        def on_epoch_begin(self, epoch, logs=None):
            self.began, self.validated, self.epoch_steps = time.perf_counter(), 0.0, 0
            if self.steps_before is None:
                self.steps_before = optimizer_steps(self.model)

        def on_test_begin(self, logs=None):
            self.test_began = time.perf_counter()

        def on_test_end(self, logs=None):
            self.validated += time.perf_counter() - self.test_began

        def on_train_batch_begin(self, batch, logs=None):
            self.first = batch  # mirrorfit.fit calls it per call of several steps

        def on_train_batch_end(self, batch, logs=None):
            self.trained += batch - self.first + 1
            self.epoch_steps += batch - self.first + 1

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.perf_counter() - self.began
            trained = seconds - self.validated
            self.train_s += trained
            done = min(self.epoch_steps * batch, examples or 0)  # a partial last batch
            self.rate = done / trained if done and trained > 0 else None
            if lines:
                shown = (logs or {}).items()
                figures = " ".join(f"{k} {v:.4f}" for k, v in shown if _number(v))
                scaled = ""
                if fp16:
                    scale = loss_scale_now(self.model)
                    scaled = f" loss scale {scale:g}, {self.skipped(self.model)} skipped"
                rate = f" {self.rate:,.0f} examples/s" if self.rate is not None else ""
                console.print(
                    f"epoch {epoch + 1}/{epochs}: {figures}{rate}{scaled} ({seconds:.1f} s)"
                )

    return EpochRecord()


def summary(
    config: TrainConfig, model, history, *, steps_before: int | None, skipped: int = 0, **fields
) -> dict:
    """--metrics-out's record: ``fields`` (what the run measured: ``wall_time_s``,
    ``train_examples_per_sec``, ``train_examples``, ``test``, ``test_eval_time_s``, ...) with
    what the model, its optimizer and the setup say. ``steps_before``: the optimizer's steps
    when this process began (a resumed run's); ``skipped``: the steps fp16's scaling skipped."""
    from mirrorfit.fitting.setup import current

    setup = current()
    replicas = setup.replicas
    global_batch = config.batch_sizes(replicas)[1]
    last = {k: v[-1] for k, v in history.history.items() if v}
    test = fields.get("test") or {}
    steps = optimizer_steps(model)
    return {
        "model": config.model,
        "precision": config.precision,
        "accum_steps": config.accum_steps,
        "replicas": replicas,
        "devices": list(setup.devices.devices),
        "workers": setup.workers,
        "backend": config.backend,
        "strategy": _strategy_name(setup),
        "per_replica_batch_size": global_batch // replicas,
        "global_batch_size": global_batch,
        "model_parallel": config.model_parallel,
        "epochs": len(history.history.get("loss", [])),
        "steps": steps,  # the whole run's optimizer steps, a resumed one's too
        "steps_this_run": steps - (steps if steps_before is None else steps_before),
        "optimizer_updates": steps,  # Keras counts an update skipped by fp16's scale as none
        "final_train_loss": last.get("loss"),
        "final_train_accuracy": last.get("accuracy"),
        "val_loss": last.get("val_loss"),
        "val_accuracy": last.get("val_accuracy"),
        "test_loss": test.get("loss"),
        "test_accuracy": test.get("accuracy"),
        "history": history.history,
        "learning_rate": learning_rate_now(model),
        "loss_scale": loss_scale_now(model),
        "skipped_steps": skipped,
        "data": _data(config, model, fields.pop("description", None)),
        "config": to_dict(config),
        **fields,
    }


def done_line(summary: dict) -> str:
    """``done: 120 steps in 8.1 s, 3,900 examples/s steady, loss 0.31, ...; test ...``."""
    last = {k: v[-1] for k, v in summary["history"].items() if v}
    steady = summary["train_examples_per_sec"]
    steps, this_run = summary["steps"], summary["steps_this_run"]
    resumed = steps - this_run
    parts = [
        f"{steps} steps"
        + (f" ({this_run} in this run, resumed at step {resumed})" if resumed else "")
        + f" in {summary['wall_time_s']:.1f} s",
        *([f"{steady:,.0f} examples/s steady"] if steady else []),
        *(f"{k} {v:#.4g}" for k, v in last.items() if _number(v)),  # 0.9000, not 0.9
    ]
    test = summary.get("test")
    tested = "; test " + ", ".join(f"{k} {v:#.4g}" for k, v in test.items()) if test else ""
    return "done: " + ", ".join(parts) + tested


def optimizer_steps(model) -> int:
    """The optimizer's updates so far (0 before one is built)."""
    import keras

    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not getattr(optimizer, "built", False):
        return 0
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


def learning_rate_now(model) -> float | None:
    """The optimizer's learning rate now (a schedule's at its current step)."""
    import keras

    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    try:
        return float(keras.ops.convert_to_numpy(inner.learning_rate))
    except (TypeError, ValueError, AttributeError):
        return None


def loss_scale_now(model) -> float | None:
    """fp16's dynamic loss scale (Keras's LossScaleOptimizer), else None."""
    import keras

    scale = getattr(getattr(model, "optimizer", None), "dynamic_scale", None)
    return None if scale is None else float(keras.ops.convert_to_numpy(scale))


def _data(config: TrainConfig, model, description: str | None) -> dict:
    """The built-in loop's ``data`` record: the source, its kind, and the shapes the model
    took (its input's, its classes)."""
    from mirrorfit.data.spec import kind_of
    from mirrorfit.models.shapes import classes_of, input_shape_of

    source = config.data or "mnist"
    shape = input_shape_of(model)
    return {
        "source": source,
        "kind": kind_of(source).name,
        "description": description,
        "input_shape": list(shape) if shape else None,
        "num_classes": classes_of(model),
        "class_names": _names(model),
    }


def _names(model) -> list[str] | None:
    """The data's class names a built-in model trained on (an image folder's), else None."""
    names = getattr(model, "class_names", None)
    return list(names) if names else None


def _strategy_name(setup) -> str:
    named = getattr(setup.distribution, "strategy_name", None)
    return (
        named or getattr(setup.placement, "strategy_name", None) or type(setup.placement).__name__
    )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


__all__ = ["done_line", "epoch_record", "optimizer_steps", "summary"]
