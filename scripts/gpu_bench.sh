#!/usr/bin/env bash
# Run `specd bench` on a CUDA machine and leave the results under $OUT.
#
# The GPU machine is bare: it has python3 with torch, transformers, accelerate, pluggy,
# tqdm, psutil and matplotlib, but not specd, not the `gguf` package and not the model, and
# nothing can be downloaded there. What travels with one call is limited (64 MiB), and the
# default model's GGUF file is 98 MB, so it travels in two parts over two calls to the same
# warm machine. Three steps:
#
#   scripts/gpu_bench.sh prepare           here: fill gpu-carry/ (git-ignored through
#                                          .git/info/exclude) with the GGUF in two parts
#                                          (part-aa, part-ab) and base/: the gguf wheel, the
#                                          GGUF's checksum, the model's config and tokenizer
#   scripts/gpu_bench.sh receive part-aa   there, once per part (carry gpu-carry/part-aa,
#                                          then gpu-carry/part-ab): keep it in /tmp/specd-gpu
#   scripts/gpu_bench.sh run               there (carry gpu-carry/base): install specd,
#                                          rebuild the model, run the identity tests and
#                                          the benchmarks into $OUT
#   scripts/gpu_bench.sh collect DIR        here: copy what came back (DIR: the run's
#                                          files_at) into docs/benchmarks-gpu/DATE/
#
# Each call must reach the machine while it is still warm from the previous one, or the
# staged parts are gone; `run` then says so and stops.
#
# `run` reads: OUT (required), DEVICE (cuda), LIMIT (16 editor prompts), CONFIGS (default:
# every applicable configuration), MODEL (default smollm2-135m; a local model directory
# needs no staging), RANDOM_WEIGHTS=1 (nothing staged: the default model's shape with random
# weights — floor, step and plain-decoding figures hold; acceptance and the speedups of
# speculation then mean nothing).
#
# The compiled step is on (--compile on: CUDA graphs, one per cache buffer and padded draft
# size); COMPILE=off measures eager instead. Each step has its own time limit, so the whole
# run stays under 10 minutes: identity tests 120 s, bfloat16 bench 240 s, float32 bench
# 180 s.
#
# What comes back (at most 9 files): identity.txt (the compiled step against the eager one
# and greedy identity, pytest on CUDA), editor-bf16.{json,md,png}, editor-f32.{json,md}
# (the token-identical rate in float32), env.txt (GPU, driver, versions, plugins) and
# log.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

STAGE=/tmp/specd-gpu
CARRY=gpu-carry
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

prepare() {
    . .venv/bin/activate
    grep -qx "/$CARRY/" .git/info/exclude 2>/dev/null || echo "/$CARRY/" >>.git/info/exclude
    rm -rf "$CARRY" && mkdir -p "$CARRY/base/model"
    local gguf model_dir version
    gguf=$(python -c "from specd import models; print(models.gguf_path(models.ALIASES['smollm2-135m']))")
    model_dir=$(python -c "from specd import models; print(models.converted_dir('smollm2-135m'))")
    split -b 50M "$gguf" "$CARRY/part-"
    sha256sum "$gguf" | awk '{print $1}' >"$CARRY/base/gguf.sha256"
    find "$model_dir" -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} "$CARRY/base/model/" \;
    version=$(python -c "import importlib.metadata as m; print(m.version('gguf'))")
    python -m pip download -q --no-deps --only-binary=:all: -d "$CARRY/base" "gguf==$version"
    # pytest and what the identity tests import, pure-Python wheels of the versions here
    mkdir -p "$CARRY/base/test"
    local pkg
    for pkg in pytest iniconfig hypothesis sortedcontainers attrs packaging; do
        version=$(python -c "import importlib.metadata as m; print(m.version('$pkg'))")
        python -m pip download -q --no-deps --only-binary=:all: -d "$CARRY/base/test" "$pkg==$version"
    done
    echo "staged in $CARRY/:"
    du -sh "$CARRY"/*
    echo "then, on one warm machine: receive part-aa (carry $CARRY/part-aa)," \
        "receive part-ab (carry $CARRY/part-ab), run (carry $CARRY/base)"
}

receive() {
    local part=${1:?usage: gpu_bench.sh receive part-aa}
    mkdir -p "$STAGE"
    cp "$CARRY/$part" "$STAGE/$part"
    ls -la "$STAGE"
}

install() {
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
        --target "$STAGE/site" "$CARRY"/base/*.whl . >/dev/null
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$STAGE/test-site" \
        "$CARRY"/base/test/*.whl >/dev/null
    export PYTHONPATH="$STAGE/site:$STAGE/test-site${PYTHONPATH:+:$PYTHONPATH}"
    export SPECD_CACHE_DIR="$STAGE/cache" HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
}

# The converted model in specd's cache, as `specd` makes it from the wheel on first use.
rebuild_model() {
    local dir="$SPECD_CACHE_DIR/models/smollm2-135m"
    [ -f "$dir/config.json" ] && return 0
    if ! ls "$STAGE"/part-* >/dev/null 2>&1; then
        echo "gpu_bench: no staged model in $STAGE (call 'receive' for each part on this warm" \
            "machine first, set MODEL to a local model directory, or RANDOM_WEIGHTS=1)" >&2
        return 1
    fi
    cat "$STAGE"/part-* >"$STAGE/$GGUF_NAME"
    echo "$(cat "$CARRY/base/gguf.sha256")  $STAGE/$GGUF_NAME" | sha256sum -c --quiet - || {
        echo "gpu_bench: the staged parts do not make the GGUF file (missing or stale part)" >&2
        return 1
    }
    python3 - "$STAGE" "$GGUF_NAME" "$dir" <<'PY'
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
stage, name, out = sys.argv[1:]
tok = AutoTokenizer.from_pretrained(stage, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(stage, gguf_file=name, dtype=torch.float32)
model.hf_quantizer = None  # dequantised already; see specd.forward.models.converted_dir
if hasattr(model.config, "quantization_config"):
    delattr(model.config, "quantization_config")
model.save_pretrained(out)
tok.save_pretrained(out)
PY
}

# The default model's shape (its config and tokenizer, carried in base/model) with random
# weights: the same work per step.
random_model() {
    local dir="$STAGE/random-smollm2-135m"
    [ -f "$dir/config.json" ] || python3 - "$CARRY/base/model" "$dir" <<'PY'
import shutil, sys, torch
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM
src, out = sys.argv[1:]
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src)).save_pretrained(out)
for f in Path(src).iterdir():
    if f.name.startswith(("tokenizer", "chat_template", "special_tokens", "generation_config")):
        shutil.copy(f, out)
PY
    echo "$dir"
}

run() {
    : "${OUT:?set OUT to the folder for the results}"
    local device=${DEVICE:-cuda} limit=${LIMIT:-16} model=${MODEL:-smollm2-135m}
    install
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || true
        python3 -c "import sys, torch, transformers; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available()); print('transformers', transformers.__version__)"
        python3 -m specd.cli plugins
    } >"$OUT/env.txt" 2>&1
    if [ "${RANDOM_WEIGHTS:-0}" = 1 ]; then
        model=$(random_model)
        echo "model: random weights in the shape of SmolLM2-135M ($model)" >>"$OUT/env.txt"
    elif [ "$model" = smollm2-135m ]; then
        rebuild_model
    fi
    # The compiled step against the eager one, and greedy identity, on this GPU. The
    # tests import specd from the installed copy (the checkout's root is not on the path).
    (cd tests && timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts= \
        -m "not compile" --rootdir=. test_compiled.py test_engine_exact.py) \
        >"$OUT/identity.txt" 2>&1 || echo "gpu_bench: identity tests failed, see identity.txt" >&2
    local common=(--workload editor --limit "$limit" --device "$device" --model "$model"
        --rss inprocess --no-progress --compile "${COMPILE:-on}")
    if [ -n "${CONFIGS:-}" ]; then common+=(--configs "$CONFIGS"); fi
    {
        timeout 240 python3 -m specd.cli bench "${common[@]}" --dtype bfloat16 \
            --json "$OUT/editor-bf16.json" --markdown "$OUT/editor-bf16.md" \
            --plot "$OUT/editor-bf16.png"
        timeout 180 python3 -m specd.cli bench "${common[@]}" --dtype float32 \
            --json "$OUT/editor-f32.json" --markdown "$OUT/editor-f32.md" --no-prefix
    } 2>&1 | tee "$OUT/log.txt"
}

# What a run brought back, into the repository (docs/benchmarks-gpu/DATE/).
collect() {
    local from=${1:?usage: gpu_bench.sh collect DIR}
    local to
    to="docs/benchmarks-gpu/$(date -u +%Y-%m-%d)"
    mkdir -p "$to"
    cp "$from"/* "$to"/
    echo "copied into $to:"
    ls "$to"
}

case "${1:-}" in
    prepare) prepare ;;
    receive) shift; receive "$@" ;;
    run) run ;;
    collect) shift; collect "$@" ;;
    *) sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
