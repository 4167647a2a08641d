"""--strategy multi-worker --backend jax with real processes on loopback (jax.distributed, its
coordination service, gloo's CPU collectives): 2 worker processes x 1 device train exactly as 1
process x 2 devices (SGD; Adam with accumulation, bf16 and a shorter last call), count every
evaluation example once, listen on the task's own address only, survive a killed worker under
`mirrorfit launch --max-restarts 1` with the weights of an uninterrupted run, name a worker
that never joins, and stop every worker at one step on a SIGTERM to one of them.

TensorFlow is blocked in every JAX process here (``sys.modules["tensorflow"] = None``).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, _env, run_cli, keras_file_weights

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent


def _killer(victim: int, at: int, signal: str) -> list[str]:
    """argv of `mirrorfit` in which worker ``victim`` of the first group (restart 0) sends
    itself ``signal`` at the step hook of step ``at`` (killer_driver.py)."""
    return [str(HERE / "killer_driver.py"), str(victim), str(at), signal]


def _launch(*args: str, tmp: Path) -> subprocess.Popen:
    env = dict(_env(), TMPDIR=str(tmp))
    return subprocess.Popen(
        [sys.executable, "-m", "mirrorfit", "launch", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _reports(log: str) -> dict[int, dict]:
    """The JSON line each launched task printed, by worker."""
    found = {}
    for line in log.splitlines():
        _, _, text = line.partition("] ")
        if text.startswith("{"):
            data = json.loads(text)
            found[data["worker"]] = data
    return found


def _max_difference(a: list, b: list) -> float:
    assert len(a) == len(b) and a
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def _weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


@pytest.fixture(scope="module")
def both_sides(tmp_path_factory):
    """two_sides_driver.py on 2 launched worker processes and on 1 process with 2 devices."""
    out = tmp_path_factory.mktemp("sides")
    script = HERE / "two_sides_driver.py"
    proc = _launch("--workers", "2", "--", sys.executable, str(script), str(out), tmp=out)
    one = subprocess.run(
        [sys.executable, str(script), str(out)],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log[-4000:]
    assert one.returncode == 0, one.stderr[-4000:]
    reports = _reports(log)
    assert sorted(reports) == [0, 1], log[-3000:]
    return {
        "one": json.loads(one.stdout.strip().splitlines()[-1]),
        "workers": reports,
        "out": out,
        "log": log,
    }


@pytest.mark.parametrize("run", ["sgd", "adam"])
def test_two_worker_processes_train_as_one_process_with_two_devices(both_sides, run):
    out, one = both_sides["out"], both_sides["one"]
    reference = _weights(out / f"{run}-0-1.npz")
    for worker in (0, 1):
        mine = _weights(out / f"{run}-{worker}-2.npz")
        # 2 devices: the all-reduce adds the same two numbers, across processes or not. The
        # steps agree to rounding: bit for bit on AVX-512 hosts, 2e-9 apart on an AVX2 one,
        # where a process's matmuls sum in another order with the cores it has.
        assert _max_difference(mine, reference) < 1e-7
        got = both_sides["workers"][worker]["runs"][run]
        assert got["steps"] == one["runs"][run]["steps"] == 2 * (1024 // 64)
        spe = {"sgd": 4, "adam": 5}[run]  # 16 steps an epoch: 4 calls, or 3 and a short one
        assert got["calls"] == one["runs"][run]["calls"] == 2 * -(-16 // spe)
        assert got["loss"] == one["runs"][run]["loss"]
        # 16 batches of 63 (padded to 64 over the 2 devices) and one of 55, split over the
        # processes: as one process scores them (each example once: tests/fitting/test_fit.py)
        assert got["eval"] == one["runs"][run]["eval"]
    assert one["runs"][run]["eval"]["accuracy"] > 0.5  # it learnt


def test_processes_listen_on_their_own_address_and_agree_through_collectives(both_sides):
    workers = both_sides["workers"]
    for report in workers.values():
        assert (report["workers"], report["replicas"]) == (2, 2)
        # the chief's coordination service, worker 1's port, gloo's listeners: loopback only
        # (JAX's default binds its service on [::], every interface)
        assert report["listening"] == ["127.0.0.1"], report["listening"]
        assert report["agree"] is True  # worker 1 said so; worker 0 hears it
        assert report["all_equal_rank"] is False and report["all_equal_same"] is True
        assert report["tensorflow"] is False
    assert "[Gloo]" not in both_sides["log"]  # gloo's connect line, on stdout: dropped


TRAIN = [
    "--backend",
    "jax",
    "--model",
    "mlp",
    "--train-examples",
    "1024",
    "--batch-size",
    "32",
    "--no-progress",
    "--steps-per-execution",
    "4",
    "--eval-batch-size",
    "300",
    "--optimizer",
    "adam",
    "--lr",
    "0.001",
    "--epochs",
    "3",
]


def test_a_killed_worker_restarts_and_resumes_to_the_uninterrupted_weights(tmp_path):
    proc = run_cli(
        "train",
        "--replicas",
        "2",
        *TRAIN,
        "--save-keras",
        str(tmp_path / "ref.keras"),
        without_tensorflow=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    out.mkdir()
    launch = _launch(
        "--workers",
        "2",
        "--max-restarts",
        "1",
        "--",
        sys.executable,
        *_killer(1, 20, "SIGKILL"),  # worker 1 kills itself at step 20, once
        "train",
        "--strategy",
        "multi-worker",
        "--threads-per-worker",
        "1",
        *TRAIN,
        "--checkpoint-dir",
        str(out / "ckpt"),
        "--checkpoint-every",
        "8",
        "--save-keras",
        str(out / "mw.keras"),
        "--collective-timeout",
        "60",
        tmp=tmp_path,
    )
    log, _ = launch.communicate(timeout=300)
    assert launch.returncode == 0, log[-4000:]
    # The survivor: gloo's all-reduce failed at once; one line names the worker, exit 69.
    errors = [ln for ln in log.splitlines() if "mirrorfit: error" in ln]
    assert len(errors) == 1 and errors[0].startswith(
        "[worker 0] mirrorfit: error: worker 0: worker 1 (127.0.0.1:"
    ), log[-3000:]
    assert "stopped answering" in errors[0]
    assert "worker 1 exited with SIGKILL" in log and "restart 1 of 1" in log
    assert "Traceback" not in log and "Terminating process" not in log
    assert "resuming from" in log and "epoch-000001 (epoch 2, step 0)" in log, log[-3000:]
    # to rounding, as 2 workers against 1 process (3e-8 apart on an AVX2 host, 0 on AVX-512)
    diff = _max_difference(
        keras_file_weights(out / "mw.keras"), keras_file_weights(tmp_path / "ref.keras")
    )
    assert diff < 1e-6, diff


def _ports(n: int) -> list[str]:
    found = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            found.append(f"127.0.0.1:{s.getsockname()[1]}")
    return found


def _task(
    workers: list[str],
    index: int,
    *args: str,
    script: list[str] | None = None,
    out: Path | None = None,
    **env_extra: str,
) -> subprocess.Popen:
    env = dict(
        _env(),
        TF_CONFIG=json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        ),
        **env_extra,
    )
    head = [*script, "train"] if script else ["-m", "mirrorfit", "train"]
    return subprocess.Popen(
        [sys.executable, *head, "--backend", "jax", "--strategy", "multi-worker", *args],
        env=env,
        cwd=out or ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_worker_that_never_joins_is_named_within_the_timeout():
    # Worker 0 alone (worker 1 never starts) and, in another job, worker 1 alone (no chief):
    # JAX would wait, then abort with a fatal C++ log; each names the missing task, exit 69.
    jobs = [(_ports(2), 0), (_ports(2), 1)]
    t0 = time.monotonic()
    procs = [
        _task(workers, index, "--collective-timeout", "3", "--epochs", "1", "--no-progress")
        for workers, index in jobs
    ]
    results = [p.communicate(timeout=120) for p in procs]
    elapsed = time.monotonic() - t0
    for (workers, index), proc, (_, err) in zip(jobs, procs, results):
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert proc.returncode == 69 and len(lines) == 1, err[-3000:]
        other = 1 - index
        assert lines[0] == (
            f"mirrorfit: error: worker {index}: worker {other} "
            f"({workers[other]}) did not join within 3 s; check that every "
            "task started (its log), or raise --collective-timeout"
        )
    assert elapsed < 40  # Python, JAX's import, then 3 s: not JAX's wait


def test_sigterm_to_one_worker_stops_both_at_the_same_step_with_a_checkpoint(tmp_path):
    script = _killer(1, 12, "SIGTERM")
    workers = _ports(2)
    args = (
        "--threads-per-worker",
        "1",
        "--model",
        "mlp",
        "--train-examples",
        "2048",
        "--epochs",
        "2",
        "--no-progress",
        "--steps-per-execution",
        "4",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--checkpoint-every",
        "8",
    )
    # no launcher: the two tasks by hand, the script's "first group" (restart 0)
    procs = [
        _task(workers, i, *args, script=script, out=tmp_path, MIRRORFIT_LAUNCH_RESTART="0")
        for i in (0, 1)
    ]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [75, 75], errs[0][-2000:] + errs[1][-2000:]
    stops = [ln for err in errs for ln in err.splitlines() if "preempted by" in ln]
    assert stops[0].startswith("mirrorfit: preempted by another worker's signal: saved ")
    assert stops[1].startswith("mirrorfit: preempted by SIGTERM: saved ")
    # 2048 examples in global batches of 64: 32 steps an epoch, stopped inside the first
    assert all("epoch-000000-step-000012" in ln for ln in stops), stops
    meta = json.loads((tmp_path / "ckpt" / "epoch-000000-step-000012" / "meta.json").read_text())
    assert (meta["epoch"], meta["step_in_epoch"]) == (0, 12)


def test_a_killed_chief_is_named_by_the_other_worker_in_one_line(tmp_path):
    """The chief runs JAX's coordination service: when it dies, JAX's client in the other
    worker aborts the process at once (SIGABRT, its fatal log), racing gloo's failed
    all-reduce. Either way: one line naming the chief, exit 69."""
    script = _killer(0, 12, "SIGKILL")
    workers = _ports(2)
    args = (
        "--threads-per-worker",
        "1",
        "--model",
        "mlp",
        "--train-examples",
        "2048",
        "--epochs",
        "2",
        "--no-progress",
        "--steps-per-execution",
        "4",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--checkpoint-every",
        "8",
    )
    procs = [
        _task(workers, i, *args, script=script, out=tmp_path, MIRRORFIT_LAUNCH_RESTART="0")
        for i in (0, 1)
    ]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [-9, 69], errs[1][-3000:]
    lines = [ln for ln in errs[1].splitlines() if ln.strip()]
    assert len(lines) == 1, errs[1][-3000:]
    assert lines[0].startswith(
        f"mirrorfit: error: worker 1: worker 0 ({workers[0]}) stopped answering ("
    ), lines[0]
