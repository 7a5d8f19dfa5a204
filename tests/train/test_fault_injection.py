"""SIGKILL inside checkpoint saving and log writing, again and again: every resume finishes, and the final
adapter, metrics and samples equal those of the same run left alone.

A counting run lists every file-system event of an uninterrupted run (tests/fault_injection.py) and is the
reference. Each chain kills its first process at an event of one kind (a torn log line, half an adapter file,
an fsync before the manifest, the rename, the rotation of old checkpoints...) and then each resume at a
random later event, until a resume finishes. Events inside one run: ~110; kills: 4 chains x 6 = 24.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from purplerl.runs.checkpoints import checkpoint_candidates, verify_checkpoint
from purplerl.runs.layout import CHECKPOINTS_DIR as CHECKPOINTS

pytestmark = pytest.mark.process

STEPS = 6
KILLS_PER_CHAIN = 6
WRAPPER = Path(__file__).resolve().parents[1] / "fault_injection.py"
# the first kill of each chain: an event whose path matches this, so every kind of write is cut at least once
FIRST_KILLS = {
    "torn log line": lambda kind, path: kind == "write" and path.endswith(".jsonl"),
    "half an adapter file": lambda kind, path: kind == "safetensors",
    "optimizer half written or unsynced": lambda kind, path: path.endswith("optimizer.pt"),
    "the rename into place": lambda kind, path: kind == "rename" and path.endswith(".tmp"),
}


def env(cache: Path) -> dict[str, str]:
    return {**os.environ, "PURPLERL_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def attack_args(model: Path, out: Path, name: str) -> list[str]:
    return ["attack", "--model", str(model), "--steps", str(STEPS), "--batch_size", "2", "--group_size", "2",
            "--max_new_tokens", "6", "--seed", "5", "--save_every", "2", "--run.keep_last", "2",
            "--output_dir", str(out), "--name", name, "--logging.progress", "false"]


def launch(run_dir: Path, kill_at: int, record: Path, cli: list[str], environ: dict[str, str],
           list_events: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(WRAPPER), "--run-dir", str(run_dir), "--kill-at", str(kill_at), "--record", str(record),
           *(["--list-events"] if list_events else []), "--", *cli]
    return subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=600)


def newest_step(run_dir: Path) -> int:
    intact = [p for p in checkpoint_candidates(run_dir) if verify_checkpoint(p) is None]
    return int(intact[-1].name.split("_")[1]) if intact else 0


def run_chain(index: int, first_kill: int, events: int, model: Path, out: Path, environ) -> dict:
    """Kill the first process at `first_kill`, every resume at a random event, until a resume finishes."""
    rng = random.Random(index)
    run_dir, record = out / f"chain{index}", out / f"chain{index}.record"
    kills: list[str] = []
    kill_at = first_kill
    while True:
        # a run killed before its config.yaml was written is started again, as a user would
        cli = ["attack", "--resume", str(run_dir)] if (run_dir / "config.yaml").is_file() else \
            attack_args(model, out, run_dir.name)
        result = launch(run_dir, kill_at, record, cli, environ)
        lines = record.read_text().splitlines() if record.is_file() else []
        if result.returncode == 0:
            assert lines and lines[-1].startswith("done"), result.stderr[-2000:]
            return {"run_dir": run_dir, "kills": kills}
        assert result.returncode == -9, f"chain {index} after kills {kills}: {result.stderr[-3000:]}"
        kills.append(lines[-1])
        if len(kills) == KILLS_PER_CHAIN:
            kill_at = 0  # the last resume runs to the end
        else:
            remaining = events * (STEPS - newest_step(run_dir)) // STEPS + 8
            kill_at = rng.randint(1, remaining)


@pytest.fixture(scope="module")
def chains(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    environ = env(tmp_path_factory.mktemp("cache"))
    out = tmp_path_factory.mktemp("faults")
    reference = out / "reference"
    listing = out / "reference.events"
    counted = launch(reference, 0, listing, attack_args(tiny_model_dir, out, "reference"), environ, list_events=True)
    assert counted.returncode == 0, counted.stderr[-3000:]
    events = [line.split(" ", 2) for line in listing.read_text().splitlines() if not line.startswith("done")]
    firsts = []
    rng = random.Random(0)
    for matches in FIRST_KILLS.values():
        picks = [int(n) for n, kind, path in events if matches(kind, path)]
        assert picks, "the counting run has no event of this kind"
        firsts.append(rng.choice(picks))
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(run_chain, i, first, len(events), tiny_model_dir, out, environ)
                   for i, first in enumerate(firsts)]
        done = [f.result() for f in futures]
    return {"reference": reference, "chains": done}


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_enough_kills_landed_inside_saving_and_logging(chains: dict) -> None:
    kills = [k for chain in chains["chains"] for k in chain["kills"]]
    assert len(kills) >= 20, kills
    where = " ".join(kills)
    assert ".jsonl" in where and "adapter_model.safetensors" in where and "optimizer.pt" in where, kills
    assert "rename" in where and "fsync" in where, kills


def test_every_chain_ends_with_the_uninterrupted_metrics(chains: dict) -> None:
    reference = rows(chains["reference"] / "metrics.jsonl")
    assert [r["step"] for r in reference] == list(range(1, STEPS + 1))
    for chain in chains["chains"]:
        got = rows(chain["run_dir"] / "metrics.jsonl")
        assert [r["step"] for r in got] == [r["step"] for r in reference], chain["kills"]
        for a, b in zip(reference, got, strict=True):
            for key, value in a.items():
                if key.startswith("time/"):
                    continue
                expected = pytest.approx(value, rel=1e-5, abs=1e-6) if isinstance(value, float) else value
                assert b[key] == expected, (key, a["step"], chain["kills"])


def test_every_chain_ends_with_the_uninterrupted_samples(chains: dict) -> None:
    keys = ("step", "uid", "completion", "num_tokens", "finish_reason")
    reference = [tuple(r[k] for k in keys) for r in rows(chains["reference"] / "samples.jsonl")]
    assert len(reference) == STEPS * 4
    for chain in chains["chains"]:
        got = [tuple(r[k] for k in keys) for r in rows(chain["run_dir"] / "samples.jsonl")]
        assert got == reference, chain["kills"]


def test_every_chain_ends_with_the_uninterrupted_adapter(chains: dict) -> None:
    final = f"{CHECKPOINTS}/step_{STEPS:06d}/adapter_model.safetensors"
    expected = load_file(str(chains["reference"] / final))
    assert any(float(t.abs().max()) > 0 for name, t in expected.items() if "lora_B" in name)  # it trained
    for chain in chains["chains"]:
        got = load_file(str(chain["run_dir"] / final))
        assert got.keys() == expected.keys()
        for name, tensor in expected.items():
            torch.testing.assert_close(got[name], tensor, rtol=1e-6, atol=1e-6, msg=f"{name} {chain['kills']}")


def test_nothing_stale_or_damaged_is_left(chains: dict) -> None:
    for chain in chains["chains"]:
        root = chain["run_dir"] / CHECKPOINTS
        names = sorted(p.name for p in root.iterdir())
        assert names == ["step_000004", "step_000006"], (names, chain["kills"])
        assert all(verify_checkpoint(root / n) is None for n in names)
