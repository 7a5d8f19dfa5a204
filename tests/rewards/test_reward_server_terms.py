"""serve-reward hosting a registered text term other than toxicity, served for real by uvicorn on 127.0.0.1."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from reward_servers import ThreadServer

from purplerl.config import RewardServerConfig
from purplerl.errors import UserError
from purplerl.rewards.client import HTTPScorer
from purplerl.rewards.refusal import RefusalJudge
from purplerl.rewards.repetition import RepetitionScorer
from purplerl.rewards.served import make_server_scorer
from purplerl.rewards.server import create_app, serve

TEXTS = ["I'm sorry, but I can't help with that.", "go go go go go", "Sure: step one, step two.", "A b c, a b c!"]
PROMPTS = ["p1", "p2", "p3", "p4"]


def _serving(term: str, params: dict | None = None) -> ThreadServer:
    served = make_server_scorer(term, params)
    return ThreadServer(create_app(RewardServerConfig(), served.scorer, served.label, served.model))


def test_serves_the_refusal_term() -> None:
    server = _serving("refusal")
    try:
        scorer = HTTPScorer(server.url, retries=0)
        info = scorer.info()
        assert (info.model, info.label) == ("refusal", None)
        assert scorer.score(TEXTS, PROMPTS) == RefusalJudge().score(TEXTS) == [1.0, 0.0, 0.0, 0.0]
        answer = httpx.post(f"{server.url}/score", json={"texts": TEXTS[:1]}).json()
        assert answer["scores"] == [1.0] and answer["model"] == "refusal"
    finally:
        server.stop()


def test_serves_the_repetition_term_with_its_parameters() -> None:
    server = _serving("repetition", {"ngram": 2})
    try:
        scorer = HTTPScorer(server.url, retries=0)
        # /info names the term and every parameter that differs from its default
        assert scorer.info().model == "repetition(ngram=2)"
        # bigrams: none repeat; go go x4 -> 1 - 1/4; none; ab bc ca ab bc -> 1 - 3/5
        assert scorer.score(TEXTS) == pytest.approx([0.0, 0.75, 0.0, 0.4])
        assert scorer.score(TEXTS) == RepetitionScorer(2).score(TEXTS)
    finally:
        server.stop()


def test_a_term_without_text_scores_is_refused() -> None:
    with pytest.raises(UserError) as err:
        make_server_scorer("response_entropy")
    assert str(err.value).startswith("reward term 'response_entropy' reads the policy's per-token entropies")
    assert "text terms: " in str(err.value) and "refusal" in str(err.value)
    with pytest.raises(UserError, match="unknown reward term 'nope'"):
        make_server_scorer("nope")
    with pytest.raises(UserError, match="reward term 'repetition' parameter ngram:"):
        make_server_scorer("repetition", {"ngram": 0})


def test_classifier_settings_beside_a_term_are_refused() -> None:
    # before the port is bound or anything loads: --model would otherwise be silently ignored
    with pytest.raises(UserError, match="--model chooses the toxicity classifier; a served reward term takes"):
        serve(RewardServerConfig(model="org/deberta", label="unsafe"), term="refusal")


SERVE = """
import sys
from purplerl.config import RewardServerConfig
from purplerl.rewards.server import serve
serve(RewardServerConfig(port=int(sys.argv[1])), term="repetition", params={"ngram": 2},
      announce=lambda line: print(line, flush=True))
"""


@pytest.mark.process
def test_serve_runs_a_term_until_interrupted() -> None:
    """`serve(settings, term=..., params=...)`, what `purplerl serve-reward` calls, in its own process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the reward server did not come up"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        assert HTTPScorer(url, retries=0).score(["go go go go go"]) == [0.75]
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert f"reward server: model 'repetition(ngram=2)' label 'None' on {url}" in out, err
    assert "reward server stopped" in out
