"""The command-line surface: parse flags -> config -> call. Nothing else lives here.

argparse (standard library) gives exit code 2 and a usage line for malformed flags; our own
MirrorfitError gets the same exit code with one clear line.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from mirrorfit.errors import EXIT_USAGE, MirrorfitError


def _train_parser(sub) -> None:
    p = sub.add_parser("train", help="train a model data-parallel",
                       description="Train a Keras model data-parallel with mirrorfit's compiled "
                                   "multi-step loop. Flags override --config.")
    add = p.add_argument
    add("--config", help="TOML file with any of the settings below (flags override it)")
    add("--model", help="mlp (default), cnn, or package.module:function returning a Keras model")
    add("--dataset", help="data set (mnist)")
    add("--data-dir", help="folder holding mnist.npz (else $MIRRORFIT_DATA, the Keras cache)")
    add("--replicas", type=int, help="replicas; on a CPU-only host, logical CPU devices")
    add("--devices", help="comma-separated devices to replicate over, e.g. /gpu:0,/gpu:2")
    add("--visible-devices", help="GPU indices to use, like CUDA_VISIBLE_DEVICES (e.g. 0,1)")
    add("--no-memory-growth", dest="memory_growth", action="store_const", const=False,
        help="let TensorFlow take all GPU memory at start")
    add("--strategy", help="auto (default), single, mirrored, central-storage")
    add("--cross-device-ops", help="auto (default), nccl, hierarchical, reduce-to-one")
    add("--batch-size", type=int, help="examples per replica per step (default 32)")
    add("--global-batch-size", type=int, help="examples per step over all replicas (instead)")
    add("--epochs", type=int, help="epochs (default 10)")
    add("--optimizer", help="sgd (default), adam, adamw, rmsprop")
    add("--lr", type=float, help="learning rate (default 0.01)")
    add("--steps-per-execution", type=int, help="steps per compiled call (default 50)")
    add("--seed", type=int, help="seed for weights and data order (default 42)")
    add("--train-examples", type=int, help="train on the first N training examples")
    add("--eval-batch-size", type=int, help="global batch for evaluation")
    add("--metrics-out", help="write a JSON summary here")
    add("--no-progress", dest="progress", action="store_const", const=False,
        help="no progress bars")
    add("--checkpoint-dir", help="save step-exact checkpoints here; rerunning resumes")
    add("--checkpoint-every", type=int, help="also checkpoint every N steps (default: epoch "
        "ends only)")
    add("--keep-checkpoints", type=int, help="how many recent checkpoints to keep (default 3)")
    add("--fresh", action="store_const", const=True,
        help="move existing checkpoints aside and start over instead of resuming")
    _export_flags(add)
    add("--save-keras", help="also save the trained model as FILE.keras")


def _export_flags(add) -> None:
    add("--export-dir", help="write a SavedModel into the next version folder of models/NAME")
    add("--export-preprocessing", action="store_const", const=True,
        help="exported signature takes raw uint8 pixels and scales them itself")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mirrorfit", description=(
        "Data-parallel Keras training on 1..N devices, measured."))
    sub = parser.add_subparsers(dest="command", required=True)
    _train_parser(sub)
    sub.add_parser("devices", help="list the devices TensorFlow sees")
    exp = sub.add_parser("export", help="export the newest checkpoint as a SavedModel version")
    exp.add_argument("--checkpoint-dir", required=True)
    _export_flags(exp.add_argument)
    ev = sub.add_parser("evaluate", help="test accuracy and loss of a checkpoint or export")
    ev.add_argument("--checkpoint-dir")
    ev.add_argument("--saved-model", help="models/NAME (newest version) or models/NAME/0001")
    ev.add_argument("--data-dir")
    ev.add_argument("--metrics-out")
    return parser


def _cmd_train(args: argparse.Namespace) -> int:
    from mirrorfit.config import load_config
    from mirrorfit.train import run_training

    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    config = load_config(args.config, **overrides)
    run_training(config)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from mirrorfit.checkpoint import load_model
    from mirrorfit.export import export_saved_model

    if not args.export_dir:
        raise MirrorfitError("mirrorfit export needs --export-dir models/NAME")
    model, meta = load_model(args.checkpoint_dir)
    path = export_saved_model(model, args.export_dir, preprocessing=bool(args.export_preprocessing))
    print(f"exported step {meta['step']} of {args.checkpoint_dir} as {path}")
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from mirrorfit import _io
    from mirrorfit.evaluate import evaluate_artifact

    result = evaluate_artifact(checkpoint_dir=args.checkpoint_dir, saved_model=args.saved_model,
                               data_dir=args.data_dir)
    print(f"{result['source']}: test accuracy {result['test_accuracy']:.4f}, "
          f"loss {result['test_loss']:.4f} on {result['examples']} examples")
    if args.metrics_out:
        _io.write_json_atomic(args.metrics_out, result)
    return 0


def _cmd_devices(args: argparse.Namespace) -> int:
    from mirrorfit.devices import list_devices

    devices = list_devices()
    for d in devices:
        print(f"{d['type']:4} {d['name']} {d.get('model', '')}".rstrip())
    if not any(d["type"] == "GPU" for d in devices):
        print(f"no GPU: `--replicas N` splits the CPU into N logical devices that share the "
              f"same {os.cpu_count()} cores")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mirrorfit`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's C++ banner out of the way
    from mirrorfit.checkpoint import EXIT_PREEMPTED, Preempted

    commands = {"train": _cmd_train, "devices": _cmd_devices, "export": _cmd_export,
                "evaluate": _cmd_evaluate}
    try:
        return commands[args.command](args)
    except Preempted as e:
        print(f"mirrorfit: preempted by {e}", file=sys.stderr)
        return EXIT_PREEMPTED
    except MirrorfitError as e:
        print(f"mirrorfit: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("mirrorfit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

