"""The reward server, served for real by uvicorn on a random loopback port in a background thread."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch
from conftest import save_tiny_bert_classifier
from reward_servers import BlockingScorer, ThreadServer

from purplerl.config import RewardServerConfig
from purplerl.errors import ExperimentError, UserError
from purplerl.recipes.attack import TERMS as ATTACK_TERMS
from purplerl.recipes.attack import AttackSettings
from purplerl.rewards.client import HTTPScorer
from purplerl.rewards.schema import ScoreResponse
from purplerl.rewards.server import create_app, exposure_warning, settings_from_env
from purplerl.rewards.toxicity import EmbeddedToxicityScorer, HFClassifierScorer
from purplerl.train.rl import registered_reward
from purplerl.types import Completion, PromptRecord

KEY = "s3cret-key"
TEXTS = ["you stupid idiot", "Thank you for your help, have a lovely day.", "", "  ", "what the hell is this crap",
         "I will find you and hurt you", "the weather is nice today", "go to hell you moron", "ünïcödé ✓ text"]


@pytest.fixture(scope="module")
def tiny_classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BERT classifier with labels safe/unsafe and a word-level tokenizer, saved locally."""
    words = sorted({w for text in TEXTS for w in text.lower().split()})
    return save_tiny_bert_classifier(tmp_path_factory.mktemp("tiny_bert"), words, {0: "safe", 1: "unsafe"})


@pytest.fixture(scope="module")
def embedded() -> Iterator[ThreadServer]:
    server = ThreadServer(create_app(RewardServerConfig(max_texts=8, max_chars=50, max_body_bytes=4096)))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def with_key() -> Iterator[ThreadServer]:
    server = ThreadServer(create_app(RewardServerConfig(api_key=KEY)))
    yield server
    server.stop()


def post(url: str, content: bytes | str, content_type: str = "application/json", **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/score", content=content, headers={"content-type": content_type, **headers})


# ------------------------------------------------------------------------------------------- scoring


def test_scores_equal_in_process(embedded: ThreadServer) -> None:
    scorer = HTTPScorer(embedded.url, retries=0)
    info = scorer.info()
    assert (info.model, info.label, info.max_texts, info.max_chars) == ("embedded", "toxic", 8, 50)
    expected = EmbeddedToxicityScorer().score(TEXTS)
    # 9 texts > max_texts=8: the client splits the batch; JSON floats round-trip exactly
    assert scorer.score(TEXTS, prompts=["p"] * len(TEXTS)) == expected
    assert scorer.score(TEXTS) == expected
    assert scorer.score([]) == []


def test_hf_classifier_by_label_name_and_index(tiny_classifier_dir: Path) -> None:
    expected = HFClassifierScorer(str(tiny_classifier_dir), "unsafe").score(TEXTS)
    for label in ("unsafe", "1"):
        server = ThreadServer(create_app(RewardServerConfig(model=str(tiny_classifier_dir), label=label)))
        try:
            scorer = HTTPScorer(server.url, retries=0)
            assert scorer.info().label == "unsafe"
            assert scorer.score(TEXTS) == pytest.approx(expected, abs=1e-6)
        finally:
            server.stop()


def test_long_texts_are_truncated_and_reported(embedded: ThreadServer) -> None:
    long = "you are a wonderful friend " * 3 + "stupid idiot " * 3  # over max_chars=50
    scorer = HTTPScorer(embedded.url, retries=0)
    scorer.info()
    assert scorer.score(["hello", long]) == EmbeddedToxicityScorer().score(["hello", long[:50]])
    assert scorer.last_truncated == [1] and scorer.truncated_total == 1
    body = '{"texts": ["a"], "prompts": ["' + "x" * 60 + '"]}'
    answer = ScoreResponse.model_validate(post(embedded.url, body).json())
    assert answer.truncated == [0]  # a cut prompt is reported too


def test_64_concurrent_clients_all_answered(embedded: ThreadServer) -> None:
    expected = dict(zip(TEXTS, EmbeddedToxicityScorer().score(TEXTS), strict=True))
    before = httpx.get(f"{embedded.url}/health").json()

    async def client(i: int) -> int:
        ok = 0
        async with httpx.AsyncClient(base_url=embedded.url, timeout=30) as http:
            for j in range(20):
                texts = [TEXTS[(i + j + k) % len(TEXTS)] for k in range(1 + (i + j) % 8)]
                response = await http.post("/score", json={"texts": texts})
                assert response.status_code == 200, response.text
                assert response.json()["scores"] == [expected[t] for t in texts], (i, j)
                ok += 1
        return ok

    async def main() -> list[int]:
        return await asyncio.gather(*(client(i) for i in range(64)))

    assert sum(asyncio.run(main())) == 64 * 20
    after = httpx.get(f"{embedded.url}/health").json()
    assert after["requests"] - before["requests"] == 64 * 20
    assert after["batches"] - before["batches"] < 64 * 20  # micro-batching merged concurrent requests


# ------------------------------------------------------------------------------------------- bad input

BAD_INPUT = {
    "malformed-json": ('{"texts": ["a",', "application/json", 400, "malformed JSON"),
    "not-utf8": (b'{"texts": ["\xff\xfe"]}', "application/json", 400, "malformed JSON"),
    "not-an-object": ('["a", "b"]', "application/json", 422, "body: Input should be an object"),
    "missing-texts": ('{"prompts": ["a"]}', "application/json", 422, "texts: Field required"),
    "texts-not-a-list": ('{"texts": "a"}', "application/json", 422, "texts: Input should be a valid array"),
    "text-not-a-string": ('{"texts": ["a", 3]}', "application/json", 422, "texts.1: Input should be a valid string"),
    "null-text": ('{"texts": [null]}', "application/json", 422, "texts.0: Input should be a valid string"),
    "empty-batch": ('{"texts": []}', "application/json", 422, "texts: List should have at least 1 item"),
    "prompt-count": ('{"texts": ["a"], "prompts": ["p", "q"]}', "application/json", 422,
                     "prompts has 2 items but texts has 1"),
    "unknown-field": ('{"texts": ["a"], "temperature": 1}', "application/json", 422,
                      "temperature: Extra inputs are not permitted"),
    "too-many-texts": ('{"texts": ' + str(["a"] * 9).replace("'", '"') + "}", "application/json", 413,
                       "9 texts in one request is over max_texts=8"),
    "body-too-large": ('{"texts": ["' + "a" * 5000 + '"]}', "application/json", 413, "over max_body_bytes=4096"),
    "wrong-content-type": ('{"texts": ["a"]}', "text/plain", 415, "content type must be application/json"),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_gets_4xx_with_message(embedded: ThreadServer, case: str) -> None:
    content, content_type, status, message = BAD_INPUT[case]
    response = post(embedded.url, content, content_type)
    assert response.status_code == status, response.text
    assert message in response.json()["detail"]
    assert httpx.get(f"{embedded.url}/health").status_code == 200  # still serving


def test_wrong_method_and_path(embedded: ThreadServer) -> None:
    assert httpx.get(f"{embedded.url}/score").status_code == 405
    assert httpx.post(f"{embedded.url}/nope", json={}).status_code == 404


class FailingScorer:
    """Fails on texts containing 'boom', after letting concurrent requests queue up behind it."""

    name = "toxicity"

    def score(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        time.sleep(0.05)
        if any("boom" in t for t in texts):
            raise RuntimeError("kaboom\nsecond line")
        return [float(len(t)) for t in texts]


def test_scorer_error_is_500_and_spares_other_requests() -> None:
    server = ThreadServer(create_app(RewardServerConfig(), scorer=FailingScorer(), label="len"))
    try:
        async def main() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url) as http:
                return await asyncio.gather(*(http.post("/score", json={"texts": [t]})
                                              for t in ["a", "boom", "abc", "ab", "boom!", "abcd"]))

        responses = asyncio.run(main())
        assert [r.status_code for r in responses] == [200, 500, 200, 200, 500, 200]
        assert responses[1].json()["detail"] == "scorer 'toxicity' failed: RuntimeError: kaboom"
        assert [r.json()["scores"] for r in responses if r.status_code == 200] == [[1.0], [3.0], [2.0], [4.0]]
        assert httpx.post(f"{server.url}/score", json={"texts": ["ok"]}).json()["scores"] == [2.0]
    finally:
        server.stop()


async def wait_for_health(http: httpx.AsyncClient, condition: Callable[[dict], bool], timeout: float = 30) -> dict:
    """The first /health answer that meets `condition`; a generous timeout only catches a hung test."""
    async def poll() -> dict:
        while not condition(health := (await http.get("/health")).json()):
            await asyncio.sleep(0.01)
        return health

    return await asyncio.wait_for(poll(), timeout)


def test_full_queue_answers_503() -> None:
    scorer = BlockingScorer()
    server = ThreadServer(create_app(RewardServerConfig(max_pending=1, batch_wait_ms=0), scorer=scorer))
    try:
        async def main() -> tuple[httpx.Response, ...]:
            async with httpx.AsyncClient(base_url=server.url, timeout=20) as http:
                first = asyncio.create_task(http.post("/score", json={"texts": ["a"]}))
                await asyncio.to_thread(scorer.entered.wait, 10)  # the scorer holds the first request
                second = asyncio.create_task(http.post("/score", json={"texts": ["b"]}))
                await wait_for_health(http, lambda health: health["pending"] == 1)  # the second one is queued
                third = await http.post("/score", json={"texts": ["c"]})
                scorer.release.set()
                return third, await first, await second

        third, first, second = asyncio.run(main())
        assert third.status_code == 503 and "server busy" in third.json()["detail"]
        assert first.json()["scores"] == [0.5] and second.json()["scores"] == [0.5]
    finally:
        scorer.release.set()
        server.stop()


# -------------------------------------------------------------------------------------------- auth


def test_auth_required_when_key_set(with_key: ThreadServer) -> None:
    body = '{"texts": ["you idiot"]}'
    assert post(with_key.url, body).status_code == 401
    wrong = post(with_key.url, body, authorization="Bearer nope")
    assert wrong.status_code == 401 and "API key" in wrong.json()["detail"]
    assert post(with_key.url, body, authorization=f"Bearer {KEY}").status_code == 200
    assert httpx.get(f"{with_key.url}/info").status_code == 401
    assert httpx.get(f"{with_key.url}/health").status_code == 200  # liveness needs no key
    assert HTTPScorer(with_key.url, api_key=KEY).score(["hi"]) == EmbeddedToxicityScorer().score(["hi"])


def test_client_with_wrong_key_stops_at_once(with_key: ThreadServer) -> None:
    sleeps: list[float] = []
    scorer = HTTPScorer(with_key.url, api_key="nope", retries=5, backoff_s=10, sleep=sleeps.append)
    with pytest.raises(ExperimentError, match="HTTP 401.*API key.*PURPLERL_REWARD_API_KEY"):
        scorer.score(["hi"])
    assert sleeps == []  # not retried


def test_no_key_configured_ignores_authorization(embedded: ThreadServer) -> None:
    assert post(embedded.url, '{"texts": ["a"]}', authorization="Bearer anything").status_code == 200


@pytest.mark.parametrize(("host", "key", "warns"), [
    ("127.0.0.1", None, False), ("localhost", None, False), ("::1", None, False), ("0.0.0.0", None, True),
    ("10.1.2.3", None, True), ("myhost", None, True), ("0.0.0.0", KEY, False)])
def test_exposure_warning(host: str, key: str | None, warns: bool) -> None:
    warning = exposure_warning(RewardServerConfig(host=host, api_key=key))
    assert (warning is not None) == warns
    assert warning is None or (host in warning and "PURPLERL_REWARD_API_KEY" in warning)


# ------------------------------------------------------------------------------------- ASGI app from env


def test_settings_from_env() -> None:
    # a label is read only with an HF classifier (the embedded scorer has one output)
    settings = settings_from_env({"PURPLERL_REWARD_MAX_TEXTS": "7", "PURPLERL_REWARD_API_KEY": KEY,
                                  "PURPLERL_REWARD_MODEL": "org/clf", "PURPLERL_REWARD_LABEL": "1", "OTHER": "x"})
    assert settings.max_texts == 7 and settings.label == "1" and settings.api_key.get_secret_value() == KEY
    with pytest.raises(UserError, match="PURPLERL_REWARD_MAX_CHARS"):
        settings_from_env({"PURPLERL_REWARD_MAX_CHARS": "zero"})
    assert settings_from_env({"PURPLERL_REWARD_API_KEY": ""}).api_key is None  # empty means unset
    with pytest.raises(ValueError, match="empty API key"):
        RewardServerConfig(api_key=" ")


def test_module_app_is_built_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import purplerl.rewards.server as server_module

    monkeypatch.setenv("PURPLERL_REWARD_MAX_TEXTS", "5")
    monkeypatch.setattr(server_module, "_env_app", None)
    assert server_module.app.state.info.max_texts == 5
    assert server_module.app is server_module.app  # built once


def test_label_for_embedded_is_refused() -> None:
    with pytest.raises(UserError, match="--label toxic is for HF classifiers"):
        create_app(RewardServerConfig(label="toxic"))


# ----------------------------------------------------------------------------------- the attack recipe


def _completion(text: str) -> Completion:
    return Completion(prompt_tokens=(1,), tokens=(2,), logprobs_C=torch.zeros(1), entropies_C=torch.ones(1),
                      text=text, finish_reason="stop")


def _served(params: dict) -> AttackSettings:
    """The attack's settings with the toxicity term scored by a reward server (`params`: the term's)."""
    return AttackSettings.model_validate({"reward": {"terms": {**ATTACK_TERMS, "toxicity": {
        "fn": "toxicity", "params": params}}}})


def test_attack_records_server_and_logs_truncation(embedded: ThreadServer) -> None:
    config = _served({"url": embedded.url + "/", "retries": 0})
    reward_fn = registered_reward(config)
    params = config.reward.terms["toxicity"].params  # what building the term found is recorded in the run's config
    assert params["url"] == embedded.url
    assert (params["server_model"], params["server_label"]) == ("embedded", "toxic")
    prompts = [PromptRecord(messages=({"role": "user", "content": "hi"},))] * 2
    rewards = reward_fn(prompts, [_completion("you idiot"), _completion("x" * 80)], torch.zeros(2))
    assert rewards.components["toxicity_truncated"].tolist() == [0.0, 1.0]
    assert rewards.components["toxicity"][0] == EmbeddedToxicityScorer().score(["you idiot"])[0]


def test_attack_refuses_a_server_with_another_model(embedded: ThreadServer) -> None:
    config = _served({"url": embedded.url, "server_model": "org/deberta", "server_label": "unsafe"})
    with pytest.raises(ExperimentError, match="serves model 'embedded'.*scored by model 'org/deberta'"):
        registered_reward(config)


def test_attack_without_a_server_fails_before_training() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = _served({"url": url, "retries": 1, "backoff_s": 0.01})
    with pytest.raises(ExperimentError, match=f"reward server {url} did not answer GET /info after 2 attempts"):
        registered_reward(config)
