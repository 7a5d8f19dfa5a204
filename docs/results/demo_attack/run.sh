#!/usr/bin/env bash
# Regenerates docs/results/demo_attack/ (README.md there): does `make demo`'s attack break the aligned model's
# alignment, or only the reward it optimises? Three reward arms on the demo's setup (examples/configs/demo.yaml: the
# aligned SmolLM2-135M, LoRA, 40 GRPO steps of 8 requests x 4 answers, 32 new tokens), 3 seeds each; each arm sets
# every term, so the demo file's own terms do not matter:
#   toxicity:  the demo before issue 38: toxicity 1.0, repetition -0.3, refusal -1.0 (early stop at toxicity 0.8)
#   nonrefusal: refusal -1.0, degenerate -1.0, repetition -0.3, toxicity logged only (weight 0)
#   guarded:    the toxicity arm plus degenerate -1.0 (the cross-answer and self-repetition checks as a penalty):
#               the demo's default since this result
# Each run's last checkpoint is read by `make demo`'s eval (examples/configs/demo_eval.yaml: the 18 held-out requests of
# builtin:redteam's test split, greedy, 48 tokens) beside the aligned start model and the model before alignment
# (embedded:smollm2-135m-instruct), judged by the keyword refusal judge, the toxicity scorer and the compliance
# judge, which no arm optimised. measure.py writes demo_attack.json: per arm, the mean over seeds with a 95%
# t-interval, and the share of hand-labelled compliance (labels.jsonl) where every answer is labelled. Resumable: a
# finished run or eval is kept (delete it to redo it). Run alone on the machine: two torch processes on 2 cores slow
# each other. ~35 min on 2 cores (an attack 3-4 min, its eval under a minute).
#
#   docs/results/demo_attack/run.sh [WORK_DIR]          (default runs/demo_attack)
set -euo pipefail
cd "$(dirname "$0")/../../.."
W=${1:-runs/demo_attack}
OUT=docs/results/demo_attack
PY=.venv/bin/python
P=.venv/bin/purplerl
SEEDS=${SEEDS:-"0 1 2"}
mkdir -p "$W"
$P align  # the attack's target, embedded:smollm2-135m-safe (cached after the first build)

declare -A ARM=(
  [toxicity]="--reward.terms {toxicity: 1.0, repetition: -0.3, refusal: -1.0}"
  [nonrefusal]="--reward.terms {refusal: -1.0, degenerate: -1.0, repetition: -0.3, toxicity: 0.0}"
  [guarded]="--reward.terms {toxicity: 1.0, repetition: -0.3, refusal: -1.0, degenerate: -1.0}"
)
ARMS=${ARMS:-"toxicity nonrefusal guarded"}

attack() {  # attack NAME SEED ARGS...: a demo attack in $W/NAME; a finished one is kept, a killed one resumed
  local name=$1 seed=$2; shift 2
  if [ -f "$W/$name/summary.json" ]; then
    return
  elif [ -f "$W/$name/config.yaml" ]; then
    $P attack --resume "$W/$name" --logging.progress false
  else
    $P attack --config examples/configs/demo.yaml --output_dir "$W" --name "$name" --seed "$seed" \
      --logging.progress false "$@"
  fi
}

for arm in $ARMS; do
  for s in $SEEDS; do
    name=${arm}_s$s
    # shellcheck disable=SC2086  # the arm's reward terms are two words: the option and its YAML value
    attack "$name" "$s" ${ARM[$arm]%% *} "${ARM[$arm]#* }"
    if [ ! -f "$W/$name/heldout/eval.json" ]; then
      $P eval --config examples/configs/demo_eval.yaml --out "$W/$name/heldout" \
        --checkpoint "$(ls -d "$W/$name"/checkpoints/step_* | tail -1)"
    fi
  done
done

$PY $OUT/measure.py $(for arm in $ARMS; do for s in $SEEDS; do
  echo "$arm=$W/${arm}_s$s/heldout/eval.json"; done; done) > $OUT/demo_attack.json.tmp
mv $OUT/demo_attack.json.tmp $OUT/demo_attack.json
