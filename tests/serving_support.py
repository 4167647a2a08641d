"""Serving test support: real SavedModels on disk and a real `mirrorfit serve` process on
loopback. Test modules import the fixtures they use (``from serving_support import server``).

The server runs as a separate process, exactly as users start it; tests talk to it over HTTP
(httpx) and gRPC (tensorflow-serving-api's stubs).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import ROOT, _env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def export_mlp(base: Path, seed: int) -> Path:
    """A (briefly trained, so each seed predicts differently) MLP as the next version."""
    import keras
    import mirrorfit
    from mirrorfit.artifacts.export import export_saved_model

    keras.utils.set_random_seed(seed)
    model = mirrorfit.models.mlp()
    return export_saved_model(model, base)


@pytest.fixture(scope="session")
def model_root(tmp_path_factory) -> Path:
    """models/mnist (MLP, versions 1 and 2) and models/multi (all APIs), plus a config file."""
    root = tmp_path_factory.mktemp("models")
    for seed in (1, 2):
        export_mlp(root / "mnist", seed)
    from serving_multi_model import save  # loads TensorFlow: here, not at import

    save(str(root / "multi" / "7"))
    (root / "models.config").write_text(f"""
model_config_list {{
  config {{ name: 'mnist' base_path: '{root / "mnist"}' model_platform: 'tensorflow'
           model_version_policy {{ all {{}} }}
           version_labels {{ key: 'stable' value: 1 }}
           version_labels {{ key: 'canary' value: 2 }} }}
  config {{ name: 'multi' base_path: '{root / "multi"}' }}
}}
""")
    (root / "monitoring.config").write_text(
        'prometheus_config { enable: true, path: "/monitoring/prometheus/metrics" }\n'
    )
    return root


class Server:
    """A running `mirrorfit serve` process."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.port, self.rest_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.rest_port}"
        self.grpc_target = f"127.0.0.1:{self.port}"
        env = dict(_env(), PYTHONPATH=os.pathsep.join([str(ROOT / "src"), _env()["PYTHONPATH"]]))
        self.log = cwd / f"server-{self.port}.log"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mirrorfit.cli",
                "serve",
                f"--port={self.port}",
                f"--rest_api_port={self.rest_port}",
                *args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "w"),
            env=env,
            cwd=cwd,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"server not ready in 120 s:\n{self.logs()}")

    def logs(self) -> str:
        return self.log.read_text()[-5000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


@pytest.fixture(scope="module")
def server(model_root, tmp_path_factory):
    """One server for the module: both models, Prometheus on, no batching."""
    srv = Server(
        [
            f"--model_config_file={model_root / 'models.config'}",
            f"--monitoring_config_file={model_root / 'monitoring.config'}",
            "--max_request_bytes=1000000",
        ],
        tmp_path_factory.mktemp("srv"),
    )
    yield srv
    srv.stop()


def copy_version(src: Path, base: Path, version: int) -> Path:
    """Drop a version in the way a deployment does: copy aside, then rename into place."""
    tmp = base / f".incoming-{version}"
    shutil.copytree(src, tmp)
    final = base / f"{version:04d}"
    tmp.rename(final)
    return final
