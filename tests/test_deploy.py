"""The cluster docs against the code: every `mirrorfit train` / `mirrorfit launch` command line
in docs/multi-worker.md (the README's "More than one machine" links there) and in deploy/ parses
with the real CLI parser and passes the config checks `mirrorfit train` runs; every TF_CONFIG
there resolves; the SLURM, Kubernetes Job and TFJob layouts resolve to the clusters they claim.
Pure Python (no TensorFlow), under a second."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml  # PyYAML: in the [test] extra

from mirrorfit import cli
from mirrorfit.distribute.cluster import resolve_cluster
from mirrorfit.distribute.launch import check_launch_args

from conftest import mnist_folder

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DOC = ROOT / "docs" / "multi-worker.md"  # the README's "More than one machine" links here
# Values for the shell variables the scripts use (a command with any other fails the test).
SHELL_VARS = {"SLURM_CPUS_PER_TASK": "8", "SLURM_NTASKS": "2"}
# The cluster's shared MNIST folders: `mirrorfit train` checks that --data-dir holds mnist.npz
# before TensorFlow loads, so here they stand for this machine's copy (any other path fails).
CLUSTER_DATA = ("/shared/mirrorfit/data", "/shared/data")


def readme_section() -> str:
    """The reference on more than one machine (docs/multi-worker.md), which the README's
    section of that name links to."""
    assert "docs/multi-worker.md" in (ROOT / "README.md").read_text(encoding="utf-8")
    return DOC.read_text(encoding="utf-8")


def shell_blocks(markdown: str) -> list[str]:
    """Fenced sh/bash blocks and indented (4-space) code blocks of a Markdown text."""
    blocks = re.findall(r"```(?:sh|bash|console)\n(.*?)```", markdown, re.S)
    indented = re.findall(r"(?:^|\n\n)((?: {4}\S.*\n?)+)", markdown)
    return blocks + ["\n".join(line[4:] for line in b.splitlines()) for b in indented]


def command_lines(script: str) -> list[list[str]]:
    """Each `mirrorfit train|launch ...` in a shell text as argv after `mirrorfit`."""
    found = []
    script = script.replace("\\\n", " ")
    for line in script.splitlines():
        words = shlex.split(line, comments=True)
        for i, word in enumerate(words):
            if word == "mirrorfit" and words[i + 1 : i + 2] in (["train"], ["launch"]):
                argv = []
                for w in words[i + 1 :]:
                    if w in ("&&", "||", ";", "|"):
                        break
                    argv.append(_expand(w))
                found.append(argv)
                break
    return found


def _expand(word: str) -> str:
    def value(m):
        assert m.group(1) in SHELL_VARS, f"add ${m.group(1)} to SHELL_VARS in {__file__}"
        return SHELL_VARS[m.group(1)]

    return re.sub(r"\$\{?(\w+)\}?", value, word)


def check_command(argv: list[str]) -> None:
    """Parse as `mirrorfit ARGV` and validate as the CLI does before TensorFlow loads."""
    args = cli._parser().parse_args(argv)
    if args.command == "launch":
        inner = check_launch_args(args)
        assert inner[:3] == [sys.executable, "-m", "mirrorfit"], inner
        check_command(inner[3:])
        return
    assert args.command == "train"
    if args.data_dir and os.path.normpath(args.data_dir) in CLUSTER_DATA:
        args.data_dir = str(mnist_folder())
    cli.train_config(args)  # what _cmd_train does first


def yaml_docs(name: str) -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text(encoding="utf-8")))


def containers(doc: dict) -> list[tuple[str, dict]]:
    """(replica type or '', container) for a Job or a TFJob."""
    if doc["kind"] == "TFJob":
        return [
            (kind, c)
            for kind, spec in doc["spec"]["tfReplicaSpecs"].items()
            for c in spec["template"]["spec"]["containers"]
        ]
    if doc["kind"] == "Job":
        return [("", c) for c in doc["spec"]["template"]["spec"]["containers"]]
    return []


def container_argv(container: dict) -> list[str]:
    argv = list(container.get("command", [])) + list(container.get("args", []))
    assert argv[:2] in (["mirrorfit", "train"], ["mirrorfit", "launch"]), argv
    return argv[1:]


# -- README -------------------------------------------------------------------------------


def readme_commands() -> list[list[str]]:
    return [c for block in shell_blocks(readme_section()) for c in command_lines(block)]


def test_readme_section_has_the_commands_it_promises():
    commands = readme_commands()
    launches = [c for c in commands if c[0] == "launch"]
    assert any("--ps" in c for c in launches) and any("--max-restarts" in c for c in launches)
    assert any(c[0] == "train" and "multi-worker" in c for c in commands)
    assert [
        "launch",
        "--workers",
        "2",
        "--",
        "mirrorfit",
        "train",
        "--model",
        "cnn",
        "--strategy",
        "multi-worker",
        "--threads-per-worker",
        "1",
        "--checkpoint-dir",
        "ckpt",
    ] in commands  # the bench line


@pytest.mark.parametrize("argv", readme_commands(), ids=" ".join)
def test_readme_command_parses(argv):
    check_command(argv)


def test_readme_tf_configs_resolve():
    section = readme_section()
    values = re.findall(r"TF_CONFIG='(\{.*?\})'", section)
    values += re.findall(r"value: '(\{.*?\})'", section)  # the Job excerpt
    assert len(values) >= 2
    for value in values:
        cluster = resolve_cluster({"TF_CONFIG": value})
        assert cluster.num_workers == 2


def test_readme_yaml_excerpt_is_the_jobs_file():
    excerpt = re.findall(r"```yaml\n(.*?)```", readme_section(), re.S)
    assert len(excerpt) == 1
    pod = yaml.safe_load(excerpt[0])
    job = [d for d in yaml_docs("jobs.yaml") if d["kind"] == "Job"][1]["spec"]["template"]
    for key in ("hostname", "subdomain", "restartPolicy"):
        assert pod[key] == job["spec"][key]
    ours, theirs = pod["containers"][0], job["spec"]["containers"][0]
    assert ours["env"] == theirs["env"] and ours["image"] == theirs["image"]
    check_command(container_argv(ours))


# -- deploy/ ------------------------------------------------------------------------------


def test_slurm_script_commands_and_layout():
    script = (DEPLOY / "slurm" / "train.sbatch").read_text(encoding="utf-8")
    commands = command_lines(script)
    assert commands and all(c[0] == "train" and "multi-worker" in c for c in commands)
    for argv in commands:
        check_command(argv)
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", script, re.M))
    nodes, per_node = int(directives["nodes"]), int(directives["ntasks-per-node"])
    port_base = re.search(r"MIRRORFIT_SLURM_PORT_BASE=(\d+)", script).group(1)
    for rank in range(nodes * per_node):  # what srun gives each task
        env = {
            "SLURM_STEP_NUM_TASKS": str(nodes * per_node),
            "SLURM_PROCID": str(rank),
            "SLURM_STEP_NODELIST": f"node[1-{nodes}]",
            "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{nodes})",
            "MIRRORFIT_SLURM_PORT_BASE": port_base,
        }
        cluster = resolve_cluster(env)
        assert (cluster.num_workers, cluster.task_index, cluster.is_chief) == (
            nodes * per_node,
            rank,
            rank == 0,
        )
        assert cluster.workers[0] == f"node1:{port_base}"


def test_plain_jobs_with_a_headless_service():
    docs = yaml_docs("jobs.yaml")
    service = next(d for d in docs if d["kind"] == "Service")
    jobs = [d for d in docs if d["kind"] == "Job"]
    assert service["spec"]["clusterIP"] == "None"
    port = service["spec"]["ports"][0]["port"]
    clusters = []
    for job in jobs:
        pod = job["spec"]["template"]
        assert pod["metadata"]["labels"].items() >= service["spec"]["selector"].items()
        spec = pod["spec"]
        assert spec["subdomain"] == service["metadata"]["name"]
        ((kind, container),) = containers(job)
        check_command(container_argv(container))
        env = {e["name"]: e["value"] for e in container["env"]}
        cluster = resolve_cluster({"TF_CONFIG": env["TF_CONFIG"]})
        # this pod's own DNS name and port are its entry in TF_CONFIG
        me = f"{spec['hostname']}.{spec['subdomain']}:{port}"
        assert cluster.address("worker", cluster.task_index) == me
        assert job["metadata"]["name"].endswith(f"-{cluster.task_index}")
        assert {p["containerPort"] for p in container["ports"]} == {port}
        clusters.append(cluster)
    assert sorted(c.task_index for c in clusters) == list(range(len(jobs)))
    assert len({c.workers for c in clusters}) == 1 and len(clusters[0].workers) == len(jobs)


@pytest.mark.parametrize(
    "name, strategy", [("tfjob.yaml", "multi-worker"), ("tfjob-ps.yaml", "parameter-server")]
)
def test_tfjobs(name, strategy):
    (job,) = yaml_docs(name)
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "TFJob")
    replicas = job["spec"]["tfReplicaSpecs"]
    assert set(replicas) <= {"Chief", "Worker", "PS"}
    for _kind, container in containers(job):
        assert container["name"] == "tensorflow"  # where the operator puts TF_CONFIG
        argv = container_argv(container)
        check_command(argv)
        assert argv[argv.index("--strategy") + 1] == strategy
    # the TF_CONFIG the training operator writes: {job}-{type}-{i}.{namespace}.svc:2222
    jobs = {
        kind.lower(): [
            f"{job['metadata']['name']}-{kind.lower()}-{i}.default.svc:2222"
            for i in range(spec["replicas"])
        ]
        for kind, spec in replicas.items()
    }
    tasks = [
        resolve_cluster(
            {"TF_CONFIG": json.dumps({"cluster": jobs, "task": {"type": kind, "index": i}})}
        )
        for kind, addresses in jobs.items()
        for i in range(len(addresses))
    ]
    assert {c.mode for c in tasks} == {strategy}
    assert sum(c.is_chief for c in tasks) == 1


def test_storage_is_shared():
    (claim,) = yaml_docs("storage.yaml")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for name in ("jobs.yaml", "tfjob.yaml", "tfjob-ps.yaml"):
        text = (DEPLOY / "kubernetes" / name).read_text(encoding="utf-8")
        assert f"claimName: {claim['metadata']['name']}" in text
