"""purplerl.hub: a hub id that is not cached locally fails in one line within seconds when the hub is unreachable
or HF_HUB_OFFLINE is set (transformers alone retries for ~50 s, 22 lines of warnings); a hub that answers, whatever
the status, is reachable."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from purplerl.hub import hub_unreachable
from tests.conftest import serve_on_loopback

MODEL = "someorg/some-model"


def closed_port() -> int:
    """A loopback port nobody listens on: bound, read, closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NotFound(BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def answering_hub():
    yield from serve_on_loopback(NotFound, path="")


def test_a_closed_port_is_unreachable_and_any_answer_is_reachable(answering_hub: str) -> None:
    assert "refused" in hub_unreachable(f"http://127.0.0.1:{closed_port()}", MODEL, timeout_s=2).lower()
    assert hub_unreachable(answering_hub, MODEL, timeout_s=2) is None


def offline_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") and not k.lower().endswith("_proxy")}
    return {**env, "HF_HOME": str(tmp_path / "hf"), "PURPLERL_CACHE": str(tmp_path / "cache"),
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


@pytest.mark.process
@pytest.mark.parametrize("setting", ["closed_port", "hf_hub_offline"])
def test_an_uncached_hub_id_offline_is_one_line_within_seconds(tmp_path: Path, setting: str) -> None:
    extra = ({"HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"} if setting == "closed_port"
             else {"HF_HUB_OFFLINE": "1"})
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "purplerl", "sample", "--model", MODEL, "--prompt", "hi"],
                          env=offline_env(tmp_path, **extra), capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: cannot load model '{MODEL}': ")
    assert "not in the local Hugging Face cache" in lines[0]
    assert ("unreachable" if setting == "closed_port" else "HF_HUB_OFFLINE is set") in lines[0]
    assert elapsed < 45, f"took {elapsed:.0f} s: a hang guard (~5 s unloaded), transformers' retries take ~50 s"


@pytest.mark.process
def test_a_classifier_hub_id_offline_is_one_line_too(tmp_path: Path) -> None:
    """The reward scorers load their models through the same check (rewards/toxicity.py load_pretrained)."""
    code = ("from transformers import AutoModelForSequenceClassification\n"
            "from purplerl.errors import UserError\n"
            "from purplerl.rewards.toxicity import load_pretrained\n"
            "try:\n"
            f"    load_pretrained(AutoModelForSequenceClassification, {MODEL!r}, 'toxicity classifier')\n"
            "except UserError as err:\n"
            "    print(err)\n")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], env=offline_env(tmp_path, HF_HUB_OFFLINE="1"),
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith(f"cannot load model '{MODEL}': "), done.stdout + done.stderr
    assert "HF_HUB_OFFLINE is set" in done.stdout and "Traceback" not in done.stderr
    assert time.monotonic() - start < 45  # a hang guard: ~5 s unloaded
