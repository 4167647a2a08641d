"""``mirrorfit bench``: which configuration is fastest on *this* machine, and by how much.

grid (the points, each in its own process, alternated and repeated) -> source (the data,
opened once here to check it) -> flops (model FLOPs and the measured matmul peak) -> report
(medians, speedup, efficiency, MFU; table, CSV, JSON, PNG).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from mirrorfit.bench.grid import DATA, Grid, run_grid
from mirrorfit.bench.point import Point
from mirrorfit.bench.report import Row, build_rows, recommend, table_text, write_outputs


def check_tolerance(tolerance: float) -> None:
    """MirrorfitError, one line, unless ``tolerance`` is an accuracy difference >= 0."""
    import math

    from mirrorfit.errors import MirrorfitError

    if not math.isfinite(tolerance) or tolerance < 0:
        raise MirrorfitError(
            f"--tolerance must be a finite accuracy difference >= 0, got "
            f"{tolerance}; e.g. --tolerance 0.005"
        )


def run_bench(
    grid: Grid,
    *,
    out_dir: str | Path,
    tolerance: float = 0.005,
    show_recommendation: bool = False,
    console: Console | None = None,
) -> dict:
    """Run ``grid``, print the table, write bench.csv/json/png to ``out_dir``; return the meta
    and rows."""
    from mirrorfit.bench.source import check_model_fits, open_source
    from mirrorfit.distribute._cpu_binding import usable_cpus
    from mirrorfit.engine import backends

    points = grid.points()  # checks the grid before anything is built
    # A source that cannot be read fails here, once. MNIST and synthetic data need no
    # framework: checked before one loads (TensorFlow's import alone takes seconds).
    source = open_source(grid, points[0]) if grid.data in DATA else None
    # This process counts the model's FLOPs and opens the data with the grid's first backend
    # (the CLI prepared it); each point runs in its own process on its own.
    engine = backends.load(grid.backends[0])
    from mirrorfit.models.build import model_factory

    # soft_wrap: a message is one line in a log (a long path wrapped at 80 columns split it)
    console = console or Console(stderr=True, soft_wrap=True)
    source = source or open_source(grid, points[0])
    shape, classes = source.input_shape, source.num_classes
    model = model_factory(grid.model, input_shape=shape, num_classes=classes)()
    check_model_fits(model, source, grid.model)
    if grid.backends[0] == "jax":  # XLA's cost analysis: no TensorFlow needed
        from mirrorfit.bench.jax_point import train_flops_per_example
    else:  # TensorFlow's op statistics
        from mirrorfit.bench.flops import train_flops_per_example
    flops = train_flops_per_example(model)
    gpus = [d for d in engine.list_devices() if d["type"] == "GPU"]
    devices = f"{len(gpus)} GPU(s)" if gpus else f"logical CPU devices on {usable_cpus()} CPU(s)"
    data = source.label
    if source.description != data:
        console.print(f"data: {escape(source.description)}")  # paths may hold [brackets]
    if not source.has_test and grid.data != "synthetic":
        console.print(
            f"--data {escape(grid.data)} has no test split: no test accuracy (shown "
            "as -), and --recommend compares speed only"
        )
    console.print(
        f"[bold]mirrorfit bench[/] {escape(grid.model)} on {escape(data)}: "
        f"{len(points)} points x "
        f"{grid.repeats} repeats, each its own process; {flops / 1e6:,.2f} MFLOP per "
        "training example"
    )
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("bench", total=1 + len(points) * grid.repeats)

        def on_run(point: Point, result: dict) -> None:
            progress.advance(task)
            if point.kind == "peak":
                return
            rate = result.get("examples_per_sec")
            acc = result.get("test_accuracy")
            console.print(
                f"  {point.label:28} "
                + (
                    f"{rate:10,.0f} examples/s" + (f"  acc {acc:.4f}" if acc is not None else "")
                    if rate
                    else f"FAILED: {escape(str(result.get('error')))}"
                )
            )

        peak, runs = run_grid(grid, on_run=on_run)
    rows = build_rows(runs, peak=peak, train_flops=flops, shared_cores=not gpus)
    meta = {
        "model": grid.model,
        "data": data,
        "data_description": source.description,
        "input_shape": list(shape),
        "num_classes": classes,
        "devices": devices,
        "repeats": grid.repeats,
        "train_flops_per_example": flops,
        "peak_flops": peak,
    }
    for backend, measured in peak.items():
        console.print(
            f"matmul peak measured in this run ({backend}): "
            + ", ".join(f"{k} {v / 1e9:,.0f} GFLOP/s" for k, v in measured.items())
        )
    if not gpus:
        console.print(
            "logical CPU devices share the same cores: the ideal speedup is 1.0, so "
            "efficiency = speedup"
        )
    print(table_text(rows), end="", flush=True)  # results on stdout, the rest on stderr
    if source.has_test or grid.data == "synthetic":
        advice = recommend(rows, tolerance)
    else:
        advice = recommend(
            rows,
            tolerance,
            no_accuracy=(
                f"--data {grid.data} has no test split: accuracy not compared; check the "
                "precision on data with one"
            ),
        )
    if show_recommendation:
        print(advice, flush=True)
    paths = write_outputs(rows, Path(out_dir), meta)
    console.print("wrote " + ", ".join(escape(str(p)) for p in paths.values()))
    return {**meta, "rows": rows, "recommendation": advice, "paths": paths}


__all__ = ["Grid", "Point", "Row", "check_tolerance", "run_bench"]
