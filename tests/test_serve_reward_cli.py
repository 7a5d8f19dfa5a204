"""`purplerl serve-reward` in a subprocess, and an attack run scored through it that loses its server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

STEPS = 6


def cli_env(cache: Path) -> dict[str, str]:
    # one torch thread: the tiny model gains nothing from more, and the commands here run side by side
    return {**os.environ, "PURPLERL_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "PURPLERL_REWARD_API_KEY": ""}


def start(*args: str | Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "purplerl.cli", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"reward server at {url} did not come up")


def attack_args(model_dir: Path, runs: Path, name: str, url: str) -> list[str | Path]:
    return ["attack", "--model", model_dir, "--steps", str(STEPS), "--batch_size", "2", "--group_size", "2",
            "--max_new_tokens", "8", "--output_dir", runs, "--name", name, "--save_every", "1",
            "--logging.progress", "false", "--reward.toxicity.url", url, "--reward.toxicity.retries", "2",
            "--reward.toxicity.backoff_s", "0.05", "--reward.toxicity.timeout_s", "10"]


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def metrics_lines(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count("\n") if path.is_file() else 0


BAD_OPTIONS = {
    "embedded-label": (["--label", "toxic"], "--label toxic is for HF classifiers"),
    "port-range": (["--port", "70000"], "--port: Input should be less than or equal to 65535"),
    "max-texts": (["--max-texts", "0"], "--max-texts: Input should be greater than or equal to 1"),
    "device": (["--device", "gpu"], "--device: Input should be 'auto', 'cpu' or 'cuda'"),
    "model": (["--model", "/nonexistent/classifier", "--label", "1"], "/nonexistent/classifier"),
}


def test_server_killed_mid_training_stops_the_run_and_resume_finishes(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = cli_env(tmp_path / "cache")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # side jobs started first so they overlap the slow part (imports): bad options, an exposed host
    side = {name: start("serve-reward", *args, env=env) for name, (args, _) in BAD_OPTIONS.items()}
    side["exposed"] = start("serve-reward", "--host", "0.0.0.0", "--model", "/nonexistent/x", "--label", "1", env=env)
    server = start("serve-reward", "--port", str(port), env=env)
    try:
        wait_healthy(url, server)
        side["port-taken"] = start("serve-reward", "--port", str(port), env=env)
        run_dir = tmp_path / "runs" / "r"
        attack = start(*attack_args(tiny_model_dir, tmp_path / "runs", "r", url), env=env)
        deadline = time.monotonic() + 120
        while metrics_lines(run_dir) < 1 and attack.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        server.send_signal(signal.SIGKILL)
        server.wait()
        code, _, err = finish(attack)
        assert code == 1, err
        line = one_error_line(err)
        assert f"reward server {url} did not answer POST /score after 3 attempts" in line, line
        assert 1 <= metrics_lines(run_dir) < STEPS

        saved = yaml.safe_load((run_dir / "config.yaml").read_text())["reward"]["toxicity"]
        assert (saved["url"], saved["server_model"], saved["server_label"]) == (url, "embedded", "toxic")

        server = start("serve-reward", "--port", str(port), env=env)  # the port is free again at once
        wait_healthy(url, server)
        code, out, err = finish(start("attack", "--resume", run_dir, env=env))
        assert code == 0, err
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
        assert all(m["toxicity_truncated/mean"] == 0.0 for m in metrics)
    finally:
        for proc in [server, *side.values()]:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()

    for name, (_, message) in BAD_OPTIONS.items():
        code, _, err = finish(side[name])
        assert code == 2 and message in one_error_line(err), (name, err)
    code, _, err = finish(side["exposed"])
    assert code == 2 and "warning: serving on 0.0.0.0 without an API key" in err, err
    code, _, err = finish(side["port-taken"])
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in one_error_line(err), err


def test_serve_reward_help(tmp_path: Path) -> None:
    code, out, err = finish(start("serve-reward", "--help", env=cli_env(tmp_path)), timeout=60)
    assert code == 0, err
    for text in ("--model", "--label", "--host", "--port", "--device", "--api-key", "PURPLERL_REWARD_API_KEY",
                 "--max-texts", "--max-chars", "[default: 50050]"):
        assert text in out, text
