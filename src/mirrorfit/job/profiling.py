"""Where a training step's time goes: input wait, forward/backward compute, all-reduce, update and
overhead. After training, on the same devices, each part is timed with the trainer's own
compiled pieces: the full step on one cached batch (synthetic input), each replica's forward
and backward pass (micro-batches included), one batched all-reduce of gradient-sized tensors.
Input wait = steady step time in training - synthetic step; update and overhead = synthetic
step - compute - all-reduce. State is restored after. (why: docs/architecture.md#the-step-profile)
"""

from __future__ import annotations

import time

import tensorflow as tf

from mirrorfit.job.profile_report import ProfileReport


def profile_steps(
    trainer,
    batches,
    *,
    steady_step_s: float,
    usage: dict[str, float | None] | None = None,
    target_s: float = 0.5,
    input_source: str = "memory",
) -> ProfileReport:
    """Time the parts of ``trainer``'s step on ``batches`` (training data with the trainer's
    protocol: arrays, files, synthetic). ``input_source`` says how it is read, for the report.
    ``steady_step_s``: seconds per step in training (input included). Each part runs about
    ``target_s`` seconds after one untimed warm-up call.
    """
    strategy, distribution = trainer.strategy, trainer.distribution
    saved = [v.numpy() for v in trainer.model.variables + trainer.optimizer.variables]
    one_epoch = batches.dataset(start_epoch=0, epochs=1, skip=0)

    def fed(dataset):  # as training reads it (plain on host CPUs, cut in the step)
        return iter(
            distribution.distribute(
                lambda worker, workers: dataset,
                per_replica=trainer.global_batch // trainer.replicas,
            )
        )

    from mirrorfit.engine.tensorflow.runner import TrainInput

    synthetic = fed(one_epoch.take(1).cache().repeat())
    n = int(max(5, min(1000, target_s / max(steady_step_s, 1e-6))))
    try:
        step_s = _time(lambda k: trainer.run_steps(TrainInput(synthetic, lockstep=False), k), n)
        compute_s = _time(_compute_loop(trainer, synthetic), n)
        reduce_s = _time(_all_reduce_loop(trainer), n)
        real = fed(one_epoch.repeat())
        input_s = _time(_input_loop(strategy, real), n)
    finally:
        for var, value in zip(trainer.model.variables + trainer.optimizer.variables, saved):
            var.assign(value)
    measured = steady_step_s or step_s
    usage = usage or {}
    return ProfileReport(
        step_s=measured,
        input_wait_s=max(0.0, measured - step_s),
        compute_s=min(compute_s, step_s),
        all_reduce_s=min(reduce_s, step_s),
        update_overhead_s=max(0.0, step_s - compute_s - reduce_s),
        input_batch_s=input_s,
        cpu_percent=usage.get("cpu_percent"),
        gpu_percent=usage.get("gpu_percent"),
        precision=trainer.precision.name,
        xla=trainer.jit_compile,
        input_source=input_source,
    )


def _time(run, n: int) -> float:
    """Seconds per step of ``run(k)`` (which runs k steps), after one warm-up call."""
    run(1)
    t0 = time.perf_counter()
    run(n)
    return (time.perf_counter() - t0) / n


def _compute_loop(trainer, iterator):
    strategy, step = trainer.strategy, trainer.replica_step
    k = trainer.accum_steps

    def replica(x, y):
        xs = tf.reshape(x, tf.concat([[k, -1], tf.shape(x)[1:]], 0))
        ys = tf.reshape(y, tf.concat([[k, -1], tf.shape(y)[1:]], 0))
        total = tf.constant(0.0)
        for i in range(k):  # the result is consumed, so nothing is pruned away
            grads, _, _ = step.gradients(xs[i], ys[i])
            total += tf.add_n([tf.reduce_sum(tf.cast(g, tf.float32)) for g in grads])
        return total

    @tf.function
    def loop(num):
        total = tf.constant(0.0)
        for _ in tf.range(num):
            out = strategy.run(replica, args=trainer.distribution.split(next(iterator)))
            total += tf.add_n(strategy.experimental_local_results(out))
        return total

    return lambda n: loop(tf.constant(n)).numpy()


def _all_reduce_loop(trainer):
    strategy, variables = trainer.strategy, trainer.model.trainable_variables

    def replica():
        ctx = tf.distribute.get_replica_context()
        reduced = ctx.all_reduce(
            tf.distribute.ReduceOp.SUM, [tf.zeros(v.shape, v.dtype) for v in variables]
        )
        return tf.add_n([tf.reduce_sum(r) for r in reduced])

    @tf.function
    def loop(num):
        total = tf.constant(0.0)
        for _ in tf.range(num):
            total += tf.add_n(strategy.experimental_local_results(strategy.run(replica)))
        return total

    return lambda n: loop(tf.constant(n)).numpy()


def _input_loop(strategy, iterator):
    @tf.function
    def loop(num):
        total = tf.constant(0, tf.int64)
        for _ in tf.range(num):
            _, y = next(iterator)
            total += tf.add_n(
                [tf.size(t, tf.int64) for t in strategy.experimental_local_results(y)]
            )
        return total

    return lambda n: loop(tf.constant(n)).numpy()


__all__ = ["ProfileReport", "profile_steps"]
