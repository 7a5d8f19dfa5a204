"""`purplerl serve-reward` in a subprocess, and an attack run scored through it that loses its server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

pytestmark = pytest.mark.process

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
            "--logging.progress", "false", "--reward.terms.toxicity.params.url", url,
            "--reward.terms.toxicity.params.retries", "2", "--reward.terms.toxicity.params.backoff_s", "0.05",
            "--reward.terms.toxicity.params.timeout_s", "10"]


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
    "score-timeout": (["--score-timeout-s", "0"], "--score-timeout-s: Input should be greater than 0"),
    "non-ascii-key": (["--api-key", "clé"], "--api-key (or env PURPLERL_REWARD_API_KEY): an API key must be "
                                            "printable ASCII without spaces, but character 3 of 3 is not"),
}
KEY_PROBLEM = "an API key must be printable ASCII without spaces, but character 2 of 4 is not"


def test_server_killed_mid_training_stops_the_run_and_resume_finishes(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = cli_env(tmp_path / "cache")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # side jobs started first so they overlap the slow part (imports): bad options, an exposed host
    side = {name: start("serve-reward", *args, env=env) for name, (args, _) in BAD_OPTIONS.items()}
    side["exposed"] = start("serve-reward", "--host", "0.0.0.0", "--model", "/nonexistent/x", "--label", "1", env=env)
    # a key that can never match, from the env var, on both sides
    side["env-key-server"] = start("serve-reward", env={**env, "PURPLERL_REWARD_API_KEY": "k€y!"})
    side["env-key-client"] = start(*attack_args(tiny_model_dir, tmp_path / "runs", "key", url),
                                   env={**env, "PURPLERL_REWARD_API_KEY": "k€y!"})
    server = start("serve-reward", "--port", str(port), env=env)
    try:
        wait_healthy(url, server)
        side["port-taken"] = start("serve-reward", "--port", str(port), env=env)
        run_dir = tmp_path / "runs" / "r"
        attack = start(*attack_args(tiny_model_dir, tmp_path / "runs", "r", url), env=env)
        deadline = time.monotonic() + 120
        while metrics_lines(run_dir) < 1 and attack.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        # the attack is paused while the server dies, so it cannot finish its last steps in between
        attack.send_signal(signal.SIGSTOP)
        server.send_signal(signal.SIGKILL)
        server.wait()
        attack.send_signal(signal.SIGCONT)
        code, _, err = finish(attack)
        assert code == 1, err
        line = one_error_line(err)
        assert f"reward server {url} did not answer POST /score after 3 attempts" in line, line
        assert 1 <= metrics_lines(run_dir) < STEPS

        saved = yaml.safe_load((run_dir / "config.yaml").read_text())["reward"]["terms"]["toxicity"]["params"]
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
    code, _, err = finish(side["env-key-server"])
    assert code == 2 and one_error_line(err) == f"error: --api-key (or env PURPLERL_REWARD_API_KEY): {KEY_PROBLEM}"
    code, _, err = finish(side["env-key-client"])
    assert code == 2, err
    assert one_error_line(err) == f"error: reward server API key (env PURPLERL_REWARD_API_KEY): {KEY_PROBLEM}"
    code, _, err = finish(side["port-taken"])
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in one_error_line(err), err


def test_serve_reward_help(tmp_path: Path) -> None:
    code, out, err = finish(start("serve-reward", "--help", env=cli_env(tmp_path)), timeout=60)
    assert code == 0, err
    for text in ("--model", "--label", "--host", "--port", "--device", "--api-key", "PURPLERL_REWARD_API_KEY",
                 "--max-texts", "--max-chars", "[default: 50050]", "--score-timeout-s", "--header-timeout-s",
                 "--body-timeout-s", "--keep-alive-s", "--max-connections", "--max-header-bytes"):
        assert text in out, text


class Lines:
    """A process's stderr, read line by line in a thread, so a test can wait for a line without a deadline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stderr:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()

    def wait_for(self, text: str, timeout: float = 60) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: any(text in line for line in self.lines), timeout), self.lines


def raw_request(port: int, data: bytes, read: bool) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(data)
        return sock.recv(65536) if read else b""


def test_slow_and_vanishing_clients_are_one_log_line_each(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "cache")
    port = free_port()
    server = start("serve-reward", "--port", str(port), "--header-timeout-s", "0.2", "--body-timeout-s", "0.2",
                   env=env)
    stderr = Lines(server)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", server)
        for _ in range(3):  # gone mid-body: uvicorn alone logged a ~60-line traceback for each
            raw_request(port, b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"texts\": [", False)
        raw_request(port, b"POST /score HTTP/1.1\r\n", read=True)  # stalled headers: closed
        answer = raw_request(port, b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{", read=True)
        assert answer.startswith(b"HTTP/1.1 408 ")
        stderr.wait_for("sent no complete request body")
        stderr.wait_for("sent no complete request headers")
        with stderr.changed:
            assert stderr.changed.wait_for(lambda: sum("disconnected" in line for line in stderr.lines) == 3, 60)
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 0
        stderr.thread.join(timeout=60)
    lines = stderr.lines
    assert lines[0].startswith("reward server: model 'embedded'") and lines[-1] == "reward server stopped", lines
    assert not [line for line in lines if "Traceback" in line or "ERROR" in line], lines
    disconnects = [line for line in lines if "disconnected" in line]
    assert len(disconnects) == 3 and all(line.endswith("before sending its whole request body (500 bytes declared): "
                                                       "request dropped") for line in disconnects), lines
    assert sum("sent no complete request headers within header_timeout_s=0.2 s: connection closed" in line
               for line in lines) == 1, lines
    assert sum("sent no complete request body within body_timeout_s=0.2 s: answered 408" in line
               for line in lines) == 1, lines
    assert len(lines) == 2 + 5, lines  # start, stop, and one line for each of the 5 clients
