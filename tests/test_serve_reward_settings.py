"""`purplerl serve-reward` reads --section.field settings and --config like every command, beside its old flags,
and serves any registered text reward term."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.test_serve_reward_cli import cli_env, finish, free_port, one_error_line, start, wait_healthy

pytestmark = pytest.mark.process


def test_a_registered_term_served_by_section_settings(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "serve.yaml"
    config.write_text("serve: {term: repetition, params: {ngram: 2}}\nserver: {max_texts: 4}\n")
    server = start("serve-reward", "--config", config, "--server.port", str(port), env=cli_env(tmp_path))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server)
        # "a b a b a b": 5 bigrams, 2 distinct -> 1 - 2/5 repeated
        answer = httpx.post(f"{url}/score", json={"texts": ["a b a b a b", "hello world"]}).json()
        assert answer["scores"] == [0.6, 0.0] and answer["model"] == "repetition(ngram=2)"
        assert httpx.get(f"{url}/info").json()["max_texts"] == 4
        too_many = httpx.post(f"{url}/score", json={"texts": ["x"] * 5})
        assert too_many.status_code == 413
    finally:
        server.terminate()
        finish(server)


def test_section_settings_are_checked_in_one_line(tmp_path: Path) -> None:
    code, _, err = finish(start("serve-reward", "--server.port", "70000", env=cli_env(tmp_path)))
    assert code == 2 and "server.port" in one_error_line(err) and "65535" in one_error_line(err), err
    code, _, err = finish(start("serve-reward", "--term", "response_entropy", "--server.port", str(free_port()),
                                env=cli_env(tmp_path)))
    assert code != 0 and "response_entropy" in one_error_line(err), err
