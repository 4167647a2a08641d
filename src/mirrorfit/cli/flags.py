"""The command line's flags: one argparse parser per command (train, devices, export, bench,
serve, launch, evaluate) and their help text; what each command does with them is in
cli/__init__.py. Standard library only: ``mirrorfit --help`` and a malformed flag (argparse:
usage line, exit 2) must not wait for TensorFlow to load.
"""

from __future__ import annotations

import argparse
import dataclasses

from mirrorfit.serving.settings import ServeConfig


class _FromConfig:
    """A group's ``add_argument`` for ``train``: each flag a TrainConfig field (its dest), its
    help ending with the field's default, so no default is written twice (tests/cli/
    test_flags.py refuses a help that says it by hand)."""

    def __init__(self, group) -> None:
        self._add = group.add_argument

    def __call__(self, *names: str, help: str, **kwargs):
        from mirrorfit.config import TrainConfig

        dest = kwargs.get("dest") or names[0].lstrip("-").replace("-", "_")
        field = TrainConfig.__dataclass_fields__[dest]  # KeyError: a flag with no setting
        shown = config_default(field.default)
        if kwargs.get("action") != "store_const" and shown is not None:
            help = f"{help} (default {shown})"
        return self._add(*names, help=help, **kwargs)


class _FromGrid:
    """A group's ``add_argument`` for ``bench``: each flag a field of :class:`mirrorfit.bench.
    Grid` (its dest), its default the field's, its help ending with it as a grid is written
    (``1,2``; ``off``), so no default is written twice."""

    def __init__(self, group) -> None:
        self._add = group.add_argument

    def __call__(self, *names: str, help: str, **kwargs):
        from mirrorfit.bench.grid import Grid

        flag = names[0].lstrip("-").replace("-", "_")
        dest = kwargs.setdefault("dest", flag)
        default = Grid.__dataclass_fields__[dest].default  # KeyError: a flag with no field
        kwargs["default"] = default
        shown = _grid_default(default)
        if kwargs.get("action") is None:
            kwargs.setdefault("metavar", flag.upper())  # the flag's name, not the field's
            if shown is not None:
                help = f"{help} (default {shown})"
        return self._add(*names, help=help, **kwargs)


class _FromSignature:
    """An ``add_argument`` whose flags are parameters of ``fn`` (``evaluate``'s of
    :func:`mirrorfit.job.evaluate.evaluate_artifact`): each one's default the
    parameter's, its help ending with it."""

    def __init__(self, add, fn) -> None:
        import inspect

        self._add, self._parameters = add, inspect.signature(fn).parameters

    def __call__(self, *names: str, help: str, **kwargs):
        dest = kwargs.get("dest") or names[0].lstrip("-").replace("-", "_")
        default = self._parameters[dest].default  # KeyError: a flag with no parameter
        shown = config_default(default)
        help = help if shown is None else f"{help} (default {shown})"
        return self._add(*names, help=help, default=default, **kwargs)


def _grid_default(value) -> str | None:
    """A grid field's default as its flag is written: ``1,2``, ``off``; None: not shown."""
    if isinstance(value, (tuple, list)):
        return ",".join(("on" if v else "off") if isinstance(v, bool) else str(v) for v in value)
    return config_default(value)


def config_default(value) -> str | None:
    """A setting's default as help and docs show it; None: nothing to show (unset, off)."""
    if value is None or value is False or value == ():
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def train_table() -> str:
    """The Markdown table of every ``mirrorfit train`` flag with its default and help, by
    group, as docs/training.md holds it (tests/cli/test_flags.py compares the two)."""
    from mirrorfit.config import TrainConfig

    parser = argparse.ArgumentParser(prog="mirrorfit")
    _train_parser(parser.add_subparsers())
    train = parser._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    rows = ["| flag | section | default | what it sets |", "| --- | --- | --- | --- |"]
    for group in train._action_groups[2:]:  # after positionals and options: the sections
        for action in group._group_actions:
            field = TrainConfig.__dataclass_fields__[action.dest]
            shown = config_default(field.default) if action.nargs != 0 else None
            help = (action.help or "").replace(f" (default {shown})", "").replace("|", "\\|")
            flags = ", ".join(f"`{name}`" for name in action.option_strings)
            rows.append(f"| {flags} | {group.title} | {shown or ''} | {help} |")
    return "\n".join(rows) + "\n"


def _train_parser(sub) -> None:
    """The train command: its flags grouped by the sections of TrainConfig."""
    p = sub.add_parser(
        "train",
        help="train a model data-parallel",
        description="Train a Keras model data-parallel with mirrorfit's compiled "
        "multi-step loop. Flags override --config.",
    )
    p.add_argument("--config", help="TOML file with any of the settings below (flags override it)")
    _verbose(p.add_argument)
    # One group per section of TrainConfig (config/sections.py); the model and data first.
    _train_model(p.add_argument_group("model", "the model and its loss"))
    data = _FromConfig(p.add_argument_group("data", "what it trains on"))
    _train_data_source(data)
    _train_data_shape(data)
    _train_distribution(p.add_argument_group("distribution", "where and how it runs"))
    _train_optimisation(
        p.add_argument_group(
            "optimisation", "batches, steps, optimizer, learning rate, precision, XLA, seed"
        )
    )
    _train_checkpoints(p.add_argument_group("checkpoints", "saving and resuming"))
    _train_outputs(p.add_argument_group("outputs", "what the run writes and reports"))


def _train_distribution(group) -> None:
    """train's DistributionSettings flags: engine, devices, strategy and processes."""
    add = _FromConfig(group)
    add(
        "--backend",
        help="tensorflow or jax (default: $KERAS_BACKEND, else tensorflow): the engine "
        "that trains (Keras 3 on that framework)",
    )
    add("--replicas", type=int, help="replicas; on a CPU-only host, logical CPU devices")
    add("--devices", help="comma-separated devices to replicate over, e.g. /gpu:0,/gpu:2")
    add("--visible-devices", help="GPU indices to use, like CUDA_VISIBLE_DEVICES (e.g. 0,1)")
    add(
        "--no-memory-growth",
        dest="memory_growth",
        action="store_const",
        const=False,
        help="let TensorFlow take all GPU memory at start",
    )
    add(
        "--strategy",
        help="auto, single, mirrored, central-storage, multi-worker "
        "(one replica set per process; TF_CONFIG, SLURM or `mirrorfit launch`), "
        "parameter-server",
    )
    add("--cross-device-ops", help="auto, nccl, hierarchical, reduce-to-one")
    add("--communication", help="multi-worker all-reduce: auto, ring, nccl")
    add(
        "--threads-per-worker",
        type=int,
        help="TensorFlow threads of this process (intra- and "
        "inter-op pools); with N workers on one host, cores / N",
    )
    add(
        "--collective-timeout",
        type=float,
        help="seconds to wait for the other workers, at "
        "start-up and in every all-reduce, before naming the one missing",
    )
    _train_memory(add)


def _train_memory(add) -> None:
    """train's GPU memory cap and state sharding (DistributionSettings too)."""
    add("--gpu-memory-limit", type=int, help="cap each GPU at MB (instead of memory growth)")
    add(
        "--shard",
        help="JAX: none (every device holds the whole state), optimizer "
        "(ZeRO-1: the optimizer state split over the devices) or all (FSDP: the weights too)",
    )
    add(
        "--model-parallel",
        type=int,
        help="JAX, a compiled --model: split each weight over N devices (a divisor of "
        "--replicas), a 2-D mesh of replicas/N data groups (--shard then splits over the data "
        "groups too)",
    )
    add(
        "--sync-batchnorm",
        action="store_const",
        const=True,
        help="BatchNormalization's batch statistics over the global batch (every replica's "
        "share), as on one device, not over each replica's",
    )


def _train_data_source(add) -> None:
    """train's DataSettings flags that name the data and how files are read."""
    add(
        "--data",
        help="training data: mnist, synthetic, FILE.npz (x_train, y_train; "
        "optional x_val/y_val, x_test/y_test), an image FOLDER (one subfolder per class), "
        "'train-*.tfrecord' (tf.train.Example; quote the pattern) or package.module:function",
    )
    add("--dataset", help="older name of --data (mnist)")
    add(
        "--data-dir",
        help="--data mnist: folder holding mnist.npz, or the file (else "
        "$MIRRORFIT_DATA, the Keras cache ~/.keras/datasets, a download)",
    )
    add(
        "--image-size",
        help="image folders and TFRecords: resize every image to H,W pixels "
        "(default: keep the images' size, which must then be the same for all)",
    )
    add(
        "--image-feature",
        help="TFRecords: feature holding the encoded PNG/JPEG image",
    )
    add("--label-feature", help="TFRecords: feature holding the int64 class label")


def _train_data_shape(add) -> None:
    """train's DataSettings flags for splits, caching, shapes and example counts."""
    add(
        "--validation-split",
        type=float,
        help="hold out this fraction of the training "
        "examples for validation (drawn with --seed) when the source has no validation split",
    )
    add(
        "--cache",
        help="image folders, TFRecords, dataset functions: decode once and keep "
        "the examples in memory, or in this folder (created; reused by later runs)",
    )
    add(
        "--input-shape",
        help="one example's shape, e.g. 224,224,3: of --data synthetic, and "
        "of the model (keras.applications names); file data brings its own",
    )
    add(
        "--num-classes",
        type=int,
        help="classes (the model's outputs); default: from the data "
        "(class folders, or the largest label + 1)",
    )
    add(
        "--train-examples",
        type=int,
        help="train on the first N training examples (of an "
        "image folder, whose files are sorted by class: N drawn with --seed)",
    )


def _train_optimisation(group) -> None:
    """train's OptimisationSettings flags: batches, steps, optimizer, precision, seed."""
    add = _FromConfig(group)
    add("--batch-size", type=int, help="examples per replica per step")
    add("--global-batch-size", type=int, help="examples per step over all replicas (instead)")
    add("--epochs", type=int, help="epochs")
    add("--optimizer", help="sgd, adam, adamw, rmsprop")
    add("--lr", type=float, help="learning rate")
    add("--steps-per-execution", type=int, help="steps per compiled call")
    add(
        "--accum-steps",
        type=int,
        help="micro-batches per replica per optimizer step; the "
        "effective global batch is batch x replicas x K",
    )
    add("--precision", help="fp32, bf16 or fp16 (dynamic loss scaling)")
    add(
        "--xla",
        action="store_const",
        const=True,
        help="compile each replica's forward/backward pass with XLA",
    )
    add("--lr-scaling", help="none or linear: lr x global batch / --base-batch")
    add("--base-batch", type=int, help="global batch --lr was chosen for")
    add("--warmup-epochs", type=float, help="linear learning-rate warm-up epochs")
    add("--seed", type=int, help="seed for weights and data order")
    add("--eval-batch-size", type=int, help="global batch for evaluation")
    _allow_nan(add)


def _train_checkpoints(group) -> None:
    """train's CheckpointSettings flags: where, how often, how many, or start over."""
    add = _FromConfig(group)
    add("--checkpoint-dir", help="save step-exact checkpoints here; rerunning resumes")
    add(
        "--checkpoint-every",
        type=int,
        help="also checkpoint every N steps (0: at epoch ends only)",
    )
    add("--keep-checkpoints", type=int, help="how many recent checkpoints to keep")
    add(
        "--fresh",
        action="store_const",
        const=True,
        help="move existing checkpoints aside and start over instead of resuming",
    )


def _train_model(group) -> None:
    """train's ModelSettings flags: the model, its loss, metrics, callbacks and remat."""
    add = _FromConfig(group)
    add("--model", help="mlp, cnn, or package.module:function returning a Keras model")
    add(
        "--loss",
        help="a Keras loss (mse, binary_crossentropy, ...) for an uncompiled --model "
        "function; a compiled model trains its compile()'s",
    )
    add("--metrics", help="comma-separated Keras metrics, with --loss")
    add(
        "--callbacks",
        help="package.module:function returning a list of Keras callbacks "
        "(a --model function's run)",
    )
    add(
        "--remat",
        action="store_const",
        const=True,
        help="recompute activations in the backward pass (less memory, more compute)",
    )


def _train_outputs(group) -> None:
    """train's OutputSettings flags: logs, summary, progress bars, export and saved model."""
    add = _FromConfig(group)
    add("--logdir", help="write TensorBoard scalars here")
    add("--metrics-out", help="write a JSON summary here")
    add(
        "--no-progress", dest="progress", action="store_const", const=False, help="no progress bars"
    )
    add(
        "--profile",
        action="store_const",
        const=True,
        help="after training, report where step time goes and a one-line diagnosis",
    )
    _export_flags(add)
    add("--save-keras", help="also save the trained model as FILE.keras")


def _verbose(add) -> None:
    add(
        "--verbose",
        "-v",
        action="store_const",
        const=True,
        help="show TensorFlow's/XLA's own log (C++ INFO, WARNING and ERROR lines, gRPC's): "
        "hidden unless this or TF_CPP_MIN_LOG_LEVEL asks for them",
    )


def _source_flags(add, *, records: bool = True) -> None:
    """The flags that shape a file source, for bench and evaluate (train has its own help);
    ``records``: the TFRecord features too (evaluate has no use for them: TFRecord sources
    have no test split)."""
    add(
        "--image-size",
        help="image folders and TFRecords: resize every image to H,W pixels, "
        "as in training (default: the images' own size)",
    )
    if not records:
        return
    add("--image-feature", help="TFRecords: feature holding the encoded PNG/JPEG image")
    add("--label-feature", help="TFRecords: feature holding the int64 class label")


def _export_flags(add) -> None:
    add("--export-dir", help="write a SavedModel into the next version folder of models/NAME")
    add(
        "--export-preprocessing",
        action="store_const",
        const=True,
        help="exported signature takes raw uint8 pixels and scales them itself",
    )


def _allow_nan(add) -> None:
    add(
        "--allow-nan",
        action="store_const",
        const=True,
        help="train on through a NaN or infinite loss, as Keras's fit does, and save and "
        "export non-finite weights (default: stop the run, exit 65, and refuse them)",
    )


def _csv(kind, name: str):
    """An argparse type for comma-separated lists, naming the flag when a value is bad."""

    def parse(text: str) -> tuple:
        try:
            return tuple(kind(v.strip()) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} {text!r}: expected a comma-separated list of {kind.__name__} values"
            ) from None

    return parse


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise ValueError(text)
    return text == "on"


_on_off.__name__ = "on/off"


def _flag_bool(text: str) -> bool:
    """TF Serving's boolean flags: --flag, --flag=true, --flag=false."""
    value = text.lower()
    if value not in ("true", "false", "1", "0"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value in ("true", "1")


def _bool_flags(add, flags) -> None:
    """TF Serving's boolean flags (--flag, --flag=true, --flag=false), from (flag, help) pairs."""
    for flag, text in flags:
        add(flag, type=_flag_bool, nargs="?", const=True, help=text)


def _serve_parser(sub) -> None:
    """The serve command: tensorflow_model_server's flags, with ServeConfig's defaults."""
    p = sub.add_parser(
        "serve",
        help="serve SavedModels with TF Serving's REST and gRPC APIs",
        description="A TensorFlow-Serving-compatible model server. Takes "
        "tensorflow_model_server's flag names.",
    )
    _verbose(p.add_argument)
    _serve_network(p.add_argument_group("network", "where it listens"))
    _serve_models(p.add_argument_group("models", "what it serves and how versions load"))
    _serve_batching(p.add_argument_group("batching", "merging requests into batches"))
    _serve_limits(p.add_argument_group("limits", "how much clients can ask for and hold"))
    _serve_runtime(p.add_argument_group("runtime", "logs, metrics, event loop and threads"))
    _serve_ignored(p.add_argument)
    # The defaults are ServeConfig's: written once, there.
    p.set_defaults(
        **{
            f.name: f.default
            for f in dataclasses.fields(ServeConfig)
            if f.name != "shutdown_grace_seconds"
        }
    )


def _serve_network(group) -> None:
    """serve's ports, address and CORS."""
    add = group.add_argument
    add("--port", type=int, help="gRPC port (8500)")
    add("--rest_api_port", type=int, help="REST port (8501; 0 turns REST off)")
    add("--host", help="address to bind (127.0.0.1; 0.0.0.0 for all)")
    _bool_flags(add, [("--rest_api_enable_cors_support", "send CORS headers")])


def _serve_models(group) -> None:
    """serve's models: where they are, polling for versions, warm-up and load retries."""
    add = group.add_argument
    add("--model_name", help="name of the model (default)")
    add("--model_base_path", help="folder of numeric version folders (0001, 0002, ...)")
    add("--model_config_file", help="text-format ModelServerConfig for several models")
    add(
        "--file_system_poll_wait_seconds",
        type=float,
        help="seconds between polls for new versions (1; 0: once; < 0: never)",
    )
    add(
        "--model_config_file_poll_wait_seconds",
        type=float,
        help="seconds between re-reads of --model_config_file: models added, removed, changed "
        "(0: read once); a bad file keeps the last good config",
    )
    _bool_flags(
        add,
        [
            ("--enable_model_warmup", "warm new versions up before they take traffic"),
            (
                "--servable_versions_always_present",
                "a base path with no versions keeps the loaded ones (default: unloads them), "
                "and start-up or a config reload fails while a model has none",
            ),
        ],
    )
    add(
        "--max_num_load_retries",
        type=int,
        help="retries of a failed version load after the first attempt (5)",
    )
    add("--load_retry_interval_micros", type=int, help="microseconds between load retries (60 s)")
    add("--saved_model_tags")


def _serve_batching(group) -> None:
    """serve's request batching."""
    add = group.add_argument
    _bool_flags(add, [("--enable_batching", "merge concurrent requests into batches")])
    add("--batching_parameters_file", help="text-format BatchingParameters")


def _serve_limits(group) -> None:
    """serve's bounds on requests and on what clients can hold (docs/serving.md, its flags)."""
    add = group.add_argument
    add("--rest_api_timeout_in_ms", type=int)
    add(
        "--grpc_max_threads",
        type=int,
        help="gRPC requests in progress at once; more get RESOURCE_EXHAUSTED (64)",
    )
    add(
        "--max_request_bytes",
        type=int,
        help="largest REST body (larger gets 413) or gRPC message (RESOURCE_EXHAUSTED) "
        "accepted (64 MiB)",
    )
    add("--max_rows_per_request", type=int, help="most rows (examples) in one request (1000)")
    add(
        "--max_unbatched_in_flight",
        type=int,
        help="unbatched model calls running or waiting; more get 503 / UNAVAILABLE (64)",
    )
    _serve_rest_limits(add)


def _serve_rest_limits(add) -> None:
    """serve's bounds on REST connections: how many, their timeouts, their buffered bytes."""
    add(
        "--rest_api_max_connections",
        type=int,
        help="open REST connections; a request beyond them gets 503 (500)",
    )
    add(
        "--rest_api_keepalive_timeout_in_ms",
        type=int,
        help="idle keep-alive REST connections are closed after this (5000)",
    )
    add(
        "--rest_api_header_timeout_in_ms",
        type=int,
        help="time to send a request's headers, from connecting or the last response (10000)",
    )
    add(
        "--rest_api_body_timeout_in_ms",
        type=int,
        help="time to send a request's body; slower gets 408 (60000)",
    )
    add(
        "--rest_api_max_buffered_bytes",
        type=int,
        help="request-body bytes held by all REST requests at once; more gets 503 (256 MiB)",
    )


def _serve_runtime(group) -> None:
    """serve's monitoring, log level, HTTP parser, event loop and TensorFlow threads."""
    add = group.add_argument
    add("--monitoring_config_file", help="text-format MonitoringConfig (Prometheus path)")
    add(
        "--rest_api_http_impl",
        choices=["auto", "h11", "httptools"],
        help="HTTP parser (auto: httptools when installed)",
    )
    add(
        "--event_loop",
        choices=["auto", "asyncio", "uvloop"],
        help="event loop of REST and gRPC (auto: uvloop when installed)",
    )
    add("--log_level", choices=["debug", "info", "warning", "error"])
    add(
        "--tensorflow_intra_op_parallelism",
        type=int,
        help="threads per op (0: TensorFlow's default)",
    )
    add(
        "--tensorflow_inter_op_parallelism",
        type=int,
        help="ops run at once (0: TensorFlow's default)",
    )


def _serve_ignored(add) -> None:
    """tensorflow_model_server flags accepted so its command lines run; hidden, no effect."""
    for flag in (
        "--rest_api_num_threads",
        "--tensorflow_session_parallelism",
        "--enable_signature_method_name_check",
        "--allow_version_labels_for_unavailable_models",
        "--xla_cpu_compilation_enabled",
    ):
        add(flag, dest=f"_ignored{flag.replace('-', '_')}", help=argparse.SUPPRESS)


def _bench_parser(sub) -> None:
    """The bench command: the workload, the grid's axes, the runs and the results. Each flag
    but the results' is a field of :class:`mirrorfit.bench.Grid`, with its default."""
    p = sub.add_parser(
        "bench",
        help="measure a grid of configurations, each in its own process",
        description="Throughput, scaling efficiency, MFU and accuracy for a grid "
        "of configurations, plus the textbook recipe (Keras fit "
        "under MirroredStrategy); medians of alternated repeats.",
    )
    _verbose(p.add_argument)
    workload = _FromGrid(p.add_argument_group("model and data", "what every point trains"))
    _bench_model_data(workload)
    _bench_source(workload)
    _bench_grid(
        _FromGrid(p.add_argument_group("grid", "comma-separated lists: one point per combination"))
    )
    _bench_runs(_FromGrid(p.add_argument_group("runs", "how long and how often each point runs")))
    _bench_textbook(
        _FromGrid(p.add_argument_group("textbook recipe", "the yardstick rows: Keras fit"))
    )
    _bench_results(p.add_argument_group("results", "where they go and what they recommend"))


def _bench_model_data(add) -> None:
    """bench's model and data source, and the shape and classes of synthetic data."""
    add(
        "--model",
        help="mlp, cnn, a keras.applications name "
        "(ResNet50, MobileNetV2, ...; random weights) or package.module:function",
    )
    add(
        "--data",
        help="mnist, synthetic (random batches made "
        "once and repeated, so no input pipeline limits the figures), or any --data of "
        "`mirrorfit train`: FILE.npz, an image FOLDER, 'train-*.tfrecord' (quote the pattern), "
        "package.module:function; mirrorfit's rows read the images as `mirrorfit train` does "
        "(decoded once), the textbook's its tf.data pipeline, and test accuracy comes from "
        "its test split (none: shown as -)",
    )
    add(
        "--input-shape",
        type=_csv(int, "--input-shape"),
        help="--data synthetic: one example's shape, e.g. 224,224,3 (default: the model's); "
        "other sources bring their own",
    )
    add(
        "--num-classes",
        type=int,
        help="--data synthetic: classes (default: the model's); "
        "other sources: as `mirrorfit train --num-classes` (default: from the data)",
    )


def _bench_source(add) -> None:
    """bench's flags for reading the data: where MNIST is, file sources, split and cache."""
    add("--data-dir", help="folder holding mnist.npz")
    _source_flags(add)
    add(
        "--validation-split",
        type=float,
        help="as `mirrorfit train`: hold out this fraction "
        "of the training examples (drawn with the seed); they are not trained on",
    )
    add(
        "--cache",
        help="as `mirrorfit train`: image folders, TFRecords, dataset functions "
        "decoded once, in memory or in this folder (filled once, before the points run)",
    )


def _bench_grid(add) -> None:
    """bench's grid axes: engines, replicas, precisions, XLA, accumulation, steps per call."""
    add(
        "--backend",
        dest="backends",
        type=_csv(str, "--backend"),
        help="engines to compare: tensorflow, jax, or tensorflow,jax (each with "
        "Keras's own fit on it as the yardstick rows)",
    )
    add("--replicas", type=_csv(int, "--replicas"), help="replica counts, e.g. 1,2,4")
    add(
        "--precision",
        dest="precisions",
        type=_csv(str, "--precision"),
        help="precisions, e.g. fp32,bf16,fp16",
    )
    add("--xla", type=_csv(_on_off, "--xla"), help="off, on, or off,on")
    add("--accum-steps", type=_csv(int, "--accum-steps"), help="micro-batches, e.g. 1,4")
    add(
        "--steps-per-execution",
        type=_csv(int, "--steps-per-execution"),
        help="optimizer steps per compiled call, e.g. 10,50",
    )


def _bench_runs(add) -> None:
    """bench's global batch, training examples, epochs and repeats of each point."""
    add(
        "--global-batch-size",
        dest="global_batch",
        type=int,
        help="effective global batch (default: mlp 64, cnn 100; synthetic data 32)",
    )
    add(
        "--train-examples",
        type=int,
        help="training images (default: mlp all, cnn 12,800; "
        "synthetic data: examples per epoch, 160)",
    )
    add("--epochs", type=int, help="epochs per run, >= 2 (default: mlp 3, cnn 2)")
    add("--repeats", type=int, help="runs per point")


def _bench_textbook(add) -> None:
    """bench's textbook recipe rows (Keras fit under MirroredStrategy): whether, and precisions."""
    add(
        "--no-textbook",
        dest="textbook",
        action="store_false",
        help="leave out the textbook recipe rows",
    )
    add(
        "--textbook-precision",
        dest="textbook_precisions",
        type=_csv(str, "--textbook-precision"),
        help="precisions for the textbook rows (e.g. fp32,bf16 to see what Keras's own "
        "mixed precision does under fit)",
    )


def _bench_results(group) -> None:
    """bench's output folder and its recommendation within an accuracy tolerance."""
    from mirrorfit.bench.report import RESULTS, TOLERANCE

    add = group.add_argument
    add(
        "--out",
        default=RESULTS,
        help=f"folder for bench.csv, bench.json, bench.png (default {RESULTS})",
    )
    add(
        "--recommend",
        action="store_true",
        help="name the fastest configuration whose accuracy stays within --tolerance of float32",
    )
    add(
        "--tolerance",
        type=float,
        default=TOLERANCE,
        help=f"accuracy tolerance (default {TOLERANCE})",
    )


_USER_MODEL_HELP = (
    "the checkpoint's package.module:function model, to allow importing it "
    "(a checkpoint alone never picks code to run)"
)


def build_parser() -> argparse.ArgumentParser:
    """The ``mirrorfit`` parser with every command's subparser."""
    parser = argparse.ArgumentParser(
        prog="mirrorfit", description=("Data-parallel Keras training on 1..N devices, measured.")
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _train_parser(sub)
    dev = sub.add_parser("devices", help="list the devices TensorFlow (or JAX) sees")
    dev.add_argument(
        "--backend", help="tensorflow or jax (default: $KERAS_BACKEND, else tensorflow)"
    )
    _verbose(dev.add_argument)
    exp = sub.add_parser("export", help="export the newest checkpoint as a SavedModel version")
    exp.add_argument("--checkpoint-dir", required=True)
    _verbose(exp.add_argument)
    exp.add_argument("--model", help=_USER_MODEL_HELP)
    _export_flags(exp.add_argument)
    _allow_nan(exp.add_argument)
    _bench_parser(sub)
    _serve_parser(sub)
    from mirrorfit.distribute.launch import add_launch_parser  # standard library only

    add_launch_parser(sub)
    _evaluate_parser(sub)
    return parser


def _evaluate_parser(sub) -> None:
    """The evaluate command: each flag but --metrics-out a parameter of evaluate_artifact,
    with its default."""
    from mirrorfit.job.evaluate import evaluate_artifact  # standard library only

    ev = sub.add_parser("evaluate", help="test accuracy and loss of a checkpoint or export")
    add = _FromSignature(ev.add_argument, evaluate_artifact)
    add("--checkpoint-dir", help="the training run's checkpoint folder (its newest step)")
    _verbose(ev.add_argument)
    add("--model", help=_USER_MODEL_HELP)
    add("--saved-model", help="models/NAME (newest version) or models/NAME/0001")
    add(
        "--data",
        help="test data: mnist, FILE.npz "
        "with x_test/y_test, an image FOLDER with a test/ subfolder (one subfolder "
        "per class), or package.module:function returning a test split",
    )
    add("--data-dir", help="--data mnist: folder holding mnist.npz, or the file")
    _source_flags(add, records=False)
    ev.add_argument("--metrics-out", help="write the figures to this JSON file")
