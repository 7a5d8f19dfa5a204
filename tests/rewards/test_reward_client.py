"""The reward server's client against scripted answers (httpx.MockTransport) and a closed port."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import httpx
import pytest

from purplerl.config import ToxicityConfig, load_config
from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.client import HTTPScorer, record_server
from purplerl.rewards.schema import ServerInfo
from purplerl.rewards.toxicity import make_toxicity_scorer

URL = "http://reward.test:50050"
INFO = {"model": "org/deberta", "label": "unsafe", "version": "0.1.0", "max_texts": 3, "max_chars": 100,
        "max_batch_texts": 64, "max_body_bytes": 10**6}


class Script:
    """A fake server: answers /info with INFO and each /score with the next scripted answer."""

    def __init__(self, *answers: Callable[[list[str]], httpx.Response]) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/info":
            return httpx.Response(200, json=INFO)
        texts = json.loads(request.content)["texts"]
        return self.answers.pop(0)(texts) if len(self.answers) > 1 else self.answers[0](texts)

    def scorer(self, **kwargs: float) -> HTTPScorer:
        options = {"retries": 2, "backoff_s": 0.001, **kwargs}
        return HTTPScorer(URL, transport=httpx.MockTransport(self), **options)


def ok(texts: list[str], model: str = "org/deberta", truncated: list[int] | None = None) -> httpx.Response:
    return httpx.Response(200, json={"scores": [len(t) / 10 for t in texts], "model": model, "label": "unsafe",
                                     "truncated": truncated or []})


def status(code: int, detail: str = "nope") -> Callable[[list[str]], httpx.Response]:
    return lambda texts: httpx.Response(code, json={"detail": detail})


def test_scores_and_sends_prompts() -> None:
    script = Script(ok)
    assert script.scorer().score(["a", "abc"], prompts=["p", "q"]) == [0.1, 0.3]
    assert json.loads(script.requests[0].content) == {"texts": ["a", "abc"], "prompts": ["p", "q"]}


def test_splits_batches_to_max_texts_and_counts_truncation() -> None:
    script = Script(lambda t: ok(t, truncated=[1]))
    scorer = script.scorer()
    assert scorer.info() == ServerInfo.model_validate(INFO)
    assert scorer.score(["a", "bb", "ccc", "dddd", "e"]) == [0.1, 0.2, 0.3, 0.4, 0.1]
    assert [len(json.loads(r.content)["texts"]) for r in script.requests[1:]] == [3, 2]  # max_texts=3
    assert scorer.last_truncated == [1, 4] and scorer.truncated_total == 2


def test_5xx_is_retried_then_succeeds() -> None:
    script = Script(status(503, "busy"), status(500, "oom"), ok)
    assert script.scorer().score(["ab"]) == [0.2]
    assert len(script.requests) == 3


def test_5xx_until_retries_run_out_names_url_and_last_error() -> None:
    script = Script(status(500, "scorer 'toxicity' failed: CUDA out of memory"))
    with pytest.raises(ExperimentError) as info:
        script.scorer(retries=2).score(["ab"])
    assert str(info.value) == (f"reward server {URL} did not answer POST /score after 3 attempts; last error: "
                               "HTTP 500: scorer 'toxicity' failed: CUDA out of memory")
    assert len(script.requests) == 3


def test_4xx_is_not_retried() -> None:
    script = Script(status(413, "9 texts in one request is over max_texts=8; split the batch"))
    with pytest.raises(ExperimentError, match=r"HTTP 413: 9 texts in one request is over max_texts=8"):
        script.scorer().score(["a"])
    assert len(script.requests) == 1


def test_backoff_doubles() -> None:
    script = Script(status(502))
    started = time.monotonic()
    with pytest.raises(ExperimentError, match="after 3 attempts"):
        script.scorer(retries=2, backoff_s=0.1).score(["a"])
    assert 0.3 <= time.monotonic() - started < 2  # 0.1 + 0.2


def test_closed_port_fails_with_a_clear_error() -> None:
    with socket.socket() as sock:  # a port that was just free: nothing listens there
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(ExperimentError) as info:
        HTTPScorer(url, retries=1, backoff_s=0.01).score(["a"])
    assert str(info.value).startswith(f"reward server {url} did not answer POST /score after 2 attempts; "
                                      "last error: ConnectError: ")
    assert "\n" not in str(info.value)


def test_timeout_is_retried() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(ExperimentError, match="after 2 attempts; last error: ReadTimeout: timed out"):
        HTTPScorer(URL, retries=1, backoff_s=0.001, transport=httpx.MockTransport(slow)).score(["a"])


@pytest.mark.parametrize(("answer", "message"), [
    (lambda t: httpx.Response(200, json={"scores": [0.5] * (len(t) + 1), "model": "org/deberta", "label": "unsafe"}),
     "returned 2 scores for 1 texts"),
    (lambda t: httpx.Response(200, text="<html>proxy error</html>"), "answered with something other than JSON"),
    (lambda t: httpx.Response(200, json={"scores": ["high"], "model": "m", "label": None}), "does not understand"),
    (lambda t: ok(t, model="other/model"), "now scores with model 'other/model'"),
])
def test_bad_answers_stop_the_run(answer: Callable[[list[str]], httpx.Response], message: str) -> None:
    scorer = Script(answer).scorer()
    scorer.info()
    with pytest.raises(ExperimentError, match=message):
        scorer.score(["a"])


def test_empty_batch_sends_nothing() -> None:
    script = Script(ok)
    assert script.scorer().score([]) == []
    assert script.requests == []


def test_bad_client_settings() -> None:
    with pytest.raises(UserError, match="http:// or https://"):
        HTTPScorer("localhost:50050")
    with pytest.raises(UserError, match="timeout_s > 0"):
        HTTPScorer(URL, timeout_s=0)


# ------------------------------------------------------------------------------------------------ config


def test_make_toxicity_scorer_uses_the_server_and_the_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURPLERL_REWARD_API_KEY", "k3y")
    scorer = make_toxicity_scorer(ToxicityConfig(url=URL, retries=5, backoff_s=0.25))
    assert isinstance(scorer, HTTPScorer)
    assert (scorer.url, scorer.retries, scorer.backoff_s) == (URL, 5, 0.25)
    assert scorer._client.headers["authorization"] == "Bearer k3y"
    monkeypatch.delenv("PURPLERL_REWARD_API_KEY")
    assert "authorization" not in make_toxicity_scorer(ToxicityConfig(url=URL))._client.headers


def test_config_url_checks() -> None:
    assert load_config(None, ["--reward.toxicity.url", URL + "/"]).reward.toxicity.url == URL
    with pytest.raises(UserError, match="reward.toxicity.url.*http:// or https://"):
        load_config(None, ["--reward.toxicity.url", "localhost:50050"])
    with pytest.raises(UserError, match="either url .* or model"):
        load_config(None, ["--reward.toxicity.url", URL, "--toxicity_model", "org/clf", "--toxicity_label", "1"])


def test_record_server() -> None:
    cfg = ToxicityConfig(url=URL)
    info = ServerInfo.model_validate(INFO)
    record_server(cfg, info)
    assert (cfg.server_model, cfg.server_label) == ("org/deberta", "unsafe")
    record_server(cfg, info)  # a resumed run against the same server
    with pytest.raises(ExperimentError, match="serves model 'embedded' label 'toxic'.*scored by model 'org/deberta'"):
        record_server(cfg, info.model_copy(update={"model": "embedded", "label": "toxic"}))
