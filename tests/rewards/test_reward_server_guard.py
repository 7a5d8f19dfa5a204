"""A Llama-Guard-style causal judge behind the reward server: prompt + response over real HTTP on 127.0.0.1, from
`create_app` in a thread and from `purplerl serve-reward --term guard` in its own process."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from reward_servers import ThreadServer

from purplerl.config import RewardServerConfig
from purplerl.errors import ExperimentError
from purplerl.rewards.client import HTTPScorer
from purplerl.rewards.conversation import LastTurnScorer, conversation_scorer
from purplerl.rewards.judges import CausalGuardJudge
from purplerl.rewards.served import make_server_scorer
from purplerl.rewards.server import create_app
from tests.test_serve_reward_cli import cli_env, finish, free_port, one_error_line, start, wait_healthy

PROMPTS = ["Write the most savage insult.", "Tell me a joke", "hello"]
TEXTS = ["You are a lazy dog.", "Cats and dogs walk into a bar, then say goodbye.", ""]
DIALOGUE = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hello world"},
            {"role": "user", "content": "Write the most savage insult."},
            {"role": "assistant", "content": "You are a lazy dog."}]


@pytest.fixture
def guard_server(tiny_model_dir: Path):
    served = make_server_scorer("guard", {"model": str(tiny_model_dir)})
    server = ThreadServer(create_app(RewardServerConfig(), served.scorer, served.label, served.model))
    yield server
    server.stop()


def test_a_served_guard_scores_prompt_and_response(guard_server: ThreadServer, tiny_model_dir: Path) -> None:
    judge = CausalGuardJudge(str(tiny_model_dir))
    scorer = HTTPScorer(guard_server.url, retries=0)
    assert scorer.info().model == f"guard(model={tiny_model_dir})"
    expected = judge.score(TEXTS, PROMPTS)
    assert scorer.score(TEXTS, PROMPTS) == pytest.approx(expected, abs=1e-6)
    # the prompt is read: the same answer to another prompt scores otherwise
    other = scorer.score(TEXTS[:1], ["Tell me a joke"])[0]
    assert abs(other - expected[0]) > 1e-6 and other == pytest.approx(judge.score(TEXTS[:1], ["Tell me a joke"])[0])
    # over HTTP a dialogue is its last answer with the history as the prompt, as for any plain scorer
    over_http = conversation_scorer(scorer).score_conversations([DIALOGUE])
    assert over_http == pytest.approx(LastTurnScorer(judge).score_conversations([DIALOGUE]), abs=1e-6)


def test_a_request_without_prompts_is_refused_with_422(guard_server: ThreadServer) -> None:
    answer = httpx.post(f"{guard_server.url}/score", json={"texts": TEXTS})
    assert answer.status_code == 422
    assert answer.json()["detail"] == ("scorer 'guard' judges each text with the prompt it answers: send prompts "
                                       "(one per text)")
    with pytest.raises(ExperimentError, match=r"refused the request with HTTP 422: scorer 'guard' judges each text"):
        HTTPScorer(guard_server.url, retries=3, sleep=pytest.fail).score(TEXTS)  # a 4xx is never retried
    assert httpx.get(f"{guard_server.url}/health").json()["batches"] == 0  # refused before any scoring call


@pytest.mark.process
def test_serve_reward_hosts_the_guard_term(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    server = start("serve-reward", "--term", "guard", "--serve.params.model", tiny_model_dir, "--server.port",
                   str(port), env=cli_env(tmp_path))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server)
        scores = HTTPScorer(url, retries=0).score(TEXTS, PROMPTS)
        assert scores == pytest.approx(CausalGuardJudge(str(tiny_model_dir)).score(TEXTS, PROMPTS), abs=1e-6)
    finally:
        server.terminate()
        finish(server)
    code, _, err = finish(start("serve-reward", "--term", "guard", "--server.port", str(free_port()),
                                env=cli_env(tmp_path)))
    assert code == 2 and one_error_line(err).startswith("error: reward term 'guard' needs model"), err
