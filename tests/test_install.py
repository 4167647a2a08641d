"""What each extra of pyproject.toml installs (docs/install.md), read from the installed
packages' own metadata, as pip resolves it: `.[jax]` brings no TensorFlow, `.[tensorflow]` no
JAX, the base neither, nor the server or the plot. The test environment has every extra
installed (`.[test]` holds `.[all]`), so the walk reaches every package an extra pulls in."""

from __future__ import annotations

from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

FRAMEWORKS = {"tensorflow", "tensorflow-cpu", "tensorflow-intel", "tf-keras", "jax", "jaxlib"}
SERVING = {"tensorflow-serving-api", "starlette", "uvicorn", "prometheus-client"}


def installs(name: str, extras: tuple[str, ...] = ()) -> set[str]:
    """Every distribution ``pip install name[extras]`` installs, ``name`` included."""
    seen: set[tuple[str, frozenset]] = set()
    todo = [(name, frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        key = (canonicalize_name(name), wanted)
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:  # a marker kept it off this platform
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or any(
                req.marker.evaluate({"extra": e}) for e in (wanted or {""})
            ):
                todo.append((req.name, frozenset(req.extras)))
    return {name for name, _ in seen}


def test_the_walk_sees_what_the_test_extra_brings():
    everything = installs("mirrorfit", ("test",))
    assert {"tensorflow", "jax", "keras", "starlette", "matplotlib", "pytest"} <= everything


@pytest.mark.parametrize(
    "extras,absent",
    [
        ((), FRAMEWORKS | SERVING | {"matplotlib", "orbax-checkpoint"}),
        (("jax",), {"tensorflow", "tensorflow-cpu", "tf-keras", "tensorflow-serving-api"}),
        (("tensorflow",), {"jax", "jaxlib", "orbax-checkpoint"} | SERVING),
        (("bench",), FRAMEWORKS),
    ],
)
def test_an_extra_brings_only_its_own(extras, absent):
    got = installs("mirrorfit", extras)
    assert "keras" in got
    assert not got & absent, sorted(got & absent)


def test_each_engine_extra_brings_its_framework():
    assert {"jax", "jaxlib", "orbax-checkpoint"} <= installs("mirrorfit", ("jax",))
    assert "tensorflow" in installs("mirrorfit", ("tensorflow",))
    assert {"tensorflow", "tensorflow-serving-api", "uvicorn"} <= installs("mirrorfit", ("serve",))


@pytest.mark.parametrize(
    "args,blocked,said",
    [
        (
            ("train", "--backend", "jax", "--epochs", "1"),
            ("jax",),
            "--backend jax needs JAX: pip install 'mirrorfit[jax]'",
        ),
        (  # JAX without jaxlib: its ImportError names no module
            ("train", "--backend", "jax", "--epochs", "1"),
            ("jaxlib",),
            "--backend jax needs JAX: pip install 'mirrorfit[jax]'",
        ),
        (
            (
                "train",
                "--backend",
                "jax",
                "--epochs",
                "1",
                "--train-examples",
                "256",
                "--logdir",
                "{tmp}/tb",
            ),
            ("tensorboard",),
            "--logdir writes TensorBoard scalars with the tensorboard package, which is not "
            "installed: pip install 'mirrorfit[jax]'",
        ),
        (
            ("serve", "--model_base_path", "{tmp}", "--model_name", "m", "--port", "0"),
            ("starlette", "uvicorn"),
            "mirrorfit serve needs starlette, uvicorn, not installed: "
            "pip install 'mirrorfit[serve]'",
        ),
        (
            ("bench", "--backend", "jax", "--replicas", "1", "--epochs", "2", "--out", "{tmp}/b"),
            ("matplotlib",),
            "mirrorfit bench draws its plot with matplotlib, which is not "
            "installed: pip install 'mirrorfit[bench]'",
        ),
    ],
)
def test_a_command_without_its_extra_names_it_in_one_line(args, blocked, said, tmp_path):
    from conftest import run_cli

    (tmp_path / "1").mkdir()
    proc = run_cli(*(a.replace("{tmp}", str(tmp_path)) for a in args), without=blocked, timeout=120)
    # one error line (--logdir's comes after the start screen), no traceback
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "error" in ln]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[0].startswith(f"mirrorfit: error: {said}"), lines[0]
    assert not (tmp_path / "b").exists()
