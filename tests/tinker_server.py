"""The `tinker_server` fixture, imported by the `tinker`-marked tests (make test-tinker): a real Tinker-API server
(SkyRL's, JAX on CPU) on loopback.

The server runs from its own virtualenv (SKYRL_VENV, default .venv-skyrl: Python 3.12, `skyrl[jax,tinker]`),
serves a tiny random model, and is killed with its whole process group at the end. It starts
its engine as a child through `uv run`, copying the flags it was itself started with: started as
`uv run --no-project --python <venv python> -m skyrl.tinker.api`, the child runs in that venv too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKYRL_VENV = Path(os.environ.get("SKYRL_VENV", ROOT / ".venv-skyrl")).resolve()  # the server runs in its own cwd
STARTUP_S = 180  # a cold start (imports + the first JAX compile) takes ~40 s on 2 cores
TEST_API_KEY = "tml-purplerl-test-key-0123456789"  # what the tests grep run dirs for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v1/healthz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, to the server's whole process group (uv, the API, the engine)."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait_s)
            # the group may outlive its leader: check that nobody is left in it
            os.killpg(process.pid, 0)
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def learnable_model_dir(tiny_model_dir: Path, path: Path) -> Path:
    """The tiny model with its LM head scaled up 25x. Its random head (std 0.02) bounds every logit near
    +-0.6 whatever the hidden state, and the service's LoRA never adapts the head: a policy could barely move
    its next-token distribution. Scaled, the adapted layers can, so an RL run has something to learn."""
    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(tiny_model_dir, path)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.lm_head.weight.mul_(25.0)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tinker_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """A running server: (url, base model dir, API key); TINKER_API_KEY is set to that key for the session."""
    python = SKYRL_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no server venv at {SKYRL_VENV}: run `make test-tinker`, which builds it")
    work = tmp_path_factory.mktemp("tinker_server")
    model_dir = learnable_model_dir(tiny_model_dir, work / "model")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PATH": f"{SKYRL_VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
           "JAX_PLATFORMS": "cpu", "UV_OFFLINE": "1", "UV_NO_CONFIG": "1", "VIRTUAL_ENV": str(SKYRL_VENV)}
    command = ["uv", "run", "--no-project", "--python", str(python), "-m", "skyrl.tinker.api",
               "--base-model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
               "--database-url", f"sqlite:///{work / 'tinker.db'}", "--checkpoints-base", str(work / "checkpoints"),
               "--backend-config", json.dumps({"max_lora_adapters": 64})]
    log = open(work / "server.log", "w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               cwd=work)
    try:
        deadline = time.monotonic() + STARTUP_S
        while not _healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (work / "server.log").read_text()[-2000:]
                pytest.fail(f"the Tinker-API server did not come up on {url}:\n{tail}")
            time.sleep(1)
        previous = os.environ.get("TINKER_API_KEY")
        os.environ["TINKER_API_KEY"] = TEST_API_KEY
        yield url, model_dir, TEST_API_KEY
        if previous is None:
            os.environ.pop("TINKER_API_KEY", None)
        else:
            os.environ["TINKER_API_KEY"] = previous
    finally:
        _stop(process)
        log.close()
