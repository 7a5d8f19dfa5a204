"""Running a sweep's runs on Ray: a local cluster for the sweep's time, or an existing one (`address`).

Each run is one Ray task holding `resources.cpus_per_run` CPUs and `resources.gpus_per_run` GPUs (a fraction lets
small runs share a GPU: Ray hands them the same device in CUDA_VISIBLE_DEVICES). Ray starts a task only where its
resources are free, so the runs on one machine hold disjoint CPU budgets that sum to at most its CPUs, and each
run's torch threads are its budget (task.py). A local cluster gets the machine's cores less
`resources.reserve_cpus` (for a reward server beside the sweep, say). The driver records each outcome as it comes
in; a failed run is recorded and the others go on. An existing cluster must see OUT and the data at the same
paths, and have purplerl installed where the driver's Python is.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from purplerl.errors import UserError, first_line
from purplerl.experiments.sweep.plan import RUNS_DIR, PlannedRun
from purplerl.experiments.sweep.report import write_summary
from purplerl.experiments.sweep.settings import SweepResources, SweepSettings
from purplerl.experiments.sweep.state import (
    EVALS_DIR,
    LOGS_DIR,
    check_configs,
    check_sweep_dir,
    config_file,
    record_outcome,
    to_run,
    write_configs,
    write_plan,
)
from purplerl.experiments.sweep.summary import summarize
from purplerl.experiments.sweep.task import FAILED, FINISHED, INTERRUPTED, RunSpec, ray_task
from purplerl.locks import hold_dir
from purplerl.outputs import make_output_dir

REACH_TIMEOUT_S = 5  # per check of --address: a cluster's GCS answers in milliseconds
# the driver's variables a run reads, passed on to the tasks (a worker of an existing cluster has its own env)
PASSED_ENV_PREFIXES = ("PURPLERL_", "HF_", "TRANSFORMERS_", "TINKER_", "WANDB_", "MLFLOW_")


def machine_cores() -> int:
    """The cores this process may run on (a container's or taskset's share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("purplerl sweep schedules its runs on Ray: pip install 'purplerl[sweep]'") from None
    return ray


@contextmanager
def cluster(settings: SweepSettings, announce: Callable[[str], None]) -> Iterator[Any]:
    """Ray, connected: the cluster this process is already connected to, the one at `address`, or a local one
    started here and stopped when the sweep ends."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    if settings.address is not None:
        _check_reachable(settings.address)
        try:
            ray.init(address=settings.address, log_to_driver=False, logging_level="WARNING")
        except (ConnectionError, ValueError) as err:
            raise UserError(f"cannot join the Ray cluster at --address {settings.address}: {first_line(err)}") from None
    else:
        cpus = machine_cores() - settings.resources.reserve_cpus
        if cpus < settings.resources.cpus_per_run:
            raise UserError(f"resources.cpus_per_run={settings.resources.cpus_per_run} does not fit the {cpus} "
                            f"cores a local cluster gets ({machine_cores()} less reserve_cpus="
                            f"{settings.resources.reserve_cpus})")
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
        announce(f"started a local Ray cluster with {cpus} CPUs")
    try:
        yield ray
    finally:
        ray.shutdown()


def _check_reachable(address: str) -> None:
    """A HOST:PORT that answers nothing, or answers but not as a Ray cluster's GCS (a proxy, another service),
    refused within REACH_TIMEOUT_S each: ray.init would keep retrying for 20 s and more, a log line a second."""
    host, sep, port = address.rpartition(":")
    if address == "auto" or "://" in address or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as err:
        raise UserError(f"cannot reach the Ray cluster at --address {address}: {err.strerror or err}") from None
    problem = _gcs_problem(address)
    if problem is not None:
        raise UserError(f"--address {address} answers, but not as a Ray cluster: {problem}")


def _gcs_problem(address: str) -> str | None:
    """Why `address` is no Ray GCS, asked with the call every driver makes first (GetClusterId), or None."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=REACH_TIMEOUT_S)
        except grpc.RpcError as err:
            code = err.code()
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                return None  # a cluster with token auth: ray.init brings the token
            return f"its answer to a Ray GCS call is {code.name} ({first_line(err.details() or '')[:120]})"
    return None


def fitting_nodes(nodes: list[dict[str, Any]], resources: SweepResources) -> list[str]:
    """The alive nodes (ray.nodes() rows) that can hold one run."""
    fits = []
    for node in nodes:
        have = node.get("Resources", {})
        if node.get("Alive") and have.get("CPU", 0) >= resources.cpus_per_run and \
                have.get("GPU", 0) >= resources.gpus_per_run:
            fits.append(node.get("NodeManagerAddress", "?"))
    return fits


def check_fits(ray: Any, resources: SweepResources) -> None:
    """A run that no node can hold would wait forever: refused before any starts."""
    if not fitting_nodes(ray.nodes(), resources):
        total = ray.cluster_resources()
        raise UserError(f"no node of the Ray cluster has {resources.cpus_per_run} CPUs and {resources.gpus_per_run:g} "
                        f"GPUs for a run (the cluster: {total.get('CPU', 0):g} CPUs, {total.get('GPU', 0):g} GPUs); "
                        f"lower resources.cpus_per_run / gpus_per_run")


def spec_of(out: Path, settings: SweepSettings, run: PlannedRun) -> RunSpec:
    evals = settings.eval
    return RunSpec(
        name=run.name, recipe=str(settings.recipe), config_file=str(config_file(out, run.name)),
        run_dir=str(out / RUNS_DIR / run.name), log_file=str(out / LOGS_DIR / f"{run.name}.log"),
        eval_dir=str(out / EVALS_DIR / run.name) if evals.diversity else None,
        eval_args=("--limit", str(evals.limit), "--n", str(evals.n), *evals.args) if evals.diversity else (),
        cwd=os.getcwd(), env={k: v for k, v in os.environ.items() if k.startswith(PASSED_ENV_PREFIXES)})


def _said(outcome: dict[str, Any], log: str) -> str:
    if outcome["status"] == FINISHED:
        times = ", ".join(f"{stage} {outcome[key]:.0f} s" for stage, key in (("train", "train_s"), ("eval", "eval_s"))
                          if key in outcome)
        return f"finished ({times}; {outcome['threads']} threads)"
    return f"{outcome['status']} in its {outcome.get('stage', 'run')}: {outcome.get('error')} (log: {log})"


def launch(out: Path, settings: SweepSettings, runs: list[PlannedRun],
           announce: Callable[[str], None]) -> None:
    """Run what is left of the sweep; each outcome recorded as it arrives. An interrupted run is not recorded,
    so that a rerun resumes it. Its plan and configs are written once the sweep can start (every run's settings
    match its config file, the cluster joined, a run fits a node): a refused sweep writes neither."""
    check_configs(out, runs)
    start, kept = to_run(out, runs, settings.retry_failed)
    if kept:
        announce(f"{len(kept)} of {len(runs)} runs already have an outcome in {out}: skipped")
    if not start:
        write_configs(out, runs)
        write_plan(out, settings, runs)
        return
    resources = settings.resources
    with cluster(settings, announce) as ray:
        check_fits(ray, resources)
        write_configs(out, runs)
        write_plan(out, settings, runs)
        task = ray.remote(ray_task).options(num_cpus=resources.cpus_per_run, num_gpus=resources.gpus_per_run,
                                            max_retries=0)
        pending = {task.remote(spec_of(out, settings, run)): run for run in start}
        announce(f"{len(start)} runs queued on Ray ({resources.cpus_per_run} CPUs"
                 f"{f', {resources.gpus_per_run:g} GPUs' if resources.gpus_per_run else ''} each)")
        try:
            _collect(ray, pending, out, len(start), announce)
        finally:
            for ref in pending:  # stopped early (Ctrl-C): a cluster that outlives the sweep stops its runs too
                ray.cancel(ref, force=True)


def _collect(ray: Any, pending: dict[Any, PlannedRun], out: Path, total: int,
             announce: Callable[[str], None]) -> None:
    done = 0
    while pending:
        (ref,), _ = ray.wait(list(pending), num_returns=1)
        run = pending.pop(ref)
        try:
            outcome = ray.get(ref)
        except ray.exceptions.RayError as err:  # the worker died (killed, out of memory), or the task raised
            cause = getattr(err, "cause", None)  # a RayTaskError's first line is only where it ran
            outcome = {"name": run.name, "status": FAILED, "stage": "ray", "error": first_line(cause or err)}
        done += 1
        if outcome["status"] != INTERRUPTED:
            record_outcome(out, outcome)
        announce(f"[{done}/{total}] {run.name} {_said(outcome, str(out / LOGS_DIR / f'{run.name}.log'))}")


def run_sweep(settings: SweepSettings, runs: list[PlannedRun], announce: Callable[[str], None] = print,
              ) -> dict[str, Any]:
    """Run what is left of the sweep (a rerun resumes), then write and return its summary."""
    out = check_sweep_dir(settings).resolve()
    make_output_dir(out)
    with hold_dir(out, f"sweep dir {out}", announce):  # one sweep writes a dir; its runs each lock their own
        launch(out, settings, runs, announce)
        summary = summarize(out, settings, runs)
        write_summary(out, summary)
    return summary
