"""Start-up time of the command line: `make bench-cli`.

Runs `purplerl --help` and `purplerl CMD --help` for a few commands (the console script of this venv, a fresh
process each time) and reports the wall and CPU seconds of each (median, min, max), plus the modules the import
of purplerl.cli loads that only a run needs (torch, transformers, ...). Writes
bench/results/cli-<YYYY-MM-DD>-<hostname>.json and prints a table. Time it with nothing else running: on a
2-core machine a second busy process doubles the wall time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
COMMANDS = ([], ["attack"], ["sft"], ["tamper-test"], ["eval"], ["serve-reward"])
HEAVY = ("torch", "transformers", "peft", "datasets")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_help(script: Path, command: list[str], repeats: int) -> dict[str, float]:
    walls, cpus = [], []
    for _ in range(repeats):
        cpu, start = children_cpu(), time.perf_counter()
        subprocess.run([str(script), *command, "--help"], check=True, capture_output=True)
        walls.append(time.perf_counter() - start)
        cpus.append(children_cpu() - cpu)
    return {"wall_median_s": round(statistics.median(walls), 3), "wall_min_s": round(min(walls), 3),
            "wall_max_s": round(max(walls), 3), "cpu_median_s": round(statistics.median(cpus), 3)}


def heavy_modules() -> list[str]:
    probe = f"import json, sys, purplerl.cli; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    # from bench/: the purplerl the console script imports, not a package dir that happens to be the cwd
    return json.loads(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True,
                                     cwd=RESULTS.parent).stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="runs of each command (after one warm-up run)")
    parser.add_argument("--out", type=Path, default=None, help="result JSON (default bench/results/cli-DATE-HOST)")
    args = parser.parse_args()
    script = Path(sys.executable).parent / "purplerl"
    rows = {}
    for command in COMMANDS:
        time_help(script, command, 1)  # the page cache and .pyc files warm, as for a user's second call
        rows[" ".join(["purplerl", *command, "--help"])] = time_help(script, command, args.repeats)
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
              "python": platform.python_version(), "repeats": args.repeats,
              "heavy_modules_imported_by_the_cli": heavy_modules(), "commands": rows}
    out = args.out or RESULTS / f"cli-{datetime.date.today().isoformat()}-{platform.node()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'command':36} {'wall median':>11} {'min':>6} {'max':>6} {'cpu':>6}")
    for name, row in rows.items():
        print(f"{name:36} {row['wall_median_s']:11.3f} {row['wall_min_s']:6.3f} {row['wall_max_s']:6.3f} "
              f"{row['cpu_median_s']:6.3f}")
    print(f"heavy modules imported by `import purplerl.cli`: {result['heavy_modules_imported_by_the_cli'] or 'none'}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
