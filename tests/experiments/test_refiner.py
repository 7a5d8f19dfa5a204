"""The iterative refiner end to end: the tiny model answers (and critiques, on the local path), a stub
OpenAI-compatible endpoint on 127.0.0.1 critiques and revises and records every request it got."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ChatCompletionsStub, serve_on_loopback

from purplerl.config import ModelConfig, SFTDataConfig
from purplerl.data.sft import SFTConfig, load_conversations
from purplerl.engines import make_engine
from purplerl.errors import ExperimentError, PurplerlError, UserError
from purplerl.experiments.principles import DEFAULT_PRINCIPLES, load_principles
from purplerl.experiments.refiner import (
    REVISIONS_FILE,
    SETTINGS_FILE,
    SFT_FILE,
    EngineGenerator,
    RefineConfig,
    build_generators,
    principle_order,
    refine,
    refine_model,
)

CRITIQUES = {p.critique for p in DEFAULT_PRINCIPLES}
REVISIONS = {p.revision for p in DEFAULT_PRINCIPLES}


def _digest(text: str) -> str:
    return str(sum(text.encode()) % 997)  # stands for the text in a reply: the same text, the same reply


class _Stub(ChatCompletionsStub):
    """Critiques and revisions that name what they answer; the model name asks for a failure."""

    requests: list[dict] = []

    def reply(self, body: dict) -> tuple[int, str]:
        if body["model"] == "fail500":
            return 500, '{"error": {"message": "the critic fell over"}}'
        last, before = body["messages"][-1]["content"], body["messages"][-2]["content"]
        if body["model"] == "blank" and last not in CRITIQUES:
            return 200, "   "
        step = "critique" if last.startswith(("Point out", "Critique")) else "revision"
        return 200, f"{step} of answer {_digest(before)}"

    def do_POST(self) -> None:
        if self.path.startswith("/garbage/"):  # a 200 that is no JSON, and one that is JSON but no completion
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            type(self).requests.append({"path": self.path, "auth": None, "body": body})
            data = b'{"choices": [' if self.path.startswith("/garbage/json/") else b'{"choices": []}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        super().do_POST()


@pytest.fixture(scope="module")
def stub_url() -> Iterator[str]:
    yield from serve_on_loopback(_Stub)


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> EngineGenerator:
    return EngineGenerator("tiny", make_engine(ModelConfig(name=str(tiny_model_dir))), "chat", 512)


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PURPLERL_CRITIC_API_KEY", raising=False)
    _Stub.requests.clear()


def _settings(url: str | None, **changes: object) -> RefineConfig:
    critic = {"url": url, "model": "critic-model", "retries": 0, "backoff_s": 0.0} if url else {}
    values = {"data": {"limit": 3}, "rounds": 2, "max_new_tokens": 6, "batch_size": 2, "critic": critic}
    return RefineConfig.model_validate({**values, **changes})


def _run(settings: RefineConfig, out: Path, policy: EngineGenerator, **kwargs: object):
    critic = build_generators(settings)[1] if settings.critic.url else policy
    return refine(settings, out, policy, critic, notify=lambda line: None, **kwargs)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_end_to_end_with_an_endpoint_critic_records_every_step(stub_url, policy, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PURPLERL_CRITIC_API_KEY", "sekret")
    result = _run(_settings(stub_url), tmp_path / "out", policy)
    assert (result.prompts, result.refined, result.sft_rows, result.blank) == (3, 3, 3, 0)
    rows = _rows(tmp_path / "out" / REVISIONS_FILE)
    sent = [r["body"] for r in _Stub.requests]
    assert len(rows) == 3 and len(sent) == 3 * 2 * 2  # per prompt and round: one critique, one revision
    assert {r["path"] for r in _Stub.requests} == {"/v1/chat/completions"}
    assert {r["auth"] for r in _Stub.requests} == {"Bearer sekret"}
    bodies = iter(sent)
    for row in rows:  # batches run prompt by prompt within each step: the stub's order is batch order
        assert row["prompt"][0]["role"] == "user" and [s["round"] for s in row["rounds"]] == [1, 2]
    for batch in (rows[:2], rows[2:]):
        for round_ in range(2):
            critiques = [next(bodies) for _ in batch]
            revisions = [next(bodies) for _ in batch]
            for row, ask, rewrite in zip(batch, critiques, revisions, strict=True):
                step = row["rounds"][round_]
                answer = row["initial"] if round_ == 0 else row["rounds"][0]["revision"]
                assert set(ask) == {"model", "messages", "temperature", "max_tokens", "seed"}
                assert (ask["model"], ask["temperature"], ask["max_tokens"]) == ("critic-model", 0.7, 6)
                assert ask["messages"] == [*row["prompt"], {"role": "assistant", "content": answer},
                                           {"role": "user", "content": step["critique_request"]}]
                assert rewrite["messages"] == [*ask["messages"], {"role": "assistant", "content": step["critique"]},
                                               {"role": "user", "content": step["revision_request"]}]
                principle = next(p for p in DEFAULT_PRINCIPLES if p.name == step["principle"])
                assert (step["critique_request"], step["revision_request"]) == (principle.critique,
                                                                              principle.revision)
                assert step["critique"] == f"critique of answer {_digest(answer)}"
                assert step["revision"] == f"revision of answer {_digest(step['critique'])}"
        # a prompt's two rounds take two different principles (a seeded permutation per prompt)
        assert all(row["rounds"][0]["principle"] != row["rounds"][1]["principle"] for row in batch)
    assert [r["final"] for r in rows] == [r["rounds"][-1]["revision"] for r in rows]
    sft = _rows(tmp_path / "out" / SFT_FILE)
    assert [(s["prompt"], s["completion"], s["uid"]) for s in sft] == \
        [(r["prompt"][0]["content"], r["final"], r["uid"]) for r in rows]
    read = load_conversations(SFTDataConfig(source=str(tmp_path / "out" / SFT_FILE)), SFTConfig())
    assert [c.messages[-1] for c in read] == [{"role": "assistant", "content": r["final"]} for r in rows]
    saved = json.loads((tmp_path / "out" / SETTINGS_FILE).read_text())
    assert saved["critic"] == f"{stub_url}/chat/completions (critic-model)" and saved["policy"] == "tiny"
    assert "sekret" not in (tmp_path / "out" / SETTINGS_FILE).read_text()


def test_the_same_seed_gives_the_same_files_and_another_seed_other_ones(stub_url, policy, tmp_path) -> None:
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        _run(_settings(stub_url, seed=seed), tmp_path / name, policy)
    files = {name: (tmp_path / name / REVISIONS_FILE).read_bytes() for name in "abc"}
    assert files["a"] == files["b"] and files["a"] != files["c"]
    initial = {name: [r["initial"] for r in _rows(tmp_path / name / REVISIONS_FILE)] for name in "ac"}
    assert initial["a"] != initial["c"]  # the policy samples with the seed (temperature 0.7)


class _Killed(Exception):
    pass


class _DiesAfter:
    """The policy, killed at its call number `calls + 1`."""

    def __init__(self, inner: EngineGenerator, calls: int) -> None:
        self.inner, self.calls, self.name = inner, calls, inner.name

    def generate(self, conversations, sampling):
        self.calls -= 1
        if self.calls < 0:
            raise _Killed
        return self.inner.generate(conversations, sampling)


class _Never:
    name = "never"

    def generate(self, conversations, sampling):
        raise AssertionError("nothing may be generated")


def test_a_killed_run_resumes_skipping_the_prompts_done(stub_url, policy, tmp_path) -> None:
    settings = _settings(stub_url, reviser="policy")
    _run(settings, tmp_path / "whole", policy)
    whole = _rows(tmp_path / "whole" / REVISIONS_FILE)
    out = tmp_path / "killed"
    critic = build_generators(settings)[1]
    with pytest.raises(_Killed):  # the first batch (two prompts) is written, the second batch's answer is not
        refine(settings, out, _DiesAfter(policy, 1 + 2), critic, notify=lambda line: None)
    assert _rows(out / REVISIONS_FILE) == whole[:2] and not (out / SFT_FILE).exists()
    with open(out / REVISIONS_FILE, "a") as f:
        f.write('{"uid": "redteam-insult-03", "prom')  # a line cut by the kill
    _Stub.requests.clear()
    lines: list[str] = []
    result = refine(settings, out, policy, critic, notify=lines.append)
    assert (result.prompts, result.refined) == (3, 1) and lines == ["refine: 3/3 prompts refined"]
    assert len(_Stub.requests) == 1 * 2  # one prompt left: two critiques
    assert (out / REVISIONS_FILE).read_bytes() == (tmp_path / "whole" / REVISIONS_FILE).read_bytes()
    assert (out / SFT_FILE).read_bytes() == (tmp_path / "whole" / SFT_FILE).read_bytes()
    assert "done before" in result.describe()

    # a batch written in part is generated again whole (the same texts), and only its missing prompt is added
    (out / REVISIONS_FILE).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in whole[:1]))
    result = refine(settings, out, policy, critic, notify=lambda line: None)
    assert result.refined == 2 and _rows(out / REVISIONS_FILE) == whole
    # nothing left: no call at all
    _Stub.requests.clear()
    assert refine(settings, out, _DiesAfter(policy, 0), critic, notify=lambda line: None).refined == 0
    assert _Stub.requests == []


def test_a_rerun_with_other_settings_is_refused_but_a_longer_limit_continues(stub_url, policy, tmp_path) -> None:
    settings = _settings(stub_url, reviser="policy", data={"limit": 2})
    _run(settings, tmp_path / "out", policy)
    with pytest.raises(UserError, match=r"other settings\.rounds, settings\.temperature \(see .*refine\.json\): "
                                        "use another out dir"):
        _run(_settings(stub_url, reviser="policy", data={"limit": 2}, rounds=3, temperature=0.5),
             tmp_path / "out", policy)
    result = _run(_settings(stub_url, reviser="policy"), tmp_path / "out", policy)
    assert (result.prompts, result.refined) == (3, 1)
    _run(_settings(stub_url, reviser="policy"), tmp_path / "straight", policy)
    assert _rows(tmp_path / "out" / REVISIONS_FILE) == _rows(tmp_path / "straight" / REVISIONS_FILE)
    with pytest.raises(UserError, match="is not among the prompts of builtin:redteam .*lower data.limit"):
        _run(_settings(stub_url, reviser="policy", data={"limit": 1}), tmp_path / "out", policy)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("where, model, retries, message", [
    ("dead", "critic-model", 1, "did not answer after 2 attempts; last error: ConnectError: "),
    ("stub", "fail500", 2, "did not answer after 3 attempts; last error: HTTP 500: the critic fell over"),
    ("garbage-json", "critic-model", 2, "answered with something other than JSON: '{\"choices\": ['"),
    ("garbage-choices", "critic-model", 2, "sent no chat completion (no choices[0].message.content text)"),
])
def test_a_failing_endpoint_is_one_line_naming_it(stub_url, policy, tmp_path, where, model, retries,
                                                  message) -> None:
    url = {"dead": f"http://127.0.0.1:{_free_port()}/v1", "stub": stub_url,
           "garbage-json": stub_url.removesuffix("/v1") + "/garbage/json",
           "garbage-choices": stub_url.removesuffix("/v1") + "/garbage/choices"}[where]
    settings = _settings(url, critic={"url": url, "model": model, "retries": retries, "backoff_s": 0.0})
    with pytest.raises(ExperimentError) as info:
        _run(settings, tmp_path / "out", policy)
    text = str(info.value)
    assert text.startswith(f"chat endpoint {url}/chat/completions ") and message in text and "\n" not in text
    assert len(_Stub.requests) == {"dead": 0, "stub": retries + 1}.get(where, 1)  # no retry for a malformed answer
    assert not (tmp_path / "out" / REVISIONS_FILE).exists()


def test_a_local_critic_and_the_policy_revising(policy, tiny_model_dir, tmp_path) -> None:
    critic_dir = shutil.copytree(tiny_model_dir, tmp_path / "critic")  # another model dir: its own engine
    settings = RefineConfig.model_validate({"data": {"limit": 2}, "rounds": 3, "max_new_tokens": 5,
                                            "critic": {"model": str(critic_dir)}, "reviser": "policy",
                                            "principle_order": "cycle"})
    critic = build_generators(settings)[1]
    assert isinstance(critic, EngineGenerator) and critic.name == str(critic_dir)
    result = refine(settings, tmp_path / "out", policy, critic, notify=lambda line: None)
    assert result.prompts == 2 and result.sft_rows + result.blank == 2
    rows = _rows(tmp_path / "out" / REVISIONS_FILE)
    names = [p.name for p in DEFAULT_PRINCIPLES]
    # cycled: prompt i's round r takes principle (i + r) mod 5
    assert [[s["principle"] for s in row["rounds"]] for row in rows] == [names[0:3], names[1:4]]
    assert all(isinstance(s["critique"], str) and isinstance(s["revision"], str) for r in rows for s in r["rounds"])
    assert json.loads((tmp_path / "out" / SETTINGS_FILE).read_text())["critic"] == str(critic_dir)
    # without critic.model and url the policy critiques itself: one engine
    policy_only, self_critic = build_generators(RefineConfig(policy={"name": str(tiny_model_dir)}))
    assert self_critic is policy_only


def test_a_blank_final_revision_is_recorded_but_left_out_of_the_sft_file(stub_url, policy, tmp_path) -> None:
    settings = _settings(stub_url, critic={"url": stub_url, "model": "blank"}, rounds=1)
    result = _run(settings, tmp_path / "out", policy)
    assert (result.sft_rows, result.blank) == (0, 3) and "3 blank final revisions left out" in result.describe()
    assert [r["final"] for r in _rows(tmp_path / "out" / REVISIONS_FILE)] == ["", "", ""]
    assert (tmp_path / "out" / SFT_FILE).read_text() == ""


def test_a_principles_file_yaml_or_json(stub_url, policy, tmp_path) -> None:
    own = [{"name": "brief", "critique": "Critique: is your last answer too long?", "revision": "Shorten it."},
           {"name": "kind", "critique": "Critique: is your last answer unkind?", "revision": "Make it kind."}]
    (tmp_path / "p.yaml").write_text("principles:\n" + "".join(
        f"  - name: {p['name']}\n    critique: '{p['critique']}'\n    revision: {p['revision']}\n" for p in own))
    (tmp_path / "p.json").write_text(json.dumps({"principles": own}))
    assert load_principles(str(tmp_path / "p.yaml")) == load_principles(str(tmp_path / "p.json"))
    settings = _settings(stub_url, principles=str(tmp_path / "p.yaml"), principle_order="cycle", rounds=3)
    _run(settings, tmp_path / "out", policy)
    rows = _rows(tmp_path / "out" / REVISIONS_FILE)
    assert [[s["principle"] for s in r["rounds"]] for r in rows] == [["brief", "kind", "brief"],
                                                                     ["kind", "brief", "kind"],
                                                                     ["brief", "kind", "brief"]]
    asked = [r["body"]["messages"][-1]["content"] for r in _Stub.requests]
    assert set(asked) == {p["critique"] for p in own} | {p["revision"] for p in own}


@pytest.mark.parametrize("text, message", [
    ("principles:\n  - {name: a, critique: x}\n", "principles .*p.yaml: config field 'principles.0.revision': "
                                                 "Field required"),
    ("principles:\n  - {name: a, critique: x, revision: ' '}\n", "'principles.0.revision': must not be blank"),
    ("principles: []\n", "'principles': List should have at least 1 item"),
    ("principles:\n  - {name: a, critique: x, revision: y}\n  - {name: a, critique: z, revision: w}\n",
     r"names repeat \(a\)"),
    ("- {name: a, critique: x, revision: y}\n", "must hold a mapping at the top level"),
    ("principles: [\n", "cannot parse YAML"),
])
def test_a_bad_principles_file_is_one_line(tmp_path, text, message) -> None:
    (tmp_path / "p.yaml").write_text(text)
    with pytest.raises(UserError, match=message) as info:
        load_principles(str(tmp_path / "p.yaml"))
    assert "\n" not in str(info.value)


def test_principle_orders() -> None:
    settings = RefineConfig(seed=3)
    order = principle_order(settings, 5, "uid-1", 0)
    assert sorted(order) == [0, 1, 2, 3, 4] and order == principle_order(settings, 5, "uid-1", 7)
    assert len({tuple(principle_order(settings, 5, f"uid-{i}", 0)) for i in range(20)}) > 5
    assert principle_order(RefineConfig(principle_order="cycle"), 3, "u", 4) == [1, 2, 0]


@pytest.mark.parametrize("critic, message", [
    ({"url": "http://127.0.0.1:9/v1"}, "critic.url needs critic.model"),
    ({"url": "ftp://x", "model": "m"}, "must start with http:// or https://"),
    ({"retries": 5}, "retries is read only when critic.url is set"),
])
def test_critic_settings_are_checked(critic, message) -> None:
    with pytest.raises(ValueError, match=message):
        RefineConfig(critic=critic)


def test_the_out_dir_and_the_endpoint_key_are_checked_before_any_work(stub_url, tmp_path, monkeypatch) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=f"^refine out dir {tmp_path / 'file'} is a file"):
        refine(_settings(stub_url), tmp_path / "file", _Never(), _Never())
    monkeypatch.setenv("PURPLERL_CRITIC_API_KEY", "two words")
    with pytest.raises(PurplerlError, match="API key \\(env PURPLERL_CRITIC_API_KEY\\): an API key must be "
                                            "printable ASCII without spaces"):
        build_generators(_settings(stub_url))


def test_refine_model_takes_a_stages_keywords_and_returns_the_sft_file(stub_url, tiny_model_dir, tmp_path) -> None:
    critic = {"url": stub_url, "model": "critic-model", "retries": 0}
    path = refine_model(str(tiny_model_dir), tmp_path / "out", notify=lambda line: None, data={"limit": 1},
                        rounds=1, max_new_tokens=4, critic=critic)
    assert path == tmp_path / "out" / SFT_FILE and len(_rows(path)) == 1
    assert json.loads((tmp_path / "out" / SETTINGS_FILE).read_text())["policy"] == str(tiny_model_dir)
    with pytest.raises(UserError, match="^config field 'round': unknown field$"):
        refine_model(str(tiny_model_dir), tmp_path / "other", round=1)
