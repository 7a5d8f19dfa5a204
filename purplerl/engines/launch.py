"""`purplerl <recipe> --engine.procs N`: the same command again in N processes under torchrun's elastic agent.

The agent is torchrun's own (`torch.distributed.launcher`), run in this process as `torchrun --standalone`
would: a rendezvous on this machine at a free port, no restarts, a dead worker stopping the others at once.
Each worker is `python -m purplerl` with the same arguments; torchrun's environment (RANK, WORLD_SIZE) tells it
that it is a worker, so it joins the group instead of launching again. Across machines, run torchrun yourself
with its rendezvous flags (README, "Scaling out").
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid

from purplerl.errors import ExperimentError

# the agent's messages on stopping the survivors repeat what the one line says
_AGENT_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher")


def _describe(failure) -> str:
    if failure.exitcode < 0:
        return f"was killed by {failure.signal_name()}"
    return f"exited with status {failure.exitcode}"


def run_workers(procs: int, argv: list[str], resume_hint: str) -> None:
    """Run `python -m purplerl *argv` as `procs` ranks on this machine and wait for them. A rank that dies
    (killed, or failed) stops the others; raises one ExperimentError line naming it."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in _AGENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=procs, run_id=uuid.uuid4().hex,
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0)
    try:
        elastic_launch(config, sys.executable)("-m", "purplerl", *argv)
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        if failure.exitcode > 0:  # the rank said why itself (its `error: ...` line): nothing to add
            raise SystemExit(failure.exitcode) from None
        raise ExperimentError(f"rank {rank} {_describe(failure)}; the other processes were stopped; "
                              f"continue with --resume {resume_hint}") from None


def stop_quietly_on_sigterm() -> None:
    """In a worker: when torchrun's agent stops this rank because another one died, say so in one line."""
    rank = os.environ.get("RANK", "?")

    def stop(signum: int, frame) -> None:
        print(f"error: rank {rank}: stopped by torchrun (another process of the run ended); the last checkpoint "
              f"is kept", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def stop_silently_on_sigterm() -> None:
    """In a worker that is about to say why it failed: the agent's SIGTERM after that adds no second line."""
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(128 + signum))
