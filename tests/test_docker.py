"""docker/: the Dockerfiles and the compose file agree with the CLI (no Docker engine runs
here, so they are parsed and every mirrorfit command line in them is checked by the real
argument parser)."""

from pathlib import Path

import pytest
import yaml

from mirrorfit.cli import _parser

DOCKER = Path(__file__).resolve().parents[1] / "docker"


def _instructions(name):
    text = (DOCKER / name).read_text().replace("\\\n", " ")
    return [
        line.split(None, 1)
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _json_list(value):
    import json

    return json.loads(value)


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfiles_install_the_package_and_run_a_valid_command(name):
    steps = _instructions(name)
    kinds = [k for k, _ in steps]
    assert kinds[0] == "FROM" and "ENTRYPOINT" in kinds and "CMD" in kinds
    # the extra with TensorFlow (training, export) and the server: the image serves too
    assert any(k == "RUN" and 'pip install ".[serve]"' in v for k, v in steps)
    assert any(k == "COPY" and v.split()[0] == "pyproject.toml" for k, v in steps)
    entry = _json_list(dict(steps)["ENTRYPOINT"])
    cmd = _json_list(dict(steps)["CMD"])
    assert entry == ["mirrorfit"]
    args = _parser().parse_args(cmd)  # exits (fails the test) on an unknown flag
    assert args.command == "train" and args.data_dir == "/data"
    assert args.export_dir.startswith("/models/")
    if name.endswith("gpu"):
        assert dict(steps)["FROM"].startswith("tensorflow/tensorflow:2.21.0-gpu")


def test_compose_trains_on_gpus_and_serves_the_exports_two_ways():
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    services = compose["services"]
    trainer, tfs, ours = services["trainer"], services["tf-serving"], services["mirrorfit-serve"]

    train = _parser().parse_args(trainer["command"])
    assert train.command == "train"
    gpu = trainer["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    assert "CUDA_VISIBLE_DEVICES" in trainer["environment"]
    export_host = next(v.split(":")[0] for v in trainer["volumes"] if v.split(":")[1] == "/models")
    assert train.export_dir == "/models/mnist"

    # the real TF Serving reads /models/${MODEL_NAME} = the trainer's export folder
    assert tfs["image"].startswith("tensorflow/serving:")
    assert {"8500:8500", "8501:8501"} <= set(tfs["ports"])
    name = tfs["environment"]["MODEL_NAME"]
    host, container = tfs["volumes"][0].split(":")[:2]
    assert container == f"/models/{name}" and host == f"{export_host}/{name}"

    # mirrorfit serve takes the same flags and the same folder
    serve = _parser().parse_args(ours["command"])
    assert serve.command == "serve" and serve.model_name == name
    assert serve.host == "0.0.0.0"  # inside a container, to be reachable through the port map
    mounted = {v.split(":")[1]: v.split(":")[0] for v in ours["volumes"]}
    assert mounted[serve.model_base_path] == f"{export_host}/{name}"
    published = {p.split(":")[1] for p in ours["ports"]}
    assert {str(serve.port), str(serve.rest_api_port)} == published
