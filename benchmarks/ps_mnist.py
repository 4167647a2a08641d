"""Parameter-server training of the MNIST MLP on this host: 1 chief + N workers + M ps.

Starts the ps and worker tasks as subprocesses on free loopback ports (each runs
``mirrorfit.engine.tensorflow.parameter_server.serve``), runs the chief here:
``ParameterServerStrategy`` + ``ClusterCoordinator``, the model and optimizer built under the
strategy (Keras 3), the engine's ``ReplicaStep`` driven by ``coordinated_loops``. Reports test
accuracy and examples/s and always stops the subprocesses.

    python benchmarks/ps_mnist.py --epochs 3                 # 2 workers, 1 ps, Adam 1e-3
    python benchmarks/ps_mnist.py --kill-worker-at-step 300  # worker 1 killed mid-run, back 2 s on

The last stdout line is a JSON summary. Each worker reads its own shard of the training set,
shuffled with its own seed, one batch per optimizer step (asynchronous updates); an epoch is
``train examples // batch`` steps counted on the chief.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVE = "from mirrorfit.engine.tensorflow.parameter_server import serve; serve()"


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now (all held open together, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalCluster:
    """ps and worker tasks as subprocesses; ``stop()`` kills them all (also on error)."""

    def __init__(self, workers: int, ps: int, log_dir: Path) -> None:
        ports = free_ports(1 + workers + ps)
        self.spec = {
            "chief": [f"127.0.0.1:{ports[0]}"],
            "worker": [f"127.0.0.1:{p}" for p in ports[1 : 1 + workers]],
            "ps": [f"127.0.0.1:{p}" for p in ports[1 + workers :]],
        }
        self.log_dir = log_dir
        self.procs: dict[tuple[str, int], subprocess.Popen] = {}
        self.pids: list[int] = []  # every task process ever started (restarts included)
        self._lock = threading.Lock()  # a restart timer may fire while stop() runs
        self._stopped = False

    def start_all(self) -> None:
        for job in ("ps", "worker"):
            for i in range(len(self.spec[job])):
                self.start(job, i)

    def start(self, job: str, index: int) -> None:
        with self._lock:
            if not self._stopped:  # a restart due after the run ended starts nothing
                self._start(job, index)

    def _start(self, job: str, index: int) -> None:
        env = dict(
            os.environ,
            TF_CPP_MIN_LOG_LEVEL="2",
            CUDA_VISIBLE_DEVICES="",
            TF_CONFIG=json.dumps({"cluster": self.spec, "task": {"type": job, "index": index}}),
            PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        )
        log = open(self.log_dir / f"{job}{index}.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()  # the child holds its own descriptor
        self.procs[job, index] = proc
        self.pids.append(proc.pid)

    def kill(self, job: str, index: int) -> None:
        with self._lock:
            proc = self.procs[job, index]
            proc.kill()  # SIGKILL: no goodbye to the chief, as in a crash or preemption
            proc.wait()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
            for proc in self.procs.values():
                proc.wait()

    def resolver(self):
        import tensorflow as tf

        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(self.spec), task_type="chief", task_id=0, rpc_layer="grpc"
        )


def kill_and_restart(cluster: LocalCluster, step: int, restart_after: float) -> None:
    """SIGKILL worker 1 now and start it again (same address) ``restart_after`` s later."""
    cluster.kill("worker", 1)
    print(
        f"run from step {step}: killed worker 1 mid-closure; restarting it in {restart_after} s",
        flush=True,
    )
    threading.Timer(restart_after, cluster.start, args=("worker", 1)).start()


def train(args, cluster: LocalCluster) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    import mirrorfit
    from mirrorfit.data.pipeline import eval_dataset
    from mirrorfit.engine.tensorflow.parameter_server import coordinated_loops
    from mirrorfit.engine.tensorflow.step import ReplicaStep

    data = mirrorfit.load_mnist(args.data_dir, train_examples=args.train_examples, download=False)
    x_train, y_train = data.x_train, data.y_train
    setup_start = time.perf_counter()  # connect, build, send the datasets
    strategy = tf.distribute.experimental.ParameterServerStrategy(cluster.resolver())
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = mirrorfit.models.mlp()
        optimizer = (
            keras.optimizers.Adam(args.lr)
            if args.optimizer == "adam"
            else keras.optimizers.SGD(args.lr)
        )
        optimizer.build(model.trainable_variables)
        step = ReplicaStep(
            model=model,
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(),
            train_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            eval_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            global_batch=args.batch,
            num_replicas=strategy.num_replicas_in_sync,
        )
    loops = coordinated_loops(strategy, coordinator, step.train, step.evaluate)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        # Runs on each worker (the arrays travel inside the graph): its own shard, shuffled
        # with its own seed each pass; a restarted worker starts its shard over.
        ds = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        ds = ds.shuffle(
            len(x_train) // ctx.num_input_pipelines + 1, seed=args.seed + ctx.input_pipeline_id
        )
        ds = ds.repeat().batch(args.batch, drop_remainder=True)
        return ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y)).prefetch(2)

    iterator = loops.per_worker_dataset(dataset_fn)
    steps_per_epoch = len(x_train) // args.batch
    total_steps = steps_per_epoch * args.epochs
    setup_s = time.perf_counter() - setup_start
    done, first, steady_steps, steady_s, epochs = 0, True, 0, 0.0, []
    killed = False
    start = time.perf_counter()
    while done < total_steps:
        n = min(
            args.steps_per_execution, total_steps - done, steps_per_epoch - done % steps_per_epoch
        )  # epochs end on a run boundary
        if args.kill_worker_at_step is not None and not killed and done >= args.kill_worker_at_step:
            killed = True  # mid-closure: 0.3 s into this run, from another thread
            threading.Timer(0.3, kill_and_restart, args=(cluster, done, args.restart_after)).start()
        t0 = time.perf_counter()
        loops.run_train(iterator, n)
        elapsed = time.perf_counter() - t0
        done += n
        if not first:  # the first run traces and sends the datasets: not steady
            steady_steps += n
            steady_s += elapsed
        first = False
        if done % steps_per_epoch == 0:
            logs = {
                "epoch": done // steps_per_epoch,
                "loss": float(step.loss_tracker.result()),
                "accuracy": float(step.train_metrics[0].result()),
                "examples": int(step.loss_tracker.count.numpy()),  # counted by the metric
                "seconds": round(time.perf_counter() - start, 2),
            }
            epochs.append(logs)
            print(json.dumps(logs), flush=True)
            for metric in (step.loss_tracker, *step.train_metrics):
                metric.reset_state()
    train_s = time.perf_counter() - start
    t0 = time.perf_counter()
    loops.evaluate(eval_dataset(data.x_test, data.y_test, global_batch=1000))
    eval_s = time.perf_counter() - t0
    weights = model.get_weights()
    return {
        "workers": len(cluster.spec["worker"]),
        "ps": len(cluster.spec["ps"]),
        "optimizer": args.optimizer,
        "batch": args.batch,
        "epochs": args.epochs,
        "steps": done,
        "optimizer_iterations": int(optimizer.iterations.numpy()),
        "test_accuracy": float(step.eval_metrics[0].result()),
        "test_loss": float(step.eval_loss_tracker.result()),
        "test_examples": int(step.eval_loss_tracker.count.numpy()),
        "train_examples_per_sec": steady_steps * args.batch / steady_s if steady_s else 0.0,
        "setup_s": round(setup_s, 2),
        "train_s": round(train_s, 2),
        "eval_s": round(eval_s, 2),
        "tracing_count": loops.tracing_count(),
        "worker_killed": killed,
        "finite_weights": bool(all(np.isfinite(w).all() for w in weights)),
        "history": epochs,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128, help="examples per optimizer step")
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--steps-per-execution",
        type=int,
        default=100,
        help="optimizer steps per run_train (split over the workers)",
    )
    parser.add_argument("--train-examples", type=int, default=None)
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORFIT_DATA"))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--kill-worker-at-step", type=int, default=None)
    parser.add_argument("--restart-after", type=float, default=2.0, help="seconds")
    parser.add_argument(
        "--log-dir", default=None, help="keep the tasks' logs here (default: a temporary folder)"
    )
    args = parser.parse_args(argv)
    if args.kill_worker_at_step is not None and args.workers < 2:
        parser.error("--kill-worker-at-step needs --workers >= 2 (worker 1 is killed)")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    with tempfile.TemporaryDirectory(prefix="ps_mnist_") as tmp:
        logs = Path(args.log_dir or tmp)
        logs.mkdir(parents=True, exist_ok=True)
        cluster = LocalCluster(args.workers, args.ps, logs)
        try:
            cluster.start_all()
            result = train(args, cluster)
        except BaseException:
            for log in sorted(Path(logs).glob("*.log")):
                tail = log.read_text(errors="replace").strip().splitlines()[-5:]
                print(f"--- {log.name} (last lines)\n" + "\n".join(tail), file=sys.stderr)
            raise
        finally:
            cluster.stop()
    result["task_pids"] = cluster.pids  # all killed and reaped by now
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    # The chief's TensorFlow would now try to release its functions on the stopped tasks (a
    # page of gRPC "Connection refused" errors and seconds of retries): leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
