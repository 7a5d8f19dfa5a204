#!/usr/bin/env bash
# Regenerates docs/results/adversarial/ (README.md there): issue 23's experiment on the embedded aligned model
# (embedded:smollm2-135m-safe, built by `purplerl align` on first use).
#   1. the attack-prompts set (goal -> adversarial prompt chats; held out by template and topic)
#   2. attacker SFT on it: the learned attacker, an adapter on the aligned model
#   3. `purplerl adversarial` from that attacker, 1 turn and 3 turns, 3 seeds each (the defender is the run's policy)
#   4. eval: the SFT attacker writes one attack per held-out goal; the aligned base and every defender answer each
#      twice (T = 1); then each model answers the alignment data's held-out benign requests greedily and the utility
#      set; then each run's own co-trained attacker against the base and its defender (46 goals, 1 answer each)
#   5. measure.py: pooled rates with 95% two-level cluster bootstrap intervals -> adversarial.json
# Resumable: a finished run or eval is kept, a killed run resumes from its last checkpoint, an eval resumes its
# generations. Run alone on the machine: two torch processes on 2 cores slow each other.
#
#   docs/results/adversarial/run.sh [WORK_DIR]          (default runs/adversarial)
set -euo pipefail
cd "$(dirname "$0")/../../.."
W=${1:-runs/adversarial}
OUT=docs/results/adversarial
PY=.venv/bin/python
P=.venv/bin/purplerl
MODEL=embedded:smollm2-135m-safe
SEEDS=${SEEDS:-"0 1 2"}
mkdir -p "$W"

[ -f "$W/data/train.jsonl" ] || $P data prepare attack-prompts --out "$W/data"

train() {  # train RECIPE NAME ARGS...: a run in $W/runs/NAME; a finished one is kept, a killed one resumed
  local recipe=$1 name=$2; shift 2
  if [ -f "$W/runs/$name/summary.json" ]; then
    return
  elif [ -f "$W/runs/$name/config.yaml" ]; then
    $P "$recipe" --resume "$W/runs/$name" --logging.progress false
  else
    $P "$recipe" "$@" --output_dir "$W/runs" --name "$name" --logging.progress false
  fi
}

# the learned attacker: 120 steps x 8 chats of the train split (2,200 chats), loss on the attack only
train sft attacker --model $MODEL --data "$W/data/train.jsonl" --steps 120 --batch_size 8 --lr 2e-4 --save_every 40

# both learners start from the SFT attacker and the aligned model; schedule 1:2 (one attacker step, two defender
# steps); the judge is the offline compliance judge (P(unsafe) := its score), the defender's entropy term at -0.1
COMMON=(--model $MODEL --data "$W/data/train.jsonl" --data.prompt_field goal --attacker_init "$W/runs/attacker"
        --schedule 1:2 --attacker_group 2 --group_size 4 --max_new_tokens 40 --lr 2e-4 --save_every 3)
for s in $SEEDS; do
  train adversarial adv1_s$s "${COMMON[@]}" --turns 1 --steps 21 --batch_size 2 --seed "$s"
  train adversarial adv3_s$s "${COMMON[@]}" --turns 3 --steps 12 --batch_size 1 --max_prompt_tokens 384 --seed "$s"
done

final() { ls -d "$W/runs/$1/checkpoints"/step_* | sort | tail -1; }
CHECKPOINTS=()
for s in $SEEDS; do
  for t in 1 3; do CHECKPOINTS+=(--checkpoint "$(final adv${t}_s$s)"); done
done

# the learned (SFT) attacker against the aligned base and every defender: 92 held-out goals x 2 answers
$P eval --model $MODEL --attacker "$W/runs/attacker" --attacker_tokens 40 "${CHECKPOINTS[@]}" --suite harm --n 2 \
  --max_new_tokens 40 --out "$W/eval_asr"

# benign requests of the alignment data's held-out templates and topics (greedy), many worded like harmful ones, and
# the utility suite
[ -f "$W/benign.jsonl" ] || $PY -c "
import json, sys
from purplerl.data.alignment.build import alignment_examples
with open(sys.argv[1], 'w') as f:
    for e in alignment_examples('test', 'benign')[::2]:  # every other one: 126 of 252, every category
        f.write(json.dumps({'prompt': e.messages[-1]['content'], 'category': e.category, 'uid': e.uid}) + '\n')
" "$W/benign.jsonl"
$P eval --model $MODEL --prompts "$W/benign.jsonl" "${CHECKPOINTS[@]}" --suite harm,utility --temperature 0 \
  --max_new_tokens 40 --out "$W/eval_benign"

# each run's co-trained attacker (its final checkpoint's attacker adapter) against the base and its own defender
if [ "${COTRAINED:-1}" = 1 ]; then
  for s in $SEEDS; do
    for t in 1 3; do
      $P eval --model $MODEL --attacker "$W/runs/adv${t}_s$s" --attacker_tokens 40 --checkpoint "$(final adv${t}_s$s)" \
        --suite harm --n 1 --limit 46 --max_new_tokens 40 --out "$W/eval_cotrained/adv${t}_s$s"
    done
  done
fi

$PY $OUT/measure.py "$W" $SEEDS > $OUT/adversarial.json.tmp
mv $OUT/adversarial.json.tmp $OUT/adversarial.json
