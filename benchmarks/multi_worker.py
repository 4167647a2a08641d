"""N worker processes vs one, at the same global batch: what multi-worker training buys here,
on TensorFlow and on JAX (``--backends``), and PyTorch DDP beside them (``--torch-python``).

Each side is the real product command: ``mirrorfit launch --workers N -- mirrorfit train
--strategy multi-worker --threads-per-worker T [--backend jax]`` against ``mirrorfit train
--threads-per-worker T`` (one process, one device). With ``--torch-python PY`` (an interpreter
with PyTorch: no dependency of mirrorfit), the CNN also runs in PyTorch, N ranks of
DistributedDataParallel on gloo against one process (``benchmarks/ddp_cnn.py``: the same
examples, batch, order, steps and threads; its ranks bound to cores as the launcher binds
workers). Sides alternate and repeat (the machine is shared and noisy);
we print medians, the spread, the ratio of medians and each pair's ratio (the two runs of
one repeat, back to back). Throughput is mirrorfit's steady
examples/s (the first compiled execution excluded), from ``--metrics-out``. The launched
workers are bound to CPUs of their own (``mirrorfit launch``'s default, ``--bind-cpus auto``),
and the one-worker side to the CPUs the first of them gets: a process told to use one thread
is not always held to one core (JAX's XLA runs work on other threads; input threads), and the
comparison is of N workers against what one of them has (``--unbound-one``: as before).

``--apart`` adds a third side, N independent processes each on 1/N of the batch at once: the
most N processes give on this machine with no all-reduce, to tell what communication and
lockstep cost from what the machine does (two busy cores are not twice one).

    python benchmarks/multi_worker.py --data-dir ../shared/data [--repeats 3] [--models cnn,mlp]
        [--backends tensorflow,jax] [--torch-python PY] [--apart]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from mirrorfit.distribute._cpu_binding import available_cores, plan_cpus, started_on

# model -> (global batch, training examples, epochs, steps per execution): seconds per run
# here, enough steps that the first execution's tracing is a small part of the wall time.
# The CNN times 175 steps per run (about 35 s on 2 workers here): shorter runs moved with
# every hiccup of the shared machine.
WORKLOADS = {"cnn": (64, 6400, 2, 25), "mlp": (64, 32000, 2, 50)}


def _train_argv(
    model: str, threads: int, out: Path, share: int = 1, backend: str = "tensorflow"
) -> list[str]:
    """``mirrorfit train`` on the workload, or on 1/``share`` of its batch and examples."""
    batch, examples, epochs, spe = WORKLOADS[model]
    return [
        "mirrorfit",
        "train",
        "--backend",
        backend,
        "--model",
        model,
        "--global-batch-size",
        str(batch // share),
        "--train-examples",
        str(examples // share),
        "--epochs",
        str(epochs),
        "--steps-per-execution",
        str(spe),
        "--threads-per-worker",
        str(threads),
        "--no-progress",
        "--metrics-out",
        str(out),
    ]


def _env(data_dir: str) -> dict:
    return dict(
        os.environ, MIRRORFIT_DATA=data_dir, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""
    )


def _one_core(share_of: int) -> tuple[int, ...] | None:
    """The CPUs the first of ``share_of`` launched workers is bound to (``mirrorfit launch``'s
    plan): where the one-worker side runs, so that it has what one worker has. Unbound, a
    JAX process set to one thread still ran XLA's work on a second core (268 against 193
    examples/s on the CNN here), and its input thread there."""
    plan = plan_cpus(available_cores() or [], share_of)
    return plan[0] if plan else None


def _run(
    model: str,
    workers: int,
    threads: int,
    data_dir: str,
    out: Path,
    backend: str = "tensorflow",
    share_of: int = 0,
) -> dict:
    """One side: ``mirrorfit launch --workers N -- mirrorfit train ...`` or, for one worker,
    ``mirrorfit train ...`` (bound to one worker's cores of ``share_of`` when given); its
    summary (``--metrics-out``)."""
    train = _train_argv(model, threads, out, backend=backend)
    if workers > 1:
        cmd = [
            sys.executable,
            "-m",
            "mirrorfit",
            "launch",
            "--workers",
            str(workers),
            "--",
            *train,
            "--strategy",
            "multi-worker",
        ]
    else:
        cmd = [sys.executable, "-m", "mirrorfit", *train[1:]]
    with started_on(_one_core(share_of) if workers == 1 and share_of else None):
        proc = subprocess.Popen(
            cmd, env=_env(data_dir), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    try:
        _, err = proc.communicate(timeout=900)
    except BaseException as e:  # a timeout, or Ctrl-C while the side runs
        # SIGTERM, not SIGKILL: the launcher forwards it to its workers and waits for them;
        # killed outright, it would leave them training on the shared machine.
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            raise SystemExit(f"{' '.join(cmd)} took over 900 s; stopped:\n{err[-3000:]}") from None
        raise
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    return json.loads(out.read_text())


def _run_torch(
    model: str, workers: int, threads: int, data_dir: str, out: Path, python: str, share_of: int = 0
) -> dict:
    """PyTorch: ``workers`` ranks of ``benchmarks/ddp_cnn.py`` (DDP on gloo; each on cores of
    its own, as launched workers are, when there are more than one), or one process."""
    batch, examples, epochs, spe = WORKLOADS[model]
    plan = (
        plan_cpus(available_cores() or [], workers)
        if workers > 1
        else [_one_core(share_of)]
        if share_of
        else None
    ) or [None] * workers
    port = _free_port()
    script = Path(__file__).with_name("ddp_cnn.py")
    procs = []
    try:
        for rank, cpus in enumerate(plan):
            cmd = [
                python,
                str(script),
                "--data-dir",
                data_dir,
                "--out",
                str(out),
                "--global-batch-size",
                str(batch),
                "--train-examples",
                str(examples),
                "--epochs",
                str(epochs),
                "--skip",
                str(spe),
                "--threads",
                str(threads),
            ]
            env = dict(
                _env(data_dir), RANK=str(rank), WORLD_SIZE=str(workers), MASTER_PORT=str(port)
            )
            with started_on(cpus):
                procs.append(
                    subprocess.Popen(
                        cmd, env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
                    )
                )
        _wait_all(procs)
    finally:  # a failure must not leave the others training on the shared machine
        _kill_all(procs)
    return json.loads(out.read_text())


def _wait_all(procs: list) -> None:
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(proc.args)} failed:\n{err[-3000:]}")


def _kill_all(procs: list) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_apart(
    model: str, workers: int, threads: int, data_dir: str, out: Path, backend: str = "tensorflow"
) -> dict:
    """The bound without communication: ``workers`` independent ``mirrorfit train`` processes
    at once, each on 1/N of the batch and examples (the same steps) and, like launched workers,
    on CPUs of its own. Their examples/s summed; no test accuracy (each saw 1/N of the data)."""
    plan = plan_cpus(available_cores() or [], workers) or [None] * workers
    procs, outs = [], []
    try:
        for i, cpus in enumerate(plan):
            outs.append(out.with_suffix(f".{i}.json"))
            cmd = [
                sys.executable,
                "-m",
                "mirrorfit",
                *_train_argv(model, threads, outs[-1], share=workers, backend=backend)[1:],
            ]
            with started_on(cpus):
                procs.append(
                    subprocess.Popen(
                        cmd,
                        env=_env(data_dir),
                        text=True,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                    )
                )
        _wait_all(procs)
    finally:  # a failure must not leave the others training on the shared machine
        _kill_all(procs)
    rates = [json.loads(o.read_text())["train_examples_per_sec"] for o in outs]
    return {"train_examples_per_sec": sum(rates), "test_accuracy": math.nan}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=os.environ.get("MIRRORFIT_DATA", "../shared/data"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", default="cnn,mlp")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads-per-worker", type=int, default=1)
    p.add_argument(
        "--backends",
        default="tensorflow,jax",
        help="mirrorfit's engines to measure, in one run (default: both)",
    )
    p.add_argument(
        "--torch-python",
        metavar="PY",
        help="an interpreter with PyTorch: the CNN in PyTorch DDP (gloo) too",
    )
    p.add_argument(
        "--apart",
        action="store_true",
        help="also run N independent processes on 1/N of the batch each: what N "
        "processes give here with no communication at all",
    )
    p.add_argument(
        "--unbound-one",
        action="store_true",
        help="run the one-worker side unbound (as runs before 2026-12-01 did), not "
        "on one launched worker's cores",
    )
    a = p.parse_args()
    backends = a.backends.split(",")
    if not set(backends) <= {"tensorflow", "jax"} or not backends:
        p.error(f"--backends {a.backends!r}: choose from tensorflow, jax")
    for model in a.models.split(","):
        if model not in WORKLOADS:
            p.error(f"--models: unknown model {model!r}; choose from {', '.join(WORKLOADS)}")
        batch, examples = WORKLOADS[model][:2]
        if a.workers < 2 or batch % a.workers or examples % a.workers:
            p.error(
                f"--workers {a.workers}: the {model} workload's batch ({batch}) and examples "
                f"({examples}) must split evenly over 2 or more workers; e.g. --workers 2"
            )
    data_dir = os.path.abspath(a.data_dir)
    n, t = a.workers, a.threads_per_worker
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            sides, pairs_of = {}, []  # pairs_of: (N workers' side, 1 worker's, apart's)
            for backend in backends:
                tag = {"tensorflow": "tf", "jax": "jax"}[backend]
                many, one = f"{tag}: {n} workers x {t} thread", f"{tag}: 1 worker x {t} thread"
                sides[many] = functools.partial(_run, workers=n, backend=backend)
                sides[one] = functools.partial(
                    _run, workers=1, backend=backend, share_of=0 if a.unbound_one else n
                )
                apart = None
                if a.apart:
                    apart = f"{tag}: {n} apart, no all-reduce"
                    sides[apart] = functools.partial(_run_apart, workers=n, backend=backend)
                pairs_of.append((many, one, apart))
            if a.torch_python and model == "cnn":
                many, one = f"torch DDP: {n} workers x {t} thread", f"torch: 1 worker x {t} thread"
                sides[many] = functools.partial(_run_torch, workers=n, python=a.torch_python)
                sides[one] = functools.partial(
                    _run_torch, workers=1, python=a.torch_python, share_of=0 if a.unbound_one else n
                )
                pairs_of.append((many, one, None))
            rates: dict[str, list[float]] = {name: [] for name in sides}
            accuracy: dict[str, list[float]] = {name: [] for name in sides}
            for r in range(a.repeats):
                # Alternate the order, so drift on the shared machine is fair.
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for i, name in enumerate(order):
                    out = Path(tmp) / f"{model}-{r}-{i}.json"
                    summary = sides[name](model, threads=t, data_dir=data_dir, out=out)
                    rates[name].append(summary["train_examples_per_sec"])
                    accuracy[name].append(summary["test_accuracy"])
                    print(
                        f"  {model} {name}: {summary['train_examples_per_sec']:,.0f} "
                        f"examples/s, test accuracy {summary['test_accuracy']:.4f}",
                        flush=True,
                    )
            batch = WORKLOADS[model][0]
            print(f"{model}, global batch {batch}, {a.repeats} repeats (median, min-max):")
            for name, values in rates.items():
                print(
                    f"  {name:34} {statistics.median(values):9,.0f} examples/s "
                    f"({min(values):,.0f}-{max(values):,.0f}), test accuracy "
                    f"{statistics.median(accuracy[name]):.4f}"
                )
            for many_name, one_name, apart_name in pairs_of:
                many, one = rates[many_name], rates[one_name]
                pairs = [m / o for m, o in zip(many, one)]
                print(
                    f"  {many_name.split(':')[0]}: ratio {n} workers / 1 worker: "
                    f"{statistics.median(many) / statistics.median(one):.2f}x (ratio of "
                    f"medians); per pair {', '.join(f'{r:.2f}' for r in pairs)}, median "
                    f"{statistics.median(pairs):.2f}x",
                    flush=True,
                )
                if apart_name:
                    apart = rates[apart_name]
                    print(
                        f"    {n} workers / {n} apart (what the all-reduce and lockstep "
                        f"cost): {statistics.median(many) / statistics.median(apart):.2f}x; "
                        f"1 worker: {statistics.median(apart) / statistics.median(one):.2f}x",
                        flush=True,
                    )
            if len(pairs_of) > 1:  # the engines side by side, N workers each
                first = pairs_of[0][0]
                print(
                    "  "
                    + "; ".join(
                        f"{m.split(':')[0]} {n} workers / {first.split(':')[0]} {n} workers: "
                        f"{statistics.median(rates[m]) / statistics.median(rates[first]):.2f}x"
                        for m, _, _ in pairs_of[1:]
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
