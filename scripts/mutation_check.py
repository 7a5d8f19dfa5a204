"""Targeted mutation check: does the suite notice small, plausible bugs in the RL math, the registered losses, the
loop, the engine's loss path and the pipeline's gates?

Each mutation is one exact edit (file, original snippet, mutated snippet) plus the tests that should notice it; the
list is scripts/mutation_list.py.
The script copies purplerl/, tests/, examples/ and pyproject.toml into a temporary directory (the working tree is never
touched), runs the union of the mapped tests there once unmutated (the baseline must pass), then for each
mutation writes the mutated file into the copy, runs its tests with `-x -q`, and puts the original back. A
mutant is killed when its tests fail (or time out), survives when they pass.

Every surviving mutant must be explained: a mutation whose `equivalent` says why no test can tell it from the
original (same outputs for every input the code receives) counts apart. The script exits 1 when a snippet no
longer matches its file exactly once (update the list after a refactor), when the baseline fails, or when a
mutant without such an explanation survives.

    python scripts/mutation_check.py               # all mutations; writes bench/results/mutation-DATE.json
    python scripts/mutation_check.py --check       # only verify that every snippet still matches
    python scripts/mutation_check.py --only loop-kl-direction --only attack-kl-added
    python scripts/mutation_check.py --list
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

# beside this script: on sys.path when it runs as `python scripts/mutation_check.py`
from mutation_list import MUTATIONS, snippet_problems

ROOT = Path(__file__).resolve().parent.parent
TIERS = "not slow and not gpu and not tinker and not vllm"
COPIED = ("purplerl", "tests", "examples", "pyproject.toml")  # tests read examples/ (the pipelines)


def make_copy(dest: Path) -> None:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, dest / name)


def child_env(copy_root: Path) -> dict[str, str]:
    # No bytecode caches: a mutant of the same size written within the same second as the original would
    # otherwise be served from the original's stale .pyc.
    return {**os.environ, "PYTHONPATH": str(copy_root), "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_tests(copy_root: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, str, float]:
    """('passed' | 'failed' | 'timeout', first failing test or '', seconds)."""
    started = time.perf_counter()
    # the quick and the process tier alike: a mapped test may start a process (README: Tests)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", TIERS, *tests]
    try:
        proc = subprocess.run(cmd, cwd=copy_root, env=child_env(copy_root), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", "", time.perf_counter() - started
    seconds = time.perf_counter() - started
    if proc.returncode == 0:
        return "passed", "", seconds
    lines = (proc.stdout + proc.stderr).splitlines()
    # "FAILED tests/x.py::test_y[param id] - AssertionError: ...": the test id may hold spaces
    failed = next((line.split(" ", 1)[1].split(" - ")[0] for line in lines if line.startswith(("FAILED ", "ERROR "))),
                  "")
    return "failed", failed or (lines[-1] if lines else f"exit {proc.returncode}"), seconds


def check_copy_is_imported(copy_root: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", "import purplerl; print(purplerl.__file__)"], cwd=copy_root,
                          env=child_env(copy_root), capture_output=True, text=True, timeout=120)
    if not proc.stdout.strip().startswith(str(copy_root)):
        sys.exit(f"error: the copy's purplerl is not the one imported ({proc.stdout.strip() or proc.stderr[-300:]})")


def git_state() -> dict[str, object]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty_paths": git("status", "--porcelain", "purplerl", "tests")
            .splitlines()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="run only this mutation (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--check", action="store_true", help="only check that every snippet still matches")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per test run (a timeout kills)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the mapped tests")
    parser.add_argument("--out", type=Path, default=None, help="result JSON (default bench/results/mutation-DATE.json)")
    args = parser.parse_args()

    names = [m.name for m in MUTATIONS]
    if len(set(names)) != len(names):
        sys.exit("error: two mutations share a name")
    unknown = sorted(set(args.only) - set(names))
    if unknown:
        sys.exit(f"error: unknown mutation(s) {', '.join(unknown)} (see --list)")
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.name:42} {m.path}{'  (equivalent)' if m.equivalent else ''}")
        return 0
    problems = snippet_problems(chosen, ROOT)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    if args.check:
        print(f"all {len(chosen)} snippets match")
        return 0

    with tempfile.TemporaryDirectory(prefix="purplerl-mutation-") as tmp:
        copy_root = Path(tmp)
        make_copy(copy_root)
        check_copy_is_imported(copy_root)
        if not args.no_baseline:
            tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
            status, failed, seconds = run_tests(copy_root, tests, args.timeout * 3)
            print(f"baseline ({len(tests)} test files, unmutated): {status} in {seconds:.0f} s", flush=True)
            if status != "passed":
                print(f"error: the unmutated tests do not pass ({failed}); fix them first", file=sys.stderr)
                return 1
        rows = []
        for i, m in enumerate(chosen, 1):
            target = copy_root / m.path
            original = target.read_text()
            target.write_text(original.replace(m.original, m.mutated, 1))
            try:
                status, failed, seconds = run_tests(copy_root, m.tests, args.timeout)
            finally:
                target.write_text(original)
            verdict = "survived" if status == "passed" else "killed"
            rows.append({**asdict(m), "tests": list(m.tests), "verdict": verdict, "status": status,
                         "killed_by": failed, "seconds": round(seconds, 1)})
            print(f"[{i:2}/{len(chosen)}] {m.name:42} {verdict:8} {seconds:5.0f} s  {failed}", flush=True)

    killed = sum(r["verdict"] == "killed" for r in rows)
    equivalent = [r for r in rows if r["verdict"] == "survived" and r["equivalent"]]
    unexplained = [r for r in rows if r["verdict"] == "survived" and not r["equivalent"]]
    countable = len(rows) - len(equivalent)
    summary = {"mutants": len(rows), "killed": killed, "survived_equivalent": len(equivalent),
               "survived_unexplained": len(unexplained), "kill_rate": round(killed / len(rows), 4),
               "kill_rate_excluding_equivalent": round(killed / countable, 4) if countable else None}
    print(f"\n{'mutation':42} {'verdict':8} {'s':>5}  killed by / why it survives")
    for r in rows:
        note = r["killed_by"] if r["verdict"] == "killed" else (r["equivalent"] or "UNEXPLAINED")
        print(f"{r['name']:42} {r['verdict']:8} {r['seconds']:5.0f}  {note}")
    print(f"\nkill rate {killed}/{len(rows)} = {summary['kill_rate']:.1%}; excluding {len(equivalent)} equivalent "
          f"mutant(s): {killed}/{countable}")

    out = args.out or ROOT / "bench" / "results" / f"mutation-{dt.date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": dt.datetime.now().isoformat(timespec="seconds"), **git_state(),
                               "summary": summary, "mutations": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    if unexplained:
        print(f"error: {len(unexplained)} mutant(s) survived without an explanation: "
              f"{', '.join(r['name'] for r in unexplained)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
