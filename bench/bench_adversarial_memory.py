"""Peak memory of `purplerl adversarial` (attacker + defender + reference on one base) against one attack run at
the same work. `make bench-adversarial-memory`.

Each command runs in its own process, one after the other, and its peak resident set is the kernel's `ru_maxrss`
for that process (os.wait4), so the numbers include everything the run holds: the base, the sampler's merged copy,
both adapters and their AdamW states, the judge and the reward models. The work is the same defender batch on both
sides: the attack answers B prompts G times; the adversarial run answers B/A goals x A attacks x G times (A =
attacker_group), and its attacker also samples the attacks and trains (schedule 1:1 over 2 steps: one attacker
step, one defender step, so both optimizers exist). A 3-turn run is measured too, at the default micro-batch and at
a smaller one (its dialogue prompts are long).

The issue-23 bound: the adversarial run's peak <= 1.3 x the attack run's.
Writes bench/results/adversarial-memory-<date>-<host>.json and prints a table.
Run: .venv/bin/python bench/bench_adversarial_memory.py [--model embedded:smollm2-135m-safe]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
BOUND = 1.3


def peak_rss(command: list[str], log: Path) -> float:
    """Run the command; its peak resident set in GB (Linux reports ru_maxrss in KiB)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log.open("w") as sink:
        proc = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = log.read_text().strip().splitlines()[-1:]
        raise SystemExit(f"{' '.join(command[2:4])} failed ({proc.returncode}): {tail} (log: {log})")
    return usage.ru_maxrss * 1024 / 1e9


def purplerl(*args: str) -> list[str]:
    return [sys.executable, "-m", "purplerl", *args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:smollm2-135m-safe")
    parser.add_argument("--batch_size", type=int, default=4, help="the attack's prompts per step (B)")
    parser.add_argument("--attacker_group", type=int, default=2, help="attacks per goal (A); B/A goals a step")
    parser.add_argument("--group_size", type=int, default=4, help="answers per prompt (G)")
    parser.add_argument("--max_new_tokens", type=int, default=48)
    args = parser.parse_args()
    if args.batch_size % args.attacker_group:
        raise SystemExit("--batch_size must be a multiple of --attacker_group (the same defender batch)")

    with tempfile.TemporaryDirectory(prefix="purplerl-advmem-") as tmp:
        root = Path(tmp)
        subprocess.run(purplerl("data", "prepare", "attack-prompts", "--out", str(root / "data")), check=True,
                       stdout=subprocess.DEVNULL)
        common = ["--model", args.model, "--steps", "2", "--group_size", str(args.group_size),
                  "--max_new_tokens", str(args.max_new_tokens), "--save_every", "2", "--output_dir",
                  str(root / "runs"), "--logging.progress", "false"]
        adversarial = ["adversarial", *common, "--batch_size", str(args.batch_size // args.attacker_group),
                       "--attacker_group", str(args.attacker_group), "--data", str(root / "data" / "train.jsonl"),
                       "--data.prompt_field", "goal", "--schedule", "1:1"]
        cases = {
            "attack": purplerl("attack", *common, "--batch_size", str(args.batch_size), "--name", "attack"),
            "adversarial_1turn": purplerl(*adversarial, "--name", "adv1"),
            "adversarial_3turn": purplerl(*adversarial, "--turns", "3", "--name", "adv3"),
            "adversarial_3turn_mb1024": purplerl(*adversarial, "--turns", "3", "--micro_batch_tokens", "1024",
                                                 "--name", "adv3mb"),
        }
        peaks = {}
        for name, command in cases.items():
            peaks[name] = peak_rss(command, root / f"{name}.log")
            print(f"{name:26s} peak RSS {peaks[name]:.2f} GB ({peaks[name] / peaks['attack']:.2f}x attack)",
                  flush=True)

    ratios = {name: round(peak / peaks["attack"], 3) for name, peak in peaks.items()}
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(), "host": platform.node(), "cpu": platform.processor(),
        "cores": len(os.sched_getaffinity(0)), "settings": vars(args), "bound": BOUND,
        "peak_rss_gb": {name: round(peak, 3) for name, peak in peaks.items()}, "ratio_to_attack": ratios,
        "within_bound": ratios["adversarial_1turn"] <= BOUND,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"adversarial-memory-{result['date']}-{result['host']}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
