"""The reward server's client against scripted answers (httpx.MockTransport) and a closed port."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

import httpx
import pytest

from purplerl.config import ToxicityConfig
from purplerl.errors import ExperimentError, UserError
from purplerl.launch import run_settings
from purplerl.rewards.client import HTTPScorer, encode_string, record_server, score_body, split_ranges
from purplerl.rewards.schema import ServerInfo
from purplerl.rewards.toxicity import make_toxicity_scorer

URL = "http://reward.test:50050"
INFO = {"model": "org/deberta", "label": "unsafe", "version": "0.1.0", "max_texts": 3, "max_chars": 100,
        "max_batch_texts": 64, "max_body_bytes": 10**6}


class Script:
    """A fake server: answers /info with INFO and each /score with the next scripted answer."""

    def __init__(self, *answers: Callable[[list[str]], httpx.Response], **limits: int) -> None:
        self.answers = list(answers)
        self.info = {**INFO, **limits}
        self.requests: list[httpx.Request] = []
        self.sleeps: list[float] = []  # the client's waits between retries, recorded instead of slept

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/info":
            return httpx.Response(200, json=self.info)
        texts = json.loads(request.content)["texts"]
        return self.answers.pop(0)(texts) if len(self.answers) > 1 else self.answers[0](texts)

    @property
    def bodies(self) -> list[bytes]:
        return [r.content for r in self.requests if r.url.path == "/score"]

    def scorer(self, **kwargs: float) -> HTTPScorer:
        options = {"retries": 2, "backoff_s": 0.001, **kwargs}
        return HTTPScorer(URL, transport=httpx.MockTransport(self), sleep=self.sleeps.append, **options)


def ok(texts: list[str], model: str = "org/deberta", truncated: list[int] | None = None) -> httpx.Response:
    return httpx.Response(200, json={"scores": [len(t) / 10 for t in texts], "model": model, "label": "unsafe",
                                     "truncated": truncated or []})


def status(code: int, detail: str = "nope") -> Callable[[list[str]], httpx.Response]:
    return lambda texts: httpx.Response(code, json={"detail": detail})


def test_scores_and_sends_prompts() -> None:
    script = Script(ok)
    assert script.scorer().score(["a", "abc"], prompts=["p", "q"]) == [0.1, 0.3]
    assert [r.url.path for r in script.requests] == ["/info", "/score"]  # the limits are read first
    assert script.bodies == [b'{"texts":["a","abc"],"prompts":["p","q"]}']
    assert script.requests[1].headers["content-type"] == "application/json"


def test_splits_batches_to_max_texts_and_counts_truncation() -> None:
    script = Script(lambda t: ok(t, truncated=[1]))
    scorer = script.scorer()
    assert scorer.info() == ServerInfo.model_validate(INFO)
    assert scorer.score(["a", "bb", "ccc", "dddd", "e"]) == [0.1, 0.2, 0.3, 0.4, 0.1]
    assert [len(json.loads(body)["texts"]) for body in script.bodies] == [3, 2]  # max_texts=3
    assert scorer.last_truncated == [1, 4] and scorer.truncated_total == 2
    assert [r.url.path for r in script.requests].count("/info") == 1  # info() already read the limits


def test_5xx_is_retried_then_succeeds() -> None:
    script = Script(status(503, "busy"), status(500, "oom"), ok)
    assert script.scorer(backoff_s=0.25).score(["ab"]) == [0.2]
    assert len(script.bodies) == 3
    assert script.sleeps == [0.25, 0.5]


def test_5xx_until_retries_run_out_names_url_and_last_error() -> None:
    script = Script(status(500, "scorer 'toxicity' failed: CUDA out of memory"))
    with pytest.raises(ExperimentError) as info:
        script.scorer(retries=2).score(["ab"])
    assert str(info.value) == (f"reward server {URL} did not answer POST /score after 3 attempts; last error: "
                               "HTTP 500: scorer 'toxicity' failed: CUDA out of memory")
    assert len(script.bodies) == 3


def test_4xx_is_not_retried() -> None:
    script = Script(status(413, "9 texts in one request is over max_texts=8; split the batch"))
    with pytest.raises(ExperimentError, match=r"HTTP 413: 9 texts in one request is over max_texts=8"):
        script.scorer().score(["a"])
    assert len(script.bodies) == 1 and script.sleeps == []


def test_backoff_doubles_up_to_its_cap() -> None:
    script = Script(status(502))
    with pytest.raises(ExperimentError, match="after 3 attempts"):
        script.scorer(retries=2, backoff_s=0.1).score(["a"])
    assert script.sleeps == [0.1, 0.2]
    script = Script(status(502))
    with pytest.raises(ExperimentError, match="after 5 attempts"):
        script.scorer(retries=4, backoff_s=10).score(["a"])
    assert script.sleeps == [10, 20, 30, 30]  # MAX_BACKOFF_S


def test_closed_port_fails_with_a_clear_error() -> None:
    with socket.socket() as sock:  # a port that was just free: nothing listens there
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(ExperimentError) as info:
        HTTPScorer(url, retries=1, backoff_s=0.01).score(["a"])
    assert str(info.value).startswith(f"reward server {url} did not answer GET /info after 2 attempts; "
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


# ------------------------------------------------------------------------------------- limits from /info


def test_split_ranges_by_count_and_bytes() -> None:
    # frame 10, separator 1, max 20 bytes: [3, 4] = 10 + 3 + 1 + 4 = 18; + 1 + 5 would be 24
    assert split_ranges([3, 4, 5, 2, 9], frame=10, separator=1, max_items=3, max_bytes=20) == [(0, 2), (2, 4), (4, 5)]
    # a body of exactly max_bytes fits: 10 + 4 + 1 + 5 = 20
    assert split_ranges([4, 5, 1], frame=10, separator=1, max_items=9, max_bytes=20) == [(0, 2), (2, 3)]
    assert split_ranges([1] * 5, frame=0, separator=0, max_items=2, max_bytes=99) == [(0, 2), (2, 4), (4, 5)]
    assert split_ranges([], frame=10, separator=1, max_items=3, max_bytes=20) == []


def test_body_size_counts_escapes_and_utf8() -> None:
    texts = ["a\"b", "é✓😀", "\x00\n", "\ud800"]
    encoded = [encode_string(t) for t in texts]
    # a\"b: 2 quotes + 4; é✓😀: 2 + 2 + 3 + 4 bytes; NUL and newline escaped: 2 + 6 + 2; lone surrogate as U+FFFD
    assert [len(e) for e in encoded] == [6, 11, 10, 5]
    body = score_body(encoded, encoded)
    assert len(body) == len(b'{"texts":[],"prompts":[]}') + 2 * (sum(len(e) for e in encoded) + 3)
    assert json.loads(body) == {"texts": [*texts[:3], "\ufffd"], "prompts": [*texts[:3], "\ufffd"]}


def test_cuts_to_max_chars_and_splits_to_max_body_bytes() -> None:
    # cut to max_chars=100, a text of ✓ (3 bytes of UTF-8) is 2 + 300 = 302 bytes of JSON; the first body is
    # {"texts":[]} (12) + 302 + 302 + 300 + "ab" (4) + 3 commas = 923 bytes, one more text would make it 1,226
    texts = ["✓" * 150, "✓" * 100, "✓" * 99 + "x", "ab", "✓" * 100, "✓" * 200, "✓" * 101]
    script = Script(lambda t: ok(t), max_texts=50, max_chars=100, max_body_bytes=1000)
    scorer = script.scorer()
    assert scorer.score(texts) == [10.0, 10.0, 10.0, 0.2, 10.0, 10.0, 10.0]
    sent = [json.loads(body)["texts"] for body in script.bodies]
    assert sent == [["✓" * 100, "✓" * 100, "✓" * 99 + "x", "ab"], ["✓" * 100] * 3]
    assert [len(body) for body in script.bodies] == [923, 12 + 3 * 302 + 2]
    assert scorer.last_truncated == [0, 5, 6] and scorer.truncated_total == 3
    # a cut prompt counts too, and a server-side cut is merged with the client's
    script = Script(lambda t: ok(t, truncated=[0]), max_chars=100)
    scorer = script.scorer()
    scorer.score(["a", "b", "c"], prompts=["p", "p" * 101, "p"])
    assert json.loads(script.bodies[0])["prompts"] == ["p", "p" * 100, "p"]
    assert scorer.last_truncated == [0, 1]


class StrictScript(Script):
    """A fake server that, like the real one, answers 413 to a /score body over its max_body_bytes."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/score" and len(request.content) > self.info["max_body_bytes"]:
            self.requests.append(request)
            return httpx.Response(413, json={"detail": "request body is over max_body_bytes"})
        return super().__call__(request)


# max_body_bytes 100 and prompts of "é" (2 bytes of UTF-8, 1 character): a body with prompts is the frame
# {"texts":[],"prompts":[]} (25 bytes) + each text and prompt as a JSON string (2 quotes + its bytes) + one comma
# per list between neighbours. A lone text "o" * j with prompt "é" * 30: 25 + (j + 2) + 62 = 89 + j bytes.
@pytest.mark.parametrize(("length", "size"), [(10, 99), (11, 100), (12, 101)])
def test_a_lone_text_with_its_prompt_is_sent_up_to_exactly_max_body_bytes(length: int, size: int) -> None:
    script = StrictScript(ok, max_texts=50, max_chars=1000, max_body_bytes=100)
    texts, prompts = ["o" * length], ["é" * 30]
    assert len(score_body([encode_string(t) for t in texts], [encode_string(p) for p in prompts])) == size
    if size <= 100:
        assert script.scorer().score(texts, prompts=prompts) == [length / 10]
        assert [len(body) for body in script.bodies] == [size]
    else:
        with pytest.raises(ExperimentError, match="its request body is still 101 bytes, over max_body_bytes=100"):
            script.scorer().score(texts, prompts=prompts)
        assert script.bodies == []  # refused before sending


# Two texts "o" * 12 (14 bytes each) with prompts "é" * 10 (22 bytes) and "é" * 10 + "x" * n (22 + n): one body of
# 25 + 2 * 14 + 44 + n + 2 commas = 99 + n bytes; past 100, two bodies of 25 + 14 + 22 = 61 and 63 bytes.
@pytest.mark.parametrize(("extra", "sizes"), [(0, [99]), (1, [100]), (2, [61, 63])])
def test_texts_with_prompts_share_a_body_up_to_exactly_max_body_bytes(extra: int, sizes: list[int]) -> None:
    script = StrictScript(ok, max_texts=50, max_chars=1000, max_body_bytes=100)
    texts, prompts = ["o" * 12, "o" * 12], ["é" * 10, "é" * 10 + "x" * extra]
    assert script.scorer().score(texts, prompts=prompts) == [1.2, 1.2]
    assert [len(body) for body in script.bodies] == sizes
    sent = [json.loads(body) for body in script.bodies]
    assert [t for body in sent for t in body["texts"]] == texts
    assert [p for body in sent for p in body["prompts"]] == prompts  # each prompt travels with its text


def test_a_text_too_big_for_any_request_is_refused() -> None:
    script = Script(ok, max_chars=400, max_body_bytes=1024)  # 400 NULs are 2,402 bytes of JSON
    with pytest.raises(ExperimentError) as info:
        script.scorer().score(["fine", "\x00" * 500])
    assert str(info.value) == (
        f"text 1 cannot be sent to reward server {URL}: cut to max_chars=400 characters, its request body is "
        "still 2414 bytes, over max_body_bytes=1024; start the server with a larger --max-body-bytes or a "
        "smaller --max-chars")
    assert script.bodies == []  # refused before anything was sent


def test_lone_surrogates_are_sent_as_replacement_characters() -> None:
    script = Script(ok)
    assert script.scorer().score(["you \ud800idiot", "\udfff"]) == [1.0, 0.1]
    assert json.loads(script.bodies[0])["texts"] == ["you \ufffdidiot", "\ufffd"]


@pytest.mark.parametrize(("key", "position"), [("clé", 3), ("key with space", 4), ("tab\tkey", 4),
                                               ("trailing-space ", 15)])
def test_a_key_that_cannot_be_sent_is_refused_at_start(monkeypatch: pytest.MonkeyPatch, key: str,
                                                       position: int) -> None:
    monkeypatch.setenv("PURPLERL_REWARD_API_KEY", key)
    with pytest.raises(UserError) as info:
        make_toxicity_scorer(ToxicityConfig(url=URL))
    # one line that does not echo the secret
    assert str(info.value) == ("reward server API key (env PURPLERL_REWARD_API_KEY): an API key must be printable "
                               f"ASCII without spaces, but character {position} of {len(key)} is not")


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
    served = run_settings("attack", options=["--reward.terms.toxicity.params.url", URL + "/"])
    assert served.reward.terms["toxicity"].params["url"] == URL
    with pytest.raises(UserError, match="reward.terms.toxicity.params.url.*http:// or https://"):
        run_settings("attack", options=["--reward.terms.toxicity.params.url", "localhost:50050"])
    with pytest.raises(UserError, match="either url .* or model"):
        run_settings("attack", options=["--reward.terms.toxicity.params.url", URL, "--toxicity_model", "org/clf",
                                        "--toxicity_label", "1"])


def test_record_server() -> None:
    cfg = ToxicityConfig(url=URL)
    info = ServerInfo.model_validate(INFO)
    record_server(cfg, info)
    assert (cfg.server_model, cfg.server_label) == ("org/deberta", "unsafe")
    record_server(cfg, info)  # a resumed run against the same server
    with pytest.raises(ExperimentError, match="serves model 'embedded' label 'toxic'.*scored by model 'org/deberta'"):
        record_server(cfg, info.model_copy(update={"model": "embedded", "label": "toxic"}))
