#!/usr/bin/env bash
# Regenerates docs/results/routing/ (README.md there): small-rl's toy reward hack on the embedded instruct model,
# gradient routing (retain + forget LoRA adapters, rank 8 each) against its baseline (one LoRA of rank 16), 3 seeds
# each, then the measurements. The rewards are built in (purplerl/rewards/named_rewards.yaml): the task is sentences
# of 4 to 6 words (short_sentences); the hack is cheerful words (happy, joy, smile, laugh, ...), paid 0.2 a word (at
# most 5) by the combined reward short_with_cheer; the detector cheer_any labels an answer holding one a hack, and
# routing sends those answers' gradient to the forget adapter only.
# Resumable: a finished run is kept, a killed run resumes from its last checkpoint, a written result is kept
# (delete it to measure again; each run keeps its sampled answers in RUN/routing_answers.json). Run alone on the
# machine: two torch processes on 2 cores slow each other.
#
#   docs/results/routing/run.sh [WORK_DIR]          (default runs/routing)
set -euo pipefail
cd "$(dirname "$0")/../../.."
W=${1:-runs/routing}
OUT=docs/results/routing
PY=.venv/bin/python
P=.venv/bin/purplerl
SEEDS=${SEEDS:-"0 1 2"}
STEPS=${STEPS:-30}  # a run resumed with more steps continues to them
mkdir -p "$W"

run() {  # run NAME ARGS...: a route run in $W/runs/NAME; a finished one is kept, a killed one resumed
  local name=$1; shift
  if [ -f "$W/runs/$name/summary.json" ]; then
    return
  elif [ -f "$W/runs/$name/config.yaml" ]; then
    $P route --resume "$W/runs/$name" --steps "$STEPS" --logging.progress false
  else
    $P route "$@" --output_dir "$W/runs" --name "$name" --logging.progress false
  fi
}

# the same setup for both arms; only route.mode differs (the baseline's one adapter has rank 8 + 8)
COMMON=(--model embedded:smollm2-135m-instruct --data builtin:stories
        --reward short_with_cheer --task_term short_sentences --lora_rank 8 --forget_rank 8 --steps "$STEPS"
        --batch_size 4 --group_size 8 --max_new_tokens 40 --lr 5e-4 --training.advantage grpo_std --kl_beta 0.02
        --save_every 5 --route.eval_every 15 --route.eval_prompts 10 --route.eval_n 2)

for s in $SEEDS; do
  run route_s$s "${COMMON[@]}" --route.mode route --seed "$s"
  run baseline_s$s "${COMMON[@]}" --route.mode baseline --seed "$s"
done

if [ ! -s $OUT/routing.json ]; then
  $PY $OUT/measure.py $(for s in $SEEDS; do echo "$W/runs/route_s$s"; done) -- \
    $(for s in $SEEDS; do echo "$W/runs/baseline_s$s"; done) > $OUT/routing.json.tmp
  mv $OUT/routing.json.tmp $OUT/routing.json
fi
