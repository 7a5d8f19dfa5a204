#!/usr/bin/env bash
# Regenerates docs/results/preferences/ (README.md there): the offline preference set, a reward model, DPO from the
# base model and PPO against the reward model, 3 seeds each, then the measurements. Resumable: a written result is
# kept (delete it to measure again), a killed run resumes. Run alone on the machine (two torch processes on 2 cores slow each other).
#
#   docs/results/preferences/run.sh [WORK_DIR]          (default runs/preferences)
set -euo pipefail
cd "$(dirname "$0")/../../.."
W=${1:-runs/preferences}
OUT=docs/results/preferences
PY=.venv/bin/python
P=.venv/bin/purplerl
SEEDS=${SEEDS:-"0 1 2"}
mkdir -p "$W"

run() {  # run NAME RECIPE ARGS...: a recipe run in $W/runs/NAME; a finished one is kept, a killed one resumed
  local name=$1; shift
  local recipe=$1; shift
  if [ -f "$W/runs/$name/summary.json" ]; then
    return
  elif [ -f "$W/runs/$name/config.yaml" ]; then
    $P "$recipe" --resume "$W/runs/$name" --logging.progress false
  else
    $P "$recipe" "$@" --output_dir "$W/runs" --name "$name" --logging.progress false
  fi
}

# 1. the offline preference set: the base model's sampled answers, 240 harmful and 240 benign requests per split
[ -f "$W/data/test.jsonl" ] || $P data prepare safety-prefs --out "$W/data" --limit 240

# 2. a Bradley-Terry reward model on the training split
run rm reward-model --data "$W/data/train.jsonl" --steps 40 --batch_size 8 --lr 1e-4 --reward_model.eval_every 20
[ -s $OUT/rm.json ] || $PY $OUT/measure.py rm "$W/runs/rm" "$W/data/test.jsonl" > $OUT/rm.json

# 3. DPO from the base model (its own reference), 3 seeds
for s in $SEEDS; do
  run dpo_s$s prefs --data "$W/data/train.jsonl" --steps 40 --batch_size 8 --lr 1e-4 --prefs.beta 0.1 \
    --prefs.eval_every 20 --seed "$s"
done
[ -s $OUT/dpo.json ] || $PY $OUT/measure.py policy $(for s in $SEEDS; do echo "$W/runs/dpo_s$s"; done) > $OUT/dpo.json

# 3b. the base model on the same held-out requests
[ -s $OUT/base.json ] || $PY $OUT/measure.py policy base:embedded:smollm2-135m-instruct > $OUT/base.json

# 3c. DPO plus the chosen answers' NLL (RPO, sft_weight 1 as in Pang et al. 2024), otherwise as 3, 3 seeds
for s in $SEEDS; do
  run rpo_s$s prefs --data "$W/data/train.jsonl" --steps 40 --batch_size 8 --lr 1e-4 --prefs.beta 0.1 \
    --prefs.sft_weight 1.0 --prefs.eval_every 20 --seed "$s"
done
[ -s $OUT/rpo.json ] || $PY $OUT/measure.py policy $(for s in $SEEDS; do echo "$W/runs/rpo_s$s"; done) > $OUT/rpo.json

# 3d. RPO four times as long (160 steps, ~1.7 passes over the pairs): does the budget hold DPO back? (LONG_SEEDS)
LONG_SEEDS=${LONG_SEEDS:-"0 1"}
for s in $LONG_SEEDS; do
  run rpo_long_s$s prefs --data "$W/data/train.jsonl" --steps 160 --batch_size 8 --lr 1e-4 --prefs.beta 0.1 \
    --prefs.sft_weight 1.0 --prefs.eval_every 40 --seed "$s"
done
[ -s $OUT/rpo_long.json ] || $PY $OUT/measure.py policy $(for s in $LONG_SEEDS; do echo "$W/runs/rpo_long_s$s"; done) \
  > $OUT/rpo_long.json

# 4. PPO with a critic against the reward model, on the training split's requests, 30 steps, 3 seeds
for s in $SEEDS; do
  run ppo_s$s ppo --model embedded:smollm2-135m-instruct --data "$W/data/train.jsonl" --steps 30 --batch_size 8 --group_size 2 --max_new_tokens 32 \
    --reward.terms '{reward_model: 1, repetition: 0}' --reward.terms.reward_model.params.run "$W/runs/rm" --training.ppo_epochs 2 --seed "$s"
done
[ -s $OUT/ppo.json ] || $PY $OUT/measure.py ppo $(for s in $SEEDS; do echo "$W/runs/ppo_s$s"; done) > $OUT/ppo.json
