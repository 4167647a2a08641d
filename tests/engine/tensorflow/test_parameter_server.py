"""--strategy parameter-server through the product path: `mirrorfit launch --workers 2 --ps 1 --
mirrorfit train --strategy parameter-server`, real processes on loopback (a chief, 2 workers,
1 ps). The chief schedules the engine's steps on the workers; only it writes outputs."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, _env, run_isolated

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent


def test_parameter_server_training_of_the_mlp_reaches_95_percent_and_only_the_chief_writes(
    tmp_path,
):
    out = tmp_path / "out"
    out.mkdir()
    # ~35 s on 2 cores: 3 epochs of Adam 1e-3, 128 examples per step (one worker's batch).
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mirrorfit",
            "launch",
            "--workers",
            "2",
            "--ps",
            "1",
            "--",
            "mirrorfit",
            "train",
            "--strategy",
            "parameter-server",
            "--optimizer",
            "adam",
            "--lr",
            "0.001",
            "--epochs",
            "3",
            "--batch-size",
            "128",
            "--steps-per-execution",
            "100",
            "--no-progress",
            "--checkpoint-dir",
            str(out / "ckpt"),
            "--metrics-out",
            str(out / "m.json"),
            "--export-dir",
            str(out / "models/mlp"),
        ],
        env=dict(_env(), TMPDIR=str(tmp_path)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-4000:]
    summary = json.loads((out / "m.json").read_text())
    assert summary["strategy"] == "ParameterServerStrategyV2" and summary["workers"] == 2
    assert summary["test_accuracy"] >= 0.95, summary["test_accuracy"]
    assert summary["test_examples"] == 10_000  # evaluated on the chief: every example once
    # the optimizer's own count, every step of 3 epochs (the partial last batch trained):
    # Keras's read-modify-write increments would lose some of these with two workers racing
    # (benchmarks/repro/ps_keras3_lost_updates.py); the coordinated loops make them atomic.
    assert summary["optimizer_updates"] == summary["steps"] == 3 * -(-55_000 // 128)
    assert sorted(p.name for p in (out / "models/mlp").iterdir()) == ["0001"]
    newest = sorted(p.name for p in (out / "ckpt").glob("epoch-*"))[-1]
    assert newest == "epoch-000003"
    log = proc.stdout + proc.stderr
    assert "[chief] done:" in log and "[worker 0] done:" not in log
    for task in ("worker 0", "worker 1", "ps 0"):
        assert f"[{task}] {task} of 2 worker(s)" in log  # they served, and said so once


def _listening_on(address: str) -> psutil.Process | None:
    """The process serving ``address`` (host:port): a task's own gRPC server. (Found by its
    port: the test's processes may be forks, whose /proc environ is their parent's.)"""
    port = int(address.rpartition(":")[2])
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    return None


def test_a_killed_worker_is_restarted_and_its_steps_retried(tmp_path):
    """Worker 1 SIGKILLed right after epoch 1 of 2, mid-schedule: the launcher restarts it
    alone at its address, the chief's coordinator runs the lost steps again on a live worker,
    and training ends with every step of both epochs applied (a killed call's steps may have
    applied part of their updates before it died: at least as many updates as steps)."""
    out = tmp_path / "m.json"
    argv = [sys.executable, "-m", "mirrorfit", "launch", "--workers", "2", "--ps", "1"]
    argv += ["--max-restarts", "1", "--", "mirrorfit", "train", "--strategy", "parameter-server"]
    argv += ["--epochs", "2", "--train-examples", "25600", "--batch-size", "128"]
    argv += ["--steps-per-execution", "20", "--no-progress", "--metrics-out", str(out)]
    proc = subprocess.Popen(
        argv,
        env=dict(_env(), TMPDIR=str(tmp_path)),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log, killed = [], None
    try:
        for line in proc.stdout:
            log.append(line)
            if killed is None and line.startswith("[chief] epoch 1/2:"):
                killed = _listening_on(re.search(r"worker 1 (\S+),", log[0]).group(1))
                assert killed is not None, "".join(log)
                killed.send_signal(signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        proc.kill()
    text = "".join(log)
    assert proc.returncode == 0 and killed is not None, text[-4000:]
    assert "worker 1 exited with SIGKILL (-9); restarting worker 1 alone" in text
    summary = json.loads(out.read_text())
    # the killed call's steps may be counted again when rerun: at most one call (20 steps)
    assert 2 * 25_600 // 128 <= summary["steps"] <= 2 * 25_600 // 128 + 20, summary["steps"]
    assert summary["optimizer_updates"] >= summary["steps"], summary["optimizer_updates"]
    assert summary["test_accuracy"] >= 0.8, summary["test_accuracy"]  # 2 epochs of SGD 0.01


def test_atomic_increments_give_keras_results_and_restore_keras():
    # One writer: the same numbers as Keras's own assign_add; the patch ends with the block.
    result = run_isolated(HERE / "atomic_increments_driver.py")
    assert result == {"mean": 3.0, "count": 6.0, "counter": -4, "restored": True}
