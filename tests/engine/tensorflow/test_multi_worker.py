"""--strategy multi-worker with real processes on loopback: N workers x 1 replica train exactly
as 1 process x N replicas, see every example once per epoch, count evaluation examples exactly,
write outputs from the chief only, survive a killed worker, and name a worker that never comes.

Every run here is a real `mirrorfit` process (or `mirrorfit launch` of them); references are
`mirrorfit train --replicas 2` in one process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, _env, fresh_env, keras_file_weights, run_cli, run_isolated

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent

COMMON = (
    "--model",
    "mlp",
    "--train-examples",
    "2048",
    "--batch-size",
    "32",
    "--no-progress",
    "--steps-per-execution",
    "4",
    "--eval-batch-size",
    "300",
)
SGD = ("--optimizer", "sgd", "--epochs", "2")
ADAM = ("--optimizer", "adam", "--lr", "0.001", "--epochs", "3")


def _launch(*args: str, tmp: Path, fresh: bool = False) -> subprocess.Popen:
    """``mirrorfit launch ARGS``; ``fresh``: new interpreters, not forks (tasks whose parent
    is the launcher)."""
    env = dict(_env(), TMPDIR=str(tmp))  # the workers' scratch checkpoints go here
    return subprocess.Popen(
        [sys.executable, "-m", "mirrorfit", "launch", *args],
        env=fresh_env(env) if fresh else env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _max_diff(a: Path, b: Path) -> float:
    return max(
        float(np.abs(x - y).max())
        for x, y in zip(keras_file_weights(a), keras_file_weights(b), strict=True)
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, Path]:
    """1 process x 2 replicas, SGD and Adam: what 2 workers x 1 replica must reproduce."""
    out = tmp_path_factory.mktemp("reference")
    paths = {}
    for name, opt in (("sgd", SGD), ("adam", ADAM)):
        paths[name] = out / f"{name}.keras"
        proc = run_cli(
            "train",
            "--replicas",
            "2",
            *COMMON,
            *opt,
            "--save-keras",
            str(paths[name]),
            "--metrics-out",
            str(out / f"{name}.json"),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    return paths


def test_two_workers_train_as_one_process_with_two_replicas_and_only_the_chief_writes(
    reference, tmp_path
):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    proc = _launch(
        "--workers",
        "2",
        "--",
        "mirrorfit",
        "train",
        "--strategy",
        "multi-worker",
        "--threads-per-worker",
        "1",
        *COMMON,
        *SGD,
        "--checkpoint-dir",
        str(out / "ckpt"),
        "--export-dir",
        str(out / "models/mlp"),
        "--save-keras",
        str(out / "mw.keras"),
        "--metrics-out",
        str(out / "m.json"),
        "--logdir",
        str(out / "tb"),
        tmp=scratch,
    )
    log, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, log[-4000:]
    assert _max_diff(out / "mw.keras", reference["sgd"]) < 1e-6
    summary = json.loads((out / "m.json").read_text())
    assert (summary["workers"], summary["replicas"], summary["global_batch_size"]) == (2, 2, 64)
    # 10,000 test examples in batches of 300: the last batch is partial and split unevenly
    # over the workers; each example counts once.
    assert summary["test_examples"] == 10_000
    ref = json.loads(reference["sgd"].with_suffix(".json").read_text())
    assert summary["test_accuracy"] == pytest.approx(ref["test_accuracy"], abs=1e-6)
    # Outputs: one export version, one TensorBoard run, checkpoints with their metadata; the
    # other worker's scratch copies are gone, and it printed nothing but TF's own lines.
    assert sorted(p.name for p in (out / "models/mlp").iterdir()) == ["0001"]
    assert len(list((out / "tb").rglob("events.out.tfevents.*"))) == 1
    ckpts = sorted((out / "ckpt").glob("epoch-*"))
    assert ckpts and all((c / "meta.json").is_file() for c in ckpts)
    assert list(scratch.iterdir()) == []
    assert "exported SavedModel version" in log and "[worker 1] exported" not in log
    assert "[worker 1] done:" not in log and "[worker 0] done:" in log


def test_a_killed_worker_restarts_and_resumes_to_the_uninterrupted_weights(reference, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = _launch(
        "--workers",
        "2",
        "--max-restarts",
        "1",
        "--",
        "mirrorfit",
        "train",
        "--strategy",
        "multi-worker",
        "--threads-per-worker",
        "1",
        *COMMON,
        *ADAM,
        "--checkpoint-dir",
        str(out / "ckpt"),
        "--checkpoint-every",
        "8",
        "--save-keras",
        str(out / "mw.keras"),
        "--collective-timeout",
        "60",
        tmp=tmp_path,
        fresh=True,  # _task_pid finds the task by its parent and environment
    )
    deadline = time.monotonic() + 300
    while len(list((out / "ckpt").glob("epoch-*"))) < 2:  # mid-run (step 16 of 96)
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()[-4000:]
        time.sleep(0.2)
    victim = _task_pid(proc.pid, '"index": 1')
    os.kill(victim, signal.SIGKILL)
    log, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, log[-4000:]
    assert "worker 1 exited with SIGKILL" in log and "restart 1 of 1" in log
    assert "resuming from" in log
    assert _max_diff(out / "mw.keras", reference["adam"]) < 1e-5


def _task_pid(launcher: int, marker: str) -> int:
    """The pid of the launcher's task whose TF_CONFIG contains ``marker``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().decode(errors="replace").split("\0")
            status = (entry / "status").read_text()
        except OSError:
            continue
        ppid = next((int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("PPid:")), 0)
        if ppid == launcher and any(e.startswith("TF_CONFIG=") and marker in e for e in environ):
            return int(entry.name)
    raise AssertionError(f"no task with {marker} under launcher {launcher}")


@pytest.fixture(scope="module")
def two_workers_reading(tmp_path_factory):
    """Two launched workers of a multi-worker distribution, each reading its share of two
    epochs: what each saw and the settings its collective server was started with."""
    tmp = tmp_path_factory.mktemp("order")
    script = HERE / "worker_order_driver.py"
    proc = _launch("--workers", "2", "--", sys.executable, str(script), tmp=tmp)
    log, _ = proc.communicate(timeout=200)
    assert proc.returncode == 0, log[-4000:]
    results = {}
    for line in log.splitlines():
        tag, _, text = line.partition("] ")
        if text.startswith("{"):
            data = json.loads(text)
            results[data["worker"]] = data
    assert sorted(results) == [0, 1]
    return results


def test_every_example_once_per_epoch_across_workers_in_the_one_process_order(two_workers_reading):
    results = two_workers_reading
    expected = results[0]["expected"]  # per epoch, per step: the global batch's indices
    for epoch in range(2):
        rows = expected[epoch]
        seen_epoch = []
        for step, row in enumerate(rows):
            first = results[0]["seen"][epoch * len(rows) + step]
            second = results[1]["seen"][epoch * len(rows) + step]
            # Worker w gets the w-th half of the global batch, as replica w would in one process.
            assert first + second == row
            seen_epoch += first + second
        assert len(seen_epoch) == len(set(seen_epoch)) == 192  # once each, 8 dropped
    assert expected[0] != expected[1]  # reshuffled each epoch


def test_workers_send_each_all_reduce_buffer_whole(two_workers_reading):
    # TF's default cuts every buffer a worker sends into 4 KiB protobuf strings (-1: whole).
    # This reads the config each worker's server was created with (these workers start one
    # server each; a process that had one already would keep its first server's setting).
    assert [two_workers_reading[w]["recv_buf_max_chunk"] for w in (0, 1)] == [-1, -1]
    # Only that server: the process's context is left as it was, for any later server.
    assert [two_workers_reading[w]["context_recv_buf_max_chunk"] for w in (0, 1)] == [0, 0]


def test_a_worker_that_never_starts_is_named_within_the_timeout():
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    workers = [f"127.0.0.1:{p}" for p in ports]
    env = dict(
        _env(),
        TF_CONFIG=json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": 0}}
        ),
    )
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mirrorfit",
            "train",
            "--strategy",
            "multi-worker",
            "--collective-timeout",
            "3",
            "--epochs",
            "1",
            "--no-progress",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - t0
    # TF waits inside C++ holding the GIL: a watchdog process names the worker and kills the
    # waiting one (SIGKILL), as `mirrorfit launch` then reports.
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert f"worker 1 ({workers[1]}) did not join within 3 s" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert elapsed < 60  # TensorFlow's start, MNIST, then 3 s: not TF's endless wait


def test_multi_worker_without_a_cluster_is_refused_before_tensorflow_loads():
    env = {k: v for k, v in _env().items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "mirrorfit", "train", "--strategy", "multi-worker"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "needs a cluster" in proc.stderr and "mirrorfit launch" in proc.stderr
    assert time.monotonic() - t0 < 5


def test_sigterm_stops_every_worker_at_the_same_step_with_a_checkpoint(tmp_path):
    """TF's MultiWorkerMirroredStrategy installs its own SIGTERM handler; mirrorfit takes it
    back, and the workers agree on the step to stop at (exit 75, as on one process)."""
    out = tmp_path / "out"
    out.mkdir()
    proc = _launch(
        "--workers",
        "2",
        "--",
        "mirrorfit",
        "train",
        "--strategy",
        "multi-worker",
        "--threads-per-worker",
        "1",
        "--model",
        "mlp",
        "--train-examples",
        "8192",
        "--epochs",
        "4",
        "--no-progress",
        "--steps-per-execution",
        "4",
        "--checkpoint-dir",
        str(out / "ckpt"),
        "--checkpoint-every",
        "16",
        tmp=tmp_path,
    )
    deadline = time.monotonic() + 300
    while not list((out / "ckpt").glob("epoch-*")):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()[-4000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)  # the launcher forwards it to both workers
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, log[-4000:]
    stops = [
        line.split("saved ")[1].split(" ")[0]
        for line in log.splitlines()
        if "preempted by SIGTERM: saved" in line
    ]
    assert len(stops) == 2 and stops[0] == stops[1], log[-3000:]  # the same step on both
    assert (Path(stops[0]) / "meta.json").is_file()


def _two_worker_config(index: int) -> tuple[list[str], str]:
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    workers = [f"127.0.0.1:{p}" for p in ports]
    return workers, json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
    )


def test_a_task_whose_own_port_is_taken_says_so_at_once():
    """Worker 0's port held by another process: TF waited, then said "a worker did not join
    within 300 s (UnknownError: Could not start gRPC server)" (69), or blamed worker 1. Now
    one line naming this task's port, exit 2, at once (checked before TensorFlow loads)."""
    workers, config = _two_worker_config(0)
    holder = socket.socket()
    holder.bind(("127.0.0.1", int(workers[0].rpartition(":")[2])))
    holder.listen()
    try:
        t0 = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "mirrorfit",
                "train",
                "--strategy",
                "multi-worker",
                "--collective-timeout",
                "20",
                "--epochs",
                "1",
                "--no-progress",
            ],
            env=dict(_env(), TF_CONFIG=config),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        elapsed = time.monotonic() - t0
    finally:
        holder.close()
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("mirrorfit:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        f"worker 0: this task's port {workers[0].rpartition(':')[2]} ({workers[0]} in "
        "TF_CONFIG) is in use by another process on this host"
    ) in errors[0]
    assert elapsed < 10  # the interpreter and mirrorfit's flags: no TensorFlow, no wait


def test_training_servers_listen_on_their_own_address_only():
    """TF binds 0.0.0.0:PORT (`ss` showed *:port): a launched job on a laptop accepted
    TensorFlow's unauthenticated gRPC from the network. A multi-worker task (one worker: its
    strategy starts its server) and a parameter-server task's server listen on 127.0.0.1, the
    address the cluster spec gives them."""
    workers, _ = _two_worker_config(0)
    out = run_isolated(HERE / "listen_driver.py", *workers, timeout=180)
    assert out == [["127.0.0.1"], ["127.0.0.1"]], out  # was [["::"], ...]: every interface
