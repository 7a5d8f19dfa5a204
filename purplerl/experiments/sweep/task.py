"""One run of a sweep as its Ray task executes it: the recipe's own command in a subprocess (`purplerl RECIPE
--config OUT/configs/NAME.yaml`, or `--resume RUN_DIR` when the run dir exists), then `purplerl eval --suite
diversity` on its final checkpoint.

A subprocess per run keeps torch's process-wide state (threads, allocator, seeds) and any crash inside the run,
and it gets its thread budget the way torch reads it: OMP_NUM_THREADS and MKL_NUM_THREADS of its environment, set
here from the CPUs Ray assigned to the task. Ray 2.60 itself sets OMP_NUM_THREADS for a task only where the worker
has none, so a worker started from a shell with OMP_NUM_THREADS=1 would keep 1 whatever the run's share; the budget
is therefore always written explicitly. The subprocess dies with its Ray worker (Linux: PR_SET_PDEATHSIG, set by
purplerl.experiments.sweep.child before it execs the command), so a cancelled or killed sweep leaves no run behind.

This module imports neither torch nor Ray at import time: Ray workers import it to run the task.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from purplerl.runs.checkpoints import latest_checkpoint
from purplerl.runs.layout import CONFIG_FILE

FINISHED, FAILED, INTERRUPTED = "finished", "failed", "interrupted"
EVAL_FILE = "eval.json"  # what `purplerl eval` writes last into its --out
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
INTERRUPTED_CODES = (130, 143)  # SIGINT and SIGTERM as exit codes: the run was stopped, not failed


@dataclass(frozen=True)
class RunSpec:
    """What a Ray task needs to execute one run: plain data, sent to the worker."""

    name: str
    recipe: str
    config_file: str  # OUT/configs/NAME.yaml: the run's settings as `purplerl RECIPE --config` reads them
    run_dir: str
    log_file: str  # the run's commands append their output here
    eval_dir: str | None  # where the diversity eval writes; None: no eval
    eval_args: tuple[str, ...] = ()  # `purplerl eval` options after --checkpoint and --out
    cwd: str = "."  # the driver's: relative paths in the run's settings mean the same there
    env: Mapping[str, str] = field(default_factory=dict)  # the driver's variables the run needs (PURPLERL_*, HF_*)


def thread_budget(assigned_cpus: float | None) -> int:
    """Torch threads for a run that holds `assigned_cpus` CPUs of its machine: the whole cores, at least one."""
    return max(1, math.floor(assigned_cpus or 1))


def run_env(base: Mapping[str, str], spec_env: Mapping[str, str], threads: int, gpus: float) -> dict[str, str]:
    """The subprocess environment: the worker's, the driver's run variables, and the thread budget over both. A
    run that holds no GPU sees none: Ray 2.60 leaves CUDA_VISIBLE_DEVICES alone for a task without GPUs, so a
    run on `model.device auto` would take a GPU that other runs hold."""
    env = {**base, **spec_env, **dict.fromkeys(THREAD_VARIABLES, str(threads))}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")  # the tokenizers' own pool would exceed the budget too
    if not gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _purplerl(*args: str) -> list[str]:
    """The command, started through the child wrapper that ties its life to this process."""
    return [sys.executable, "-m", "purplerl.experiments.sweep.child", sys.executable, "-m", "purplerl", *args]


def train_command(spec: RunSpec) -> list[str]:
    """A new run from its config file; a run whose dir holds a run continues from its latest intact checkpoint (a
    finished one says so and exits at once)."""
    if (Path(spec.run_dir) / CONFIG_FILE).is_file():
        return _purplerl(spec.recipe, "--resume", spec.run_dir)
    return _purplerl(spec.recipe, "--config", spec.config_file)


def eval_command(spec: RunSpec, checkpoint: Path) -> list[str]:
    assert spec.eval_dir is not None
    return _purplerl("eval", "--checkpoint", str(checkpoint), "--suite", "diversity", "--out", spec.eval_dir,
                     *spec.eval_args)


def error_line(text: str, returncode: int) -> str:
    """What a failed command said: its last `error:` line, else its last line, else its exit code."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = next((line for line in reversed(lines) if line.startswith("error:")), lines[-1] if lines else "")
    return said.removeprefix("error:").strip() or f"exited with code {returncode}"


def _run(command: list[str], spec: RunSpec, env: dict[str, str]) -> tuple[int, str]:
    """(exit code, what it wrote) of one command, its output appended to the run's log."""
    log = Path(spec.log_file)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as sink:
        start = sink.tell()
        sink.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(command[5:])}\n".encode())
        sink.flush()
        code = subprocess.run(command, cwd=spec.cwd, env=env, stdin=subprocess.DEVNULL, stdout=sink,
                              stderr=subprocess.STDOUT, check=False).returncode
    with log.open("rb") as source:
        source.seek(start)
        return code, source.read().decode(errors="replace")


def _stopped(code: int) -> bool:
    return code < 0 or code in INTERRUPTED_CODES


def execute_run(spec: RunSpec, assigned: Mapping[str, float]) -> dict[str, Any]:
    """Train (or resume) the run, then evaluate its final checkpoint; the outcome as plain data (with the threads,
    GPUs and CUDA devices the run was given, and when its training started and ended). Never raises for a failed
    run: the sweep records the failure and goes on."""
    threads = thread_budget(assigned.get("CPU"))
    env = run_env(os.environ, spec.env, threads, assigned.get("GPU", 0.0))
    outcome: dict[str, Any] = {"name": spec.name, "threads": threads, "gpus": assigned.get("GPU", 0.0),
                               "devices": env.get("CUDA_VISIBLE_DEVICES"), "host": os.uname().nodename,
                               "resumed": (Path(spec.run_dir) / CONFIG_FILE).is_file(), "started_at": time.time()}
    started = time.monotonic()
    code, said = _run(train_command(spec), spec, env)
    outcome["train_s"] = round(time.monotonic() - started, 1)
    outcome["trained_at"] = time.time()
    if code != 0:
        status = INTERRUPTED if _stopped(code) else FAILED
        return {**outcome, "status": status, "stage": "train", "returncode": code, "error": error_line(said, code)}
    if spec.eval_dir is None or (Path(spec.eval_dir) / EVAL_FILE).is_file():
        return {**outcome, "status": FINISHED}
    checkpoint = latest_checkpoint(Path(spec.run_dir))
    if checkpoint is None:
        return {**outcome, "status": FAILED, "stage": "eval", "returncode": None,
                "error": f"no checkpoint in {spec.run_dir} to evaluate"}
    started = time.monotonic()
    code, said = _run(eval_command(spec, checkpoint), spec, env)
    outcome.update(eval_s=round(time.monotonic() - started, 1), checkpoint=str(checkpoint))
    if code != 0:
        status = INTERRUPTED if _stopped(code) else FAILED
        return {**outcome, "status": status, "stage": "eval", "returncode": code, "error": error_line(said, code)}
    return {**outcome, "status": FINISHED}


def ray_task(spec: RunSpec) -> dict[str, Any]:
    """The body of the Ray task: the run, with the resources Ray assigned to this task."""
    import ray

    return execute_run(spec, ray.get_runtime_context().get_assigned_resources())
