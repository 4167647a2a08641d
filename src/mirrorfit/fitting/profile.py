"""Where a step of ``mirrorfit.fit``'s loop spends its time (``mirrorfit train --profile``
with a compiled ``--model``): after training, on the same devices and with the runner's own
compiled calls, each part timed alone on one block of the training data: the whole step on
that block held on the devices (no input), each replica's forward and backward passes (every
micro-batch), the all-reduces of gradient-sized arrays, and the input alone (a block made
and put on the devices). The model's state (weights, optimizer, metrics) is restored after.
(why: docs/architecture.md#the-step-profile)
"""

from __future__ import annotations

import time

import numpy as np

from mirrorfit.errors import FitError


def time_parts(
    model,
    x,
    y=None,
    sample_weight=None,
    *,
    batch_size: int,
    steps_per_execution=None,
    accum_steps: int = 1,
    target_s: float = 0.5,
) -> dict[str, float]:
    """Seconds per optimizer step of each part: ``step_s`` (the step on input already on
    the devices), ``compute_s``, ``all_reduce_s``, and ``input_batch_s`` (the input alone, per
    global batch), each run about ``target_s`` seconds after one untimed call. ``model`` was
    trained by ``mirrorfit.fit`` with the same ``accum_steps`` (its runner is reused)."""
    from mirrorfit.fitting.loop import _adapter, _Run, _workers
    from mirrorfit.fitting.metrics import overrides

    if overrides(model, "train_step"):
        raise FitError(
            f"{type(model).__name__}'s own train_step is one piece, which the profile cannot "
            "time in parts; time it with mirrorfit bench --model"
        )
    run = _Run(model, steps_per_execution, accum_steps, _workers())
    adapter = _adapter(x, y, sample_weight, None, batch_size, None, False)
    data = run.epochs(adapter, batch_size, None, "train")
    if data.first is None:
        raise FitError("the training data gave no batch to profile; give at least one example")
    run.build(data.first, fits=True)
    runner = run.runner
    blocks = iter(data.blocks(run.steps_per_execution))
    first = next(blocks)
    runner.sync()  # the devices' state in the variables, to be restored from
    variables = [*model.variables, *model.optimizer.variables]
    saved = [np.array(v.numpy()) for v in variables]
    try:
        runner.load()
        held, steps = runner.put(first.data), first.steps

        def train(calls: int) -> None:
            for _ in range(calls):
                runner.train(held, steps)
            runner.logs()  # read: the calls are done

        def compute(calls: int) -> None:
            for _ in range(calls):
                runner.compute_only(held, steps)

        def all_reduce(calls: int) -> None:
            for _ in range(calls):
                runner.all_reduce_only(steps)

        calls = _calls(train, target_s)
        step_s, compute_s, reduce_s = (
            _timed(part, calls) / (calls * steps) for part in (train, compute, all_reduce)
        )
        input_s, made = _input_time(run, blocks, first, target_s)
    finally:
        for var, value in zip(variables, saved):
            var.assign(value)
        runner.load()
    return {
        "step_s": step_s,
        "compute_s": min(compute_s, step_s),
        "all_reduce_s": min(reduce_s, step_s),
        "input_batch_s": input_s / max(1, made),
    }


def _calls(run, target_s: float) -> int:
    """How many calls of ``run`` fill about ``target_s`` seconds (after a first, untimed)."""
    run(1)
    once = _timed(run, 1)
    return int(max(2, min(200, target_s / max(once, 1e-6))))


def _timed(run, n: int) -> float:
    """Seconds ``run(n)`` takes, after one call of ``run(1)`` (compiling what it needs)."""
    run(1)
    began = time.perf_counter()
    run(n)
    return time.perf_counter() - began


def _input_time(run, blocks, first, target_s: float) -> tuple[float, int]:
    """(seconds, global batches) making blocks of the epoch and putting them on the devices,
    for about ``target_s`` seconds (the epoch's blocks, then the first again)."""
    made, began = 0, time.perf_counter()
    while time.perf_counter() - began < target_s:
        block = next(blocks, first)
        run.engine.ready(run.runner.put(block.data))  # JAX puts asynchronously
        made += block.steps
    return time.perf_counter() - began, made


__all__ = ["time_parts"]
