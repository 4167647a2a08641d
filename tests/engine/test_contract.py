"""Both engines provide what engine/contract.py types: every method and attribute of its
Protocols, on each engine's package, distribution, fit module, runners and split state's
checkpoint files (a third engine is held to the same list)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest

from mirrorfit.engine import backends, contract
from mirrorfit.errors import ConfigError

# Per engine: its distribution class, and its split state's checkpoint files' class (None: the
# engine never splits the state; Keras's save_weights writes it whole).
CLASSES = {
    "tensorflow": ("mirrorfit.engine.tensorflow.distribution:Distribution", None),
    "jax": ("mirrorfit.engine.jax.placement:Placement", "mirrorfit.engine.jax.fit_state:FitState"),
}


def _load(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _members(protocol) -> set[str]:
    """The names a Protocol asks for: its annotations, methods and properties."""
    own = {n for n in vars(protocol) if not n.startswith("_")}
    return own | set(getattr(protocol, "__annotations__", {}))


def _provides(cls, name: str) -> bool:
    """A class attribute, method or property, a dataclass field, or set in its __init__."""
    if hasattr(cls, name):
        return True
    if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
        return True
    return f"self.{name} =" in inspect.getsource(cls) or f"self.{name}," in inspect.getsource(cls)


def test_the_table_names_every_engine():
    assert set(backends.ENGINES) == set(backends.BACKENDS) == set(CLASSES)


@pytest.mark.parametrize("backend", sorted(CLASSES))
def test_each_engine_provides_the_contract(backend):
    package = importlib.import_module(backends.ENGINES[backend])
    for name in _members(contract.Engine):
        assert hasattr(package, name), f"{backend}: the package has no {name}"
    for protocol, spec in zip((contract.Distribution, contract.CheckpointState), CLASSES[backend]):
        if spec is None:
            assert not backends.capabilities(backend).splits_state
            continue
        cls = _load(spec)
        missing = sorted(n for n in _members(protocol) if not _provides(cls, n))
        assert not missing, f"{spec} lacks {missing} of {protocol.__name__}"


FIT_RUNNERS = {
    "tensorflow": ("mirrorfit.engine.tensorflow.keras_fit:Runner",),
    "jax": (
        "mirrorfit.engine.jax.keras_fit:Runner",
        "mirrorfit.engine.jax.keras_override:OverrideRunner",
    ),
}


@pytest.mark.parametrize("backend", sorted(FIT_RUNNERS))
def test_each_engine_provides_mirrorfit_fits_contract(backend):
    """The same at run time for what mirrorfit.fit drives (mypy checks the signatures: each
    engine's __init__ assigns its keras_fit module to a FitEngine and its runners to
    type[FitRunner], and CI's mypy reads those files)."""
    fit = importlib.import_module(f"{backends.ENGINES[backend]}.keras_fit")
    for name in _members(contract.FitEngine):
        assert hasattr(fit, name), f"{backend}: keras_fit has no {name}"
    for spec in FIT_RUNNERS[backend]:
        cls = _load(spec)
        missing = sorted(n for n in _members(contract.FitRunner) if not _provides(cls, n))
        assert not missing, f"{spec} lacks {missing} of FitRunner"


def test_each_engine_declares_its_capabilities_without_a_framework():
    from conftest import _python

    for backend in backends.BACKENDS:
        can = backends.capabilities(backend)
        assert isinstance(can, contract.Capabilities) and "auto" in can.strategies
    # Reading the declarations loads no framework (the settings check runs before one): a
    # fresh interpreter, as the test is about what an import loads.
    proc = _python(
        [
            "-c",
            "import sys; from mirrorfit.engine import backends; "
            "[backends.check_settings(b, shard='all') for b in ('jax',)]; "
            "[backends.capabilities(b) for b in backends.BACKENDS]; "
            "print(sorted(m for m in ('tensorflow', 'jax', 'keras') if m in sys.modules))",
        ],
        timeout=120,
        fresh=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_the_settings_check_reads_the_engines_declaration(monkeypatch):
    package = importlib.import_module(backends.ENGINES["tensorflow"])
    backends.check_settings("tensorflow", strategy="parameter-server", export_dir="m")
    narrower = dataclasses.replace(
        package.CAPABILITIES, strategies=("auto",), exports_saved_model=False
    )
    monkeypatch.setattr(package, "CAPABILITIES", narrower)
    with pytest.raises(ConfigError, match="--export-dir writes a TensorFlow SavedModel"):
        backends.check_settings("tensorflow", export_dir="m")
    with pytest.raises(ConfigError, match="--strategy parameter-server needs") as e:
        backends.check_settings("tensorflow", strategy="parameter-server")
    assert "with --backend tensorflow use --strategy auto" in str(e.value)
    # no engine runs it now: the message offers none
    assert "--backend jax" not in str(e.value)
