"""The command-line surface: parse flags -> config -> call. Nothing else lives here.

The flags themselves (one parser per command) are in flags.py; this module runs the
command they name. argparse (standard library) gives exit code 2 and a usage line for malformed
flags; our own MirrorfitError gets the same exit code with one clear line.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
import os
from pathlib import Path
import sys
import time
import unicodedata
from typing import Sequence

# _parser: the name tests and tools import the whole parser by (test_docker, test_deploy)
from mirrorfit.cli.flags import build_parser as _parser
from mirrorfit.engine import backends
from mirrorfit.errors import EXIT_USAGE, MirrorfitError


def train_config(args: argparse.Namespace):
    """The TrainConfig of `mirrorfit train`'s flags (and --config's file), checked."""
    from mirrorfit.config import load_config

    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "config", "verbose")}
    return load_config(args.config, **overrides)


def _cmd_train(args: argparse.Namespace) -> int:
    from mirrorfit.job.checks import check_run

    config = train_config(args)  # before the training stack loads
    backends.prepare(config.backend, verbose=args.verbose)
    cluster = check_run(config)  # TF_CONFIG / SLURM, the outputs, the port: before it loads too
    from mirrorfit.job.preemption import PreemptionGuard

    with PreemptionGuard() as guard:  # a signal while TensorFlow loads is honoured too
        startup, t0 = _since_process_start(), time.perf_counter()
        backends.import_framework(config.backend)
        from mirrorfit.job.train import run_training

        run_training(
            config,
            guard=guard,
            cluster=cluster,
            timings={"startup": startup, "framework": round(time.perf_counter() - t0, 3)},
        )
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from mirrorfit.bench import Grid, check_tolerance, run_bench

    check_tolerance(args.tolerance)
    # each flag's dest is a field of Grid (cli/flags.py: _FromGrid)
    grid = Grid(**{f.name: getattr(args, f.name) for f in fields(Grid) if hasattr(args, f.name)})
    # model, data, shape, batch and epoch problems are reported before anything runs
    grid.points()
    if "tensorflow" in grid.backends and not backends.installed("tensorflow"):
        raise MirrorfitError(
            "bench --backend tensorflow needs TensorFlow, which is not "
            f"installed: {backends.install_hint('tensorflow')}, or bench "
            "--backend jax alone"
        )
    if not backends.installed("matplotlib"):  # the plot, written after every point has run
        raise MirrorfitError(
            "mirrorfit bench draws its plot with matplotlib, which is not "
            f"installed: {backends.install_hint('bench')}"
        )
    backends.prepare(grid.backends[0], verbose=args.verbose)  # what this process loads
    run_bench(grid, out_dir=args.out, tolerance=args.tolerance, show_recommendation=args.recommend)
    return 0


# what mirrorfit serve imports beside TensorFlow: (the package's name, its module)
_SERVE_PACKAGES = (
    ("tensorflow-serving-api", "tensorflow_serving"),
    ("grpcio", "grpc"),
    ("starlette", "starlette"),
    ("uvicorn", "uvicorn"),
    ("prometheus-client", "prometheus_client"),
)


def _cmd_serve(args: argparse.Namespace) -> int:
    from mirrorfit.serving.settings import ServeConfig, model_configs

    missing = [name for name, module in _SERVE_PACKAGES if not backends.installed(module)]
    if missing:
        raise MirrorfitError(
            f"mirrorfit serve needs {', '.join(missing)}, not installed: "
            f"{backends.install_hint('serve')}"
        )
    values = {
        k: v
        for k, v in vars(args).items()
        if k not in ("command", "verbose") and not k.startswith("_ignored")
    }
    config = ServeConfig(**values)  # checked: before TensorFlow loads, a bad flag fails at once
    model_configs(config)  # and a bad config file, or a model without versions
    backends.import_tensorflow("mirrorfit serve (it loads TensorFlow SavedModels)", extra="serve")
    from mirrorfit.serving.server import serve

    return serve(config)


def _cmd_export(args: argparse.Namespace) -> int:
    from mirrorfit.artifacts.checkpoint_meta import require_checkpoints
    from mirrorfit.artifacts.output_paths import check_export_dir

    if not args.export_dir:
        raise MirrorfitError("mirrorfit export needs --export-dir models/NAME")
    if not args.checkpoint_dir:  # "" would be the current folder
        raise MirrorfitError(
            "mirrorfit export needs --checkpoint-dir DIR, the folder training "
            "wrote its checkpoints to; it is empty"
        )
    check_export_dir(args.export_dir)  # before TensorFlow loads and the model with it
    require_checkpoints(args.checkpoint_dir)
    backends.import_tensorflow("mirrorfit export (it writes a TensorFlow SavedModel)")
    from mirrorfit.artifacts.checkpoint_model import load_model, position_of
    from mirrorfit.artifacts.export import export_keras_model, export_saved_model
    from mirrorfit.artifacts.finite import refuse_non_finite
    from mirrorfit.engine.jax import read_split_state

    model, meta = load_model(args.checkpoint_dir, read_split=read_split_state, model=args.model)
    where = f"{position_of(meta)} of {args.checkpoint_dir}"
    refuse_non_finite(model, where, allow=bool(args.allow_nan))
    if not _built_in_checkpoint(args.checkpoint_dir, args.model):  # as Keras exports it
        if args.export_preprocessing:
            raise MirrorfitError(
                "--export-preprocessing does not apply to a compiled --model's checkpoint: "
                "the export takes the inputs as the model trained on them; put the scaling "
                "in the model (a keras.layers.Rescaling layer)"
            )
        path = export_keras_model(model, args.export_dir)
        print(f"exported {where} as {path}")
        return 0
    shapes = meta.get("shapes") or {}
    if shapes.get("inputs"):  # a subclassed model: exported on the input it trained on
        from mirrorfit.models.build import with_inputs

        model = with_inputs(model, tuple(shapes["inputs"][0][1:]))
    names = meta.get("class_names")  # absent in checkpoints of older versions
    if names is not None and not (
        isinstance(names, list) and names and all(isinstance(n, str) for n in names)
    ):
        raise MirrorfitError(
            f"{args.checkpoint_dir}: meta.json's class_names is "
            f"{str(names)[:60]}, not a list of names; restore the file"
        )
    path = export_saved_model(
        model, args.export_dir, preprocessing=bool(args.export_preprocessing), class_names=names
    )
    print(f"exported {where} as {path}")
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from mirrorfit import _io
    from mirrorfit.artifacts.checkpoint_meta import require_checkpoints
    from mirrorfit.job.evaluate import check_evaluate_flags
    from mirrorfit.artifacts.output_paths import check_output_file

    flags = dict(
        checkpoint_dir=args.checkpoint_dir,
        saved_model=args.saved_model,
        data=args.data,
        data_dir=args.data_dir,
        image_size=args.image_size,
    )
    config = check_evaluate_flags(**flags)  # before TensorFlow loads: a bad flag fails at once
    check_output_file("--metrics-out", args.metrics_out)  # not after scoring it all
    checkpoint = bool(args.checkpoint_dir)  # else a SavedModel
    if checkpoint:
        require_checkpoints(args.checkpoint_dir)  # one line before TensorFlow loads
    # a built-in model's (mlp, cnn) is scored as the built-in models are, a user's by its compile
    compiled = checkpoint and not _built_in_checkpoint(args.checkpoint_dir, args.model)
    backends.prepare(
        _scored_on(args.checkpoint_dir) if checkpoint else "tensorflow", verbose=args.verbose
    )
    backends.import_tensorflow("mirrorfit evaluate")
    on = "" if args.data == "mnist" else f" of --data {args.data}"
    if compiled:  # a compiled --model's
        from mirrorfit.job.evaluate_compiled import evaluate_checkpoint

        from mirrorfit.job.evaluate import EVAL_BATCH

        result = evaluate_checkpoint(config, args.checkpoint_dir, args.model, EVAL_BATCH)
        figures = ", ".join(
            f"{k.removeprefix('test_')} {v:.4f}" for k, v in result.items() if k.startswith("test_")
        )
        print(f"{result['source']}: test {figures} on {result['examples']} examples{on}")
    else:
        from mirrorfit.job.evaluate import evaluate_artifact

        result = evaluate_artifact(**flags, model=args.model)
        print(
            f"{result['source']}: test accuracy {result['test_accuracy']:.4f}, "
            f"loss {result['test_loss']:.4f} on {result['examples']} examples{on}"
        )
    if args.metrics_out:
        _io.write_json_atomic(args.metrics_out, result)
    return 0


def _built_in_checkpoint(checkpoint_dir: str, model: str | None) -> bool:
    """Whether mirrorfit.fit's checkpoints in ``checkpoint_dir`` are of a model mirrorfit
    train built (mlp, cnn: trained on [0, 1] pixels; ``--model`` must name the same one) or
    compiled as it does its own (a user's uncompiled one), as meta.json records it."""
    from mirrorfit.artifacts.epoch_checkpoint import recorded_built_in, recorded_default_compile

    folder = Path(checkpoint_dir)
    built_in = recorded_built_in(folder) is not None and (model is None or ":" not in model)
    return built_in or recorded_default_compile(folder)


def _scored_on(checkpoint_dir: str) -> str:
    """The backend a compiled model's checkpoints are scored on: the one that trained them
    (its loss is the backend's own: a saturated softmax's crossentropy is clipped on JAX,
    exact on TensorFlow), else TensorFlow (a checkpoint written before it was recorded)."""
    from mirrorfit.artifacts.epoch_checkpoint import recorded_backend

    backend = recorded_backend(Path(checkpoint_dir))
    if backend is None:
        return "tensorflow"
    if backend not in backends.BACKENDS:
        raise MirrorfitError(
            f"{checkpoint_dir}: meta.json names the backend {backend[:40]!r}, not one of "
            f"{', '.join(backends.BACKENDS)}; restore the file"
        )
    return backend


def _cmd_launch(args: argparse.Namespace) -> int:
    from mirrorfit.distribute.launch import run_launch

    return run_launch(args)


def _cmd_devices(args: argparse.Namespace) -> int:
    from mirrorfit.distribute._cpu_binding import usable_cpus

    backend = backends.resolve(args.backend)
    backends.prepare(backend, verbose=args.verbose)
    devices = backends.load(backend).list_devices()
    for d in devices:
        print(f"{d['type']:4} {d['name']} {d.get('model', '')}".rstrip())
    if not any(d["type"] == "GPU" for d in devices):
        print(
            f"no GPU: `--replicas N` splits the CPU into N logical devices that share the "
            f"same {usable_cpus()} CPU(s) this process may run on"
        )
    return 0


def _since_process_start() -> float | None:
    """Seconds (to 10 ms) from this process's start to now (Python, mirrorfit's CLI, the flag
    checks), from Linux's clock ticks since boot (not psutil's create_time:
    docs/benchmarks.md#figures-behind-the-code); None where /proc does not say.
    """
    try:
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        with open("/proc/self/stat", encoding="ascii") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        return round(uptime - started / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, ValueError, IndexError):
        return None


def _one_line(text: str) -> str:
    """``text`` with control characters and line separators escaped as repr() writes them
    (a newline as \\n): a value the user gave (a folder name) must not split the error line."""
    return "".join(
        repr(c)[1:-1] if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c for c in text
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mirrorfit`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.command not in ("train", "devices", "bench", "launch", "evaluate"):  # those choose one
        # TensorFlow's C++ log (and Keras's backend) are set when it loads, so nothing
        # imported above may import it (the package's names load lazily for this reason).
        backends.prepare("tensorflow", verbose=args.verbose)
    from mirrorfit.job.preemption import EXIT_PREEMPTED, Preempted

    commands = {
        "train": _cmd_train,
        "devices": _cmd_devices,
        "export": _cmd_export,
        "evaluate": _cmd_evaluate,
        "bench": _cmd_bench,
        "serve": _cmd_serve,
        "launch": _cmd_launch,
    }
    try:
        return commands[args.command](args)
    except Preempted as e:
        print(f"mirrorfit: preempted by {e}", file=sys.stderr)
        return EXIT_PREEMPTED
    except MirrorfitError as e:
        print(f"mirrorfit: error: {_one_line(str(e))}", file=sys.stderr)
        return getattr(e, "exit_code", EXIT_USAGE)
    except KeyboardInterrupt:
        print("mirrorfit: interrupted", file=sys.stderr)
        return 130


# Commands whose process ends once main() returns, and whose every output is written (and
# fsynced) by then: they exit without the interpreter's teardown (TensorFlow's threads and
# objects; its cost: docs/benchmarks.md#figures-behind-the-code). Not `serve` nor `launch`, and
# not a task of a cluster, whose peers may still be talking to it.
_FAST_EXIT = ("train", "evaluate", "export", "devices")


def run() -> None:
    """The ``mirrorfit`` console script and ``python -m mirrorfit``: :func:`main`, then exit
    (at once, after flushing, for a command of ``_FAST_EXIT`` outside a cluster)."""
    argv = sys.argv[1:]
    code = main(argv)
    if argv and argv[0] in _FAST_EXIT and (not _in_cluster() or _failed_task_of_a_job(code)):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _failed_task_of_a_job(code: int) -> bool:
    """A task of a job that failed, not preempted, on an engine that asks for an exit past the
    teardown (JAX's client would wait at its shutdown barrier for every peer, a dead one too):
    exiting at once, its peers see it gone at once."""
    from mirrorfit.job.preemption import EXIT_PREEMPTED

    return code not in (0, EXIT_PREEMPTED) and any(e.in_job() for e in backends.loaded())


def _in_cluster() -> bool:
    from mirrorfit.distribute.cluster import resolve_cluster

    try:
        return resolve_cluster() is not None
    except MirrorfitError:
        return True  # a malformed cluster: the careful way out


if __name__ == "__main__":
    run()
