#!/usr/bin/env bash
# Regenerates docs/results/gist/ (README.md there): gist tokens on the adversarial recipe's three-turn dialogues.
#   1. build.py: 220 training and 92 held-out dialogues (held out by goal and template)
#   2. `purplerl sft` on them with 4 gist tokens and without (LoRA), and with 4 and every weight trained, 3 seeds
#      each, on the embedded SmolLM2
#   3. measure.py: each run's held-out last-answer NLL read compressed, whole, and without the history, with the
#      keys an answer token attends; 95% t intervals over seeds -> gist.json
# Resumable: a finished run is kept, a killed one resumes. Run alone on the machine.
#
#   docs/results/gist/run.sh [WORK_DIR]          (default runs/gist)
set -euo pipefail
cd "$(dirname "$0")/../../.."
W=${1:-runs/gist}
OUT=docs/results/gist
PY=.venv/bin/python
P=.venv/bin/purplerl
SEEDS=${SEEDS:-"0 1 2"}
STEPS=${STEPS:-60}
mkdir -p "$W/runs"
[ -f "$W/dialogues.jsonl" ] || $PY $OUT/build.py "$W/dialogues.jsonl"

train() {  # train NAME ARGS...: an sft run in $W/runs/NAME; a finished one is kept, a killed one resumed
  local name=$1; shift
  if [ -f "$W/runs/$name/summary.json" ]; then
    return
  elif [ -f "$W/runs/$name/config.yaml" ]; then
    $P sft --resume "$W/runs/$name" --logging.progress false
  else
    $P sft "$@" --output_dir "$W/runs" --name "$name" --logging.progress false
  fi
}

for seed in $SEEDS; do
  for k in 0 4; do
    train "k${k}_s${seed}" --data "$W/dialogues.jsonl" --sft.eval_split test --steps "$STEPS" --batch_size 8 \
      --lr 2e-4 --seed "$seed" --dialogue.gist_tokens "$k" --sft.eval_every "$STEPS" --save_every "$STEPS"
  done
  # every weight trained, the gist token's embedding included (Mu et al. fine-tune the whole model)
  train "k4full_s${seed}" --data "$W/dialogues.jsonl" --sft.eval_split test --steps "$STEPS" --batch_size 8 \
    --lr 2e-5 --seed "$seed" --dialogue.gist_tokens 4 --model.finetune full --sft.eval_every "$STEPS" \
    --save_every "$STEPS"
done
$PY $OUT/measure.py "$W" "$OUT/gist.json"
