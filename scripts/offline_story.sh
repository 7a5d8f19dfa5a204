#!/usr/bin/env bash
# The offline story as one experiment (`make experiment-offline`): align the embedded SmolLM2-135M-Instruct,
# defend it with Token Buncher, then tamper-test the defense with every threat model and 3 seeds, and copy the
# report into docs/results/offline_story/. Every stage resumes: run it again after a kill.
set -euo pipefail
PURPLERL=${PURPLERL:-.venv/bin/purplerl}
RUNS=${RUNS:-runs/offline_story}
OUT=${OUT:-docs/results/offline_story}
mkdir -p "$RUNS" "$OUT"

$PURPLERL align

defend_run="$RUNS/defend"
if [ -f "$defend_run/config.yaml" ]; then
  $PURPLERL defend --resume "$defend_run" | tee "$RUNS/defend_summary.txt"
else
  $PURPLERL defend --config examples/configs/defend.yaml --output_dir "$RUNS" --name defend \
    | tee "$RUNS/defend_summary.txt"
fi
# the defended adapter: the run's newest checkpoint (a collapsed defense stops the script above, non-zero)
adapter=$(ls -d "$defend_run"/checkpoints/step_* | sort | tail -n 1)

$PURPLERL tamper-test --config examples/configs/tamper.yaml --adapter "$adapter" --out "$RUNS/tamper"

$PURPLERL report "$defend_run"
cp "$RUNS/defend_summary.txt" "$OUT/defend_summary.txt"
cp "$defend_run/metrics.jsonl" "$OUT/defend_metrics.jsonl"
for plot in "$defend_run"/plots/response_entropy*.png "$defend_run"/plots/kl*.png; do
  if [ -f "$plot" ]; then cp "$plot" "$OUT/defend_$(basename "$plot")"; fi
done
cp "$RUNS/tamper/summary.txt" "$RUNS/tamper/tamper.json" "$RUNS/tamper/tamper.png" "$OUT/"
echo "wrote $OUT"
