"""engine.tensorflow.parameter_server (loops): parameter-server training with real processes on
loopback.

(The product path, `mirrorfit launch --ps 1 -- mirrorfit train --strategy parameter-server`,
reaching 95% on MNIST, is in tests/distribute/test_parameter_server.py.)

benchmarks/ps_mnist.py starts 1 ps + 2 workers as subprocesses and runs the chief
(ParameterServerStrategy + ClusterCoordinator, Keras 3 model and optimizer, the engine's
ReplicaStep scheduled by coordinated_loops); each test reads its JSON summary.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_isolated

HERE = Path(__file__).parent

SCRIPT = ROOT / "benchmarks" / "ps_mnist.py"


def _run_ps_mnist(mnist_dir, *args: str, timeout: float = 240) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", MIRRORFIT_DATA=str(mnist_dir))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--data-dir", str(mnist_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise AssertionError(f"ps_mnist.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_killed_worker_s_closure_is_retried(mnist_dir):
    # Worker 1 is SIGKILLed 0.3 s into the run from step 100 (mid-closure) and started again;
    # the coordinator puts its closure back and another worker runs it, so training finishes
    # with every step the chief scheduled (plus the killed closure's partial steps, re-run).
    result = _run_ps_mnist(
        mnist_dir,
        "--epochs",
        "1",
        "--train-examples",
        "25600",
        "--kill-worker-at-step",
        "100",
        "--restart-after",
        "0.5",
    )
    assert result["worker_killed"]
    assert result["steps"] == 25600 // 128
    assert result["optimizer_iterations"] >= result["steps"]
    assert result["finite_weights"]
    assert result["test_accuracy"] >= 0.85, result
    assert not any(_alive(pid) for pid in result["task_pids"])


def test_atomic_increments_give_keras_results_and_restore_keras():
    # One writer: the same numbers as Keras's own assign_add; the patch ends with the block.
    result = run_isolated(HERE / "atomic_increments_driver.py")
    assert result == {"mean": 3.0, "count": 6.0, "counter": -4, "restored": True}
