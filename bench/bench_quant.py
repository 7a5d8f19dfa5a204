"""Peak RSS and seconds per step of LoRA against QLoRA (`--model.quantize 4bit`), and of full fine-tuning against full
fine-tuning with 8-bit AdamW (`--training.optimizer adamw_8bit`), on the embedded SmolLM2: one `purplerl attack`
process per setting, each under `/usr/bin/time -v` (its peak RSS), seconds per step the median of the steps after the
first (`time/step_s` of metrics.jsonl). Run it with nothing else running.
Writes bench/results/quant-<date>-<host>-cpu.json.
Run: .venv-quant/bin/python bench/bench_quant.py [--steps 5]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SETTINGS = {
    "lora": [],
    "qlora": ["--model.quantize", "4bit"],
    "full": ["--model.finetune", "full"],
    "full_adamw_8bit": ["--model.finetune", "full", "--training.optimizer", "adamw_8bit"],
}
COMMON = ["--model", "embedded:smollm2-135m-instruct", "--device", "cpu", "--batch_size", "4", "--group_size", "4",
          "--max_new_tokens", "32", "--save_every", "1000", "--logging.progress", "false"]


def measure(name: str, args: list[str], steps: int, out: Path) -> dict[str, object]:
    purplerl = Path(sys.executable).with_name("purplerl")
    command = ["/usr/bin/time", "-v", str(purplerl), "attack", *COMMON, "--steps", str(steps),
               "--output_dir", str(out), "--name", name, *args]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    step_s = [r["time/step_s"] for r in rows]
    return {"args": args, "peak_rss_mib": round(peak_kb / 1024), "s_per_step": round(statistics.median(step_s[1:]), 2),
            "first_step_s": round(step_s[0], 2), "step_s": [round(s, 2) for s in step_s],
            "kl_last": rows[-1]["kl/mean"], "reward_mean": [round(r["reward/mean"], 4) for r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=list(SETTINGS), default=list(SETTINGS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: measure(name, SETTINGS[name], args.steps, Path(tmp)) for name in args.only}
        for name, result in results.items():
            print(f"{name:16s} peak RSS {result['peak_rss_mib']:6d} MiB  {result['s_per_step']:6.2f} s/step")
    import bitsandbytes
    import torch

    record = {"date": datetime.date.today().isoformat(), "host": platform.node(), "cpu": platform.processor(),
              "torch": torch.__version__, "bitsandbytes": bitsandbytes.__version__, "threads": torch.get_num_threads(),
              "steps": args.steps, "common": COMMON, "results": results}
    path = Path(__file__).parent / "results" / f"quant-{record['date']}-{platform.node()}-cpu.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
