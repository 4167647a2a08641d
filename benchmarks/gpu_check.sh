#!/usr/bin/env bash
# The JAX engine on a GPU machine that has JAX (with CUDA) but no TensorFlow and no network,
# in one call of under 8 minutes: the tests that need a GPU, the MLP and the CNN trained on
# MNIST to their usual accuracy, and ResNet50 as a user compiles it (tests/keras_models.py:
# resnet50), trained as compiled through mirrorfit.fit in bf16 on synthetic data at a batch
# that fills the chip beside Keras's own JAX fit of the same model in bf16 (examples/s, MFU against the bf16 matmul peak measured in
# the same run), the share of step time spent waiting for input, and --shard on 2+ GPUs.
#
# What the machine lacks travels with the tree, in folders git ignores (.gitignore):
#   .whl/       wheels for Python 3.12: mirrorfit's base install (pyproject.toml's
#               dependencies, no extra: the machine's JAX is the engine) as pip resolves it,
#               and pytest, less the binary packages the machine has (NumPy, h5py, ml-dtypes)
#   .gpu-data/  mnist.npz
# Make them here, on a machine with network (and MNIST where mirrorfit finds it):
#   bash benchmarks/gpu_check.sh --prepare
# Then, on the GPU machine (the device tool: carry .whl and .gpu-data; $OUT gets the results):
#   bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prepare" ]; then
    set -e
    rm -rf .whl && mkdir -p .whl/self .gpu-data
    python3 -m pip wheel -q --no-deps -w .whl/self .
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d .whl .whl/self/mirrorfit-*.whl pytest
    rm -rf .whl/self .whl/mirrorfit-*.whl .whl/numpy-* .whl/h5py-* .whl/ml_dtypes-*
    PYTHONPATH=src python3 - <<'EOF'
import shutil
from mirrorfit.data.mnist import locate_mnist
shutil.copy(locate_mnist(download=True), ".gpu-data/mnist.npz")
EOF
    ls .whl && du -sh .whl .gpu-data
    exit 0
fi

OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
SITE=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl || exit 1
export PYTHONPATH="$SITE:$PWD/src:$PWD/tests" MIRRORFIT_DATA="$PWD/.gpu-data" KERAS_BACKEND=jax
export PYTHONUNBUFFERED=1
python3 -c "import jax, keras; print('jax', jax.__version__, jax.devices(), '| keras', keras.__version__)" \
    | tee "$OUT/versions.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/versions.txt"

echo "== the tests that need a GPU, and the engine's step (no TensorFlow here)"
timeout 240 python3 -m pytest -q -o addopts="" -p no:cacheprovider \
    tests/engine/jax/test_jax_gpu.py tests/engine/jax/test_jax_step.py 2>&1 | tail -15 \
    | tee "$OUT/tests.txt"

echo "== the chapter's MLP and CNN on MNIST"
timeout 120 python3 -m mirrorfit train --backend jax --no-progress \
    --metrics-out "$OUT/mlp.json" 2>&1 | tail -3
timeout 180 python3 -m mirrorfit train --backend jax --model cnn --epochs 5 \
    --global-batch-size 256 --lr-scaling linear --warmup-epochs 1 --no-progress \
    --metrics-out "$OUT/cnn.json" 2>&1 | tail -3

echo "== a compiled ResNet50, bf16, synthetic 224x224x3: mirrorfit.fit vs Keras's own JAX fit"
timeout 300 python3 -m mirrorfit bench --backend jax --model keras_models:resnet50 \
    --data synthetic --input-shape 224,224,3 --num-classes 1000 --precision bf16 \
    --textbook-precision bf16 --replicas 1 \
    --global-batch-size 512 --train-examples 10240 --epochs 2 --repeats 1 \
    --out "$OUT/resnet50" 2>&1 | tail -12

echo "== --shard: examples/s and state per device, none/optimizer/all/Keras ModelParallel"
GPUS=$(python3 -c "import jax; print(jax.device_count())")
if [ "$GPUS" -ge 2 ]; then
    timeout 150 python3 benchmarks/sharding.py --replicas "$GPUS" --width 4096 \
        --examples 8192 --batch 512 --repeats 3 --models mlp 2>&1 | tail -8 \
        | tee "$OUT/sharding.txt"
else  # one device: --shard has nothing to split (the state is the same bytes)
    echo "one device: --shard has nothing to split; skipped" | tee "$OUT/sharding.txt"
fi

python3 - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for name in ("mlp", "cnn"):
    try:
        s = json.loads((out / f"{name}.json").read_text())
    except OSError:
        print(f"{name}: no result"); continue
    print(f"{name}: test accuracy {s['test_accuracy']:.4f}, {s['train_examples_per_sec']:,.0f} "
          f"examples/s steady, input wait {s.get('input_wait_share', 0):.1%} of the steps, "
          f"devices {s['devices']}")
try:
    bench = json.loads((out / "resnet50" / "bench.json").read_text())
    keras_fit = [r["examples_per_sec"] for r in bench["rows"] if "keras fit" in r["label"]]
    for row in bench["rows"]:
        mfu = f"{row['mfu']:.1%}" if row["mfu"] else "-"
        rate = row["examples_per_sec"] or 0
        vs = f", {rate / keras_fit[0]:.2f}x Keras's own fit" if keras_fit and keras_fit[0] else ""
        print(f"ResNet50 {row['label']}: {rate:,.0f} examples/s, MFU {mfu}{vs}")
    print("bf16 matmul peak measured:", f"{bench['peak_flops']['jax']['bfloat16'] / 1e12:.0f}",
          "TFLOP/s")
except (OSError, KeyError) as e:
    print("ResNet50: no result", e)
EOF
