"""cli.flags: what each command's parser turns flags into, without running the command (no
TensorFlow): train leaves every unset flag None, bench reads comma-separated grids, serve reads
TF Serving's boolean and compatibility flags."""

import pytest

from mirrorfit.cli.flags import build_parser
from mirrorfit.config import load_config


def _parse(*argv):
    return vars(build_parser().parse_args(list(argv)))


def test_train_flags_left_out_are_none_so_the_config_file_keeps_its_values(tmp_path):
    args = _parse("train")
    assert {k: v for k, v in args.items() if v is not None} == {"command": "train"}
    cfg = tmp_path / "run.toml"
    cfg.write_text("epochs = 7\nlr = 0.05\n")
    args = _parse("train", "--config", str(cfg), "--lr", "0.2")
    overrides = {k: v for k, v in args.items() if k not in ("command", "config")}
    config = load_config(args["config"], **overrides)
    assert (config.epochs, config.lr) == (7, 0.2)


def test_bench_grids_are_comma_separated():
    args = _parse(
        "bench",
        "--replicas",
        "1, 2,4",
        "--xla",
        "off,on",
        "--precision",
        "fp32,bf16",
        "--input-shape",
        "32,32,3",
    )
    assert args["replicas"] == (1, 2, 4)
    assert args["xla"] == (False, True)
    assert args["precisions"] == ("fp32", "bf16")
    assert args["input_shape"] == (32, 32, 3)
    defaults = _parse("bench")
    assert (defaults["replicas"], defaults["xla"], defaults["accum_steps"]) == (
        (1, 2),
        (False,),
        (1,),
    )


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--xla", "yes", "--xla 'yes': expected a comma-separated list of on/off values"),
        ("--accum-steps", "1,x", "--accum-steps '1,x': expected a comma-separated list of int"),
    ],
)
def test_bad_bench_grid_value_is_one_usage_line_exit_2(capsys, flag, value, needle):
    with pytest.raises(SystemExit) as exit_:
        _parse("bench", flag, value)
    assert exit_.value.code == 2
    assert needle in capsys.readouterr().err


def test_serve_takes_tf_serving_boolean_and_compatibility_flags(capsys):
    args = _parse(
        "serve",
        "--enable_batching",
        "--enable_model_warmup=false",
        "--rest_api_enable_cors_support=1",
        "--rest_api_num_threads=4",
    )
    assert (
        args["enable_batching"],
        args["enable_model_warmup"],
        args["rest_api_enable_cors_support"],
    ) == (True, False, True)
    # accepted so tensorflow_model_server command lines run, and kept apart from ServeConfig
    assert args["_ignored__rest_api_num_threads"] == "4"
    assert "rest_api_num_threads" not in args
    with pytest.raises(SystemExit) as exit_:
        _parse("serve", "--enable_batching=maybe")
    assert exit_.value.code == 2
    assert "expected true or false, got 'maybe'" in capsys.readouterr().err


def test_evaluate_takes_no_tfrecord_feature_flags(capsys):
    """TFRecord sources have no test split, so evaluate does not offer their feature flags."""
    assert _parse("evaluate", "--image-size", "32,32")["image_size"] == "32,32"
    with pytest.raises(SystemExit) as exit_:
        _parse("evaluate", "--image-feature", "img")
    assert exit_.value.code == 2
    assert "unrecognized arguments: --image-feature" in capsys.readouterr().err


def _train_actions():
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices["train"]._actions if a.dest not in ("help", "config", "verbose")]


def test_each_train_flag_is_a_setting_of_its_type_and_each_setting_a_flag():
    import dataclasses

    from mirrorfit.config import TrainConfig

    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    actions = _train_actions()
    assert {a.dest for a in actions} == set(fields)
    for action in actions:  # a number flag parses to the field's type (TOML checks the same)
        default = fields[action.dest].default
        if action.type is not None and default is not None:
            assert isinstance(default, action.type), action.dest


def test_no_train_help_writes_its_default_by_hand():
    """The help ends with the setting's default, added from TrainConfig (on main 30 helps
    wrote theirs, "(default 32)", beside config/sections.py's)."""
    from mirrorfit.cli.flags import config_default
    from mirrorfit.config import TrainConfig

    _assert_helps_end_with_defaults(_train_actions(), TrainConfig, config_default)


def _assert_helps_end_with_defaults(actions, source, shown_as) -> None:
    """Each flag's help ends with its field's default in ``source``, written nowhere else."""
    for action in actions:
        shown = shown_as(source.__dataclass_fields__[action.dest].default)
        if action.nargs == 0 or shown is None:
            continue
        assert action.help.endswith(f" (default {shown})"), action.dest
        assert "default" not in action.help.removesuffix(f" (default {shown})"), action.dest


def test_the_docs_table_of_train_flags_is_the_parsers():
    from pathlib import Path

    from mirrorfit.cli.flags import train_table

    docs = (Path(__file__).parents[2] / "docs" / "training.md").read_text(encoding="utf-8")
    start = docs.index("<!-- train flags: from mirrorfit.cli.flags.train_table -->\n")
    end = docs.index("<!-- end of train flags -->")
    held = docs[start:end].split("\n", 1)[1]
    assert held == train_table(), (
        "docs/training.md's table of train flags and the parser part; paste train_table()'s"
    )


def test_each_bench_flag_is_a_grid_field_with_its_default():
    """bench's flags are generated from mirrorfit.bench.Grid's fields (on main 24 flags
    restated their defaults, 9 of them twice more in their help): no flags give Grid()."""
    import argparse
    import dataclasses

    from mirrorfit.bench.grid import Grid
    from mirrorfit.cli.flags import _grid_default

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bench = sub.choices["bench"]
    results = {"help", "verbose", "out", "recommend", "tolerance"}
    actions = [a for a in bench._actions if a.dest not in results]
    names = {f.name for f in dataclasses.fields(Grid)}
    assert {a.dest for a in actions} == names - {"compiled"}  # set by run_bench, not a flag
    args = _parse("bench")
    assert Grid(**{n: args[n] for n in names - {"compiled"}}) == Grid()
    _assert_helps_end_with_defaults(actions, Grid, _grid_default)


def test_each_evaluate_flag_takes_its_default_from_evaluate_artifact():
    """evaluate's flags are evaluate_artifact's parameters (--metrics-out aside): their
    defaults are its (on main --data wrote "mnist" beside the function's)."""
    import inspect

    from mirrorfit.job.evaluate import evaluate_artifact

    parameters = inspect.signature(evaluate_artifact).parameters
    args = _parse("evaluate")
    flags = {k: v for k, v in args.items() if k not in ("command", "verbose", "metrics_out")}
    assert set(flags) <= set(parameters)
    assert flags == {name: parameters[name].default for name in flags}
    assert args["data"] == "mnist"
