"""The three tracker backends behind `purplerl.train.trackers`, each writing inside the run dir and never to
the network. Their packages are imported when a tracker opens (the `trackers` extra), not with this module."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from purplerl.train.trackers import TrackerRun

PROJECT = "purplerl"  # the W&B project and the MLflow experiment every run logs to
PARAM_CHARS = 500  # MLflow's limit on a param value in older servers (newer ones take 6000): safe for both
MLFLOW_BATCH = 100  # log_batch takes at most 100 params (and 1000 metrics) per call


def columns(rows: list[dict[str, Any]]) -> list[str]:
    """Every key of the rows, in the order they first appear."""
    return list(dict.fromkeys(k for row in rows for k in row))


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table (TensorBoard's text plugin renders it)."""

    def cell(value: Any) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return " ".join(text.split()).replace("|", "\\|")  # a line break or a bar would end the cell

    names = columns(rows)
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join(cell(row.get(k, "")) for k in names) + " |" for row in rows]
    return "\n".join(lines)


def flat(node: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'training': {'lr': 1e-4}} -> {'training.lr': 1e-4}."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


class WandbTracker:
    """A W&B run in offline mode under run_dir/wandb (`wandb sync` uploads it); a resume continues its id."""

    def __init__(self, run: TrackerRun) -> None:
        import wandb

        self.wandb = wandb
        settings = wandb.Settings(mode="offline", console="off", silent=True, x_disable_stats=True,
                                  disable_git=True, save_code=False, x_save_requirements=False,
                                  disable_job_creation=True)
        resuming = run.resume_id is not None
        self.handle = wandb.init(project=PROJECT, name=run.run_dir.name, dir=str(run.run_dir), id=run.resume_id,
                                 resume="allow" if resuming else None, config=None if resuming else run.config,
                                 settings=settings)
        if resuming:  # a resume may change settings (more steps, another lr): the config shows what runs now
            self.handle.config.update(run.config, allow_val_change=True)
        self.run_id = self.handle.id

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        self.handle.log(values, step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        names = columns(rows)
        table = self.wandb.Table(columns=names, data=[[row.get(k) for k in names] for row in rows])
        self.handle.log({"samples": table}, step=step)

    def close(self, failed: bool) -> None:
        self.handle.finish(exit_code=1 if failed else 0)


class TensorBoardTracker:
    """Event files under run_dir/tensorboard: scalars per step, each step's samples as a markdown table. A
    resume writes a purge at its first step, so TensorBoard hides what an earlier segment logged from there."""

    def __init__(self, run: TrackerRun) -> None:
        from tensorboardX import SummaryWriter

        # tensorboardX names a file by the second it opened: two segments opened within one second would share
        # it (the second overwriting the first); the nanoseconds keep them apart, in the order they were written
        self.writer = SummaryWriter(logdir=str(run.run_dir / "tensorboard"), purge_step=run.first_step,
                                    filename_suffix=f".{time.time_ns()}")
        text = yaml.safe_dump(run.config, sort_keys=False)
        self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()),  # a code block
                             global_step=run.first_step)
        self.run_id = "tensorboard"  # one log dir per run dir

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, global_step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.writer.add_text("samples", markdown_table(rows), global_step=step)

    def close(self, failed: bool) -> None:
        self.writer.close()


@contextmanager
def _file_store_allowed() -> Iterator[None]:
    # MLflow 3 keeps its file store only behind this switch (a database store needs SQLAlchemy and a migration
    # per new run dir); it is read when the store is made, so it is set for that moment only
    before = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        if before is None:
            del os.environ["MLFLOW_ALLOW_FILE_STORE"]
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = before


class MlflowTracker:
    """An MLflow run in a file store under run_dir/mlruns (`mlflow ui --backend-store-uri run_dir/mlruns`):
    metrics with their step, params (flattened config), config.json and one samples table per step."""

    def __init__(self, run: TrackerRun) -> None:
        from mlflow.tracking import MlflowClient

        with _file_store_allowed():
            self.client = MlflowClient(tracking_uri=(run.run_dir / "mlruns").resolve().as_uri())
        if run.resume_id is not None:
            self.run_id = run.resume_id
            self.client.update_run(self.run_id, status="RUNNING")
            # params cannot change once logged: a resume records the config it runs with as an artifact
            self.client.log_dict(self.run_id, run.config, f"config_from_step_{run.first_step:06d}.json")
            return
        experiment = self.client.get_experiment_by_name(PROJECT)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(PROJECT)
        self.run_id = self.client.create_run(experiment_id, run_name=run.run_dir.name).info.run_id
        self._log_params(flat(run.config))
        self.client.log_dict(self.run_id, run.config, "config.json")

    def _log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        # long values (a system prompt, a filter list) are cut; config.json keeps them whole
        items = [Param(k, str(v)[:PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, len(items), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + MLFLOW_BATCH])

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in values.items()]
        for i in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[i:i + 1000])

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        # MLflow stores tables through pandas, floats to 10 decimals; samples.jsonl keeps them whole
        data = {k: [row.get(k) for row in rows] for k in columns(rows)}
        self.client.log_table(self.run_id, data=data, artifact_file=f"samples/step_{step:06d}.json")

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")

