"""`Reward`: registered terms with weights, on a small batch worked by hand."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from pydantic import ValidationError
from reward_servers import ThreadServer

from purplerl.config import RewardServerConfig, ToxicityConfig
from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.compose import Reward
from purplerl.rewards.named import TermSpec
from purplerl.rewards.registry import REWARD_TERMS, RewardTerm, ScoringInput, TermOutput
from purplerl.rewards.server import create_app
from purplerl.rewards.toxicity import EmbeddedToxicityScorer
from purplerl.types import Completion

TEXTS = ["a b c a b c", "I'm sorry, I cannot help", "hello there friend"]
# repetition (trigrams): abc bca cab abc -> 1 - 3/4 = 0.25; five words, all trigrams unique -> 0; one trigram -> 0
REPETITION = [0.25, 0.0, 0.0]
REFUSAL = [0.0, 1.0, 0.0]  # "i'm sorry" in the second
KL_N = torch.tensor([0.2, 0.0, 1.0])
ENTROPIES = [[1.0, 3.0], [4.0, 6.0], [0.5]]  # mean token entropy 2, 5, 0.5


def _batch(kl_N: torch.Tensor | None = KL_N, completions: bool = True) -> ScoringInput:
    made = [Completion((1,), tuple(range(len(e))), torch.zeros(len(e)), torch.tensor(e), text, "stop")
            for text, e in zip(TEXTS, ENTROPIES, strict=True)]
    return ScoringInput(texts=TEXTS, prompts=["p"] * 3, completions=made if completions else None, kl_N=kl_N)


ATTACK = {"repetition": -0.5, "refusal": -1.0, "kl": -0.1, "entropy_bonus": 1.0}
# -0.5 x repetition - 1 x refusal - 0.1 x kl + min(entropy, 3):
#   -0.125 - 0 - 0.02 + 2   = 1.855
#    0     - 1 - 0    + 3   = 2.0
#    0     - 0 - 0.1  + 0.5 = 0.4
RAW = [1.855, 2.0, 0.4]
# mean 1.418333; deviations 0.436667, 0.581667, -1.018333; population std sqrt(1.566017 / 3) = 0.722500
ZSCORED = [0.436667 / 0.7225, 0.581667 / 0.7225, -1.018333 / 0.7225]


def test_weighted_terms_by_hand() -> None:
    reward = Reward({**ATTACK, "entropy_bonus": TermSpec(fn="entropy_bonus", params={"cap": 3.0})})
    assert reward.terms == ATTACK
    out = reward(_batch())
    assert torch.allclose(out.total_N, torch.tensor(RAW), atol=1e-6)
    assert set(out.components) == {*ATTACK, "reward_raw"}
    assert out.components["repetition"].tolist() == REPETITION
    assert out.components["refusal"].tolist() == REFUSAL
    assert torch.equal(out.components["kl"], KL_N)
    assert out.components["entropy_bonus"].tolist() == [2.0, 3.0, 0.5]  # 5 capped at 3
    assert all(v.dtype == torch.float32 and v.shape == (3,) for v in out.components.values())


def test_zscore_by_hand() -> None:
    out = Reward(ATTACK, zscore=True)(_batch())
    assert torch.allclose(out.total_N, torch.tensor(ZSCORED), atol=1e-4)
    assert torch.allclose(out.components["reward_raw"], torch.tensor(RAW), atol=1e-6)  # before the z-score


def test_weight_zero_term_is_logged_not_rewarded() -> None:
    out = Reward({**ATTACK, "response_entropy": 0.0})(_batch())
    assert torch.allclose(out.total_N, torch.tensor(RAW), atol=1e-6)
    assert out.components["response_entropy"].tolist() == [2.0, 5.0, 0.5]


def test_the_defense_reward_and_term_parameters() -> None:
    # -mean entropy - 0.001 x kl: -2 - 0.0002, -5 - 0, -0.5 - 0.001
    out = Reward({"response_entropy": -1.0, "kl": -0.001})(_batch())
    assert torch.allclose(out.total_N, torch.tensor([-2.0002, -5.0, -0.501]), atol=1e-6)
    # entropy_bonus capped at 1; repetition over bigrams: ab bc ca ab bc -> 1 - 3/5
    out = Reward({"entropy_bonus": TermSpec(fn="entropy_bonus", params={"cap": 1.0}),
                  "repetition": TermSpec(fn="repetition", weight=-1.0, params={"ngram": 2})})(_batch())
    assert out.components["entropy_bonus"].tolist() == [1.0, 1.0, 0.5]
    assert out.components["repetition"][0].item() == pytest.approx(0.4)


def test_embedded_toxicity_term_equals_its_scorer() -> None:
    out = Reward({"toxicity": 1.0})(_batch(kl_N=None, completions=False))
    assert out.components["toxicity"].tolist() == pytest.approx(EmbeddedToxicityScorer().score(TEXTS))


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadServer]:
    served = ThreadServer(create_app(RewardServerConfig(max_chars=20)))
    yield served
    served.stop()


def test_toxicity_over_http_records_the_server_and_logs_cut_texts(server: ThreadServer) -> None:
    spec = TermSpec(fn="toxicity", params=ToxicityConfig(url=server.url, retries=0))
    reward = Reward({"toxicity": spec})
    # recorded when the term is built, into the term's own parameters (the run's config, saved before step 1)
    assert (spec.params["server_model"], spec.params["server_label"]) == ("embedded", "toxic")
    out = reward(_batch(kl_N=None, completions=False))
    assert out.components["toxicity_truncated"].tolist() == [0.0, 1.0, 0.0]  # 24 characters > max_chars=20
    assert "toxicity_truncated" not in reward.terms  # logged, not rewarded
    assert torch.equal(out.total_N, out.components["toxicity"])


def test_missing_inputs_name_the_term() -> None:
    with pytest.raises(ExperimentError, match="reward term 'kl' reads the training loop's KL.*no kl_N"):
        Reward({"kl": -0.1})(_batch(kl_N=None))
    with pytest.raises(ExperimentError, match="reward term 'response_entropy' reads .*no completions"):
        Reward({"response_entropy": -1.0})(_batch(completions=False))


def test_bad_weights_and_params_are_user_errors() -> None:
    with pytest.raises(UserError, match="unknown reward term 'toxic' \\(known: "):
        Reward({"toxic": 1.0})
    with pytest.raises(ValidationError, match="params.ngram"):
        TermSpec(fn="repetition", weight=-1.0, params={"ngram": 0})
    with pytest.raises(UserError, match="reward term 'refusal' has a non-finite weight nan"):
        Reward({"refusal": float("nan")})
    with pytest.raises(UserError, match="reward term 'refusal' needs a number as its weight"):
        Reward({"refusal": "high"})
    with pytest.raises(UserError, match="at least one term"):
        Reward({})


def _probe(values: list[float], logged: dict[str, list[float]] | None = None) -> RewardTerm:
    def build(_: object):
        def fn(batch: ScoringInput):
            out = torch.tensor(values)
            return out if logged is None else TermOutput(out, {k: torch.tensor(v) for k, v in logged.items()})
        return fn
    return RewardTerm("probe", "a test term", "kl", None, build)


def test_a_term_may_log_extra_components(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REWARD_TERMS, "probe", _probe([1.0, 2.0, 3.0], {"probe_extra": [0.0, 1.0, 0.0]}))
    out = Reward({"probe": 2.0})(_batch())
    assert out.total_N.tolist() == [2.0, 4.0, 6.0]
    assert out.components["probe_extra"].tolist() == [0.0, 1.0, 0.0]
    monkeypatch.setitem(REWARD_TERMS, "probe", _probe([1.0, 2.0, 3.0], {"kl": [0.0, 1.0, 0.0]}))
    with pytest.raises(ExperimentError, match="logs component 'kl', the name of a term"):
        Reward({"probe": 1.0, "kl": 0.0})(_batch())


@pytest.mark.parametrize(("values", "says"), [
    ([1.0, float("nan"), 0.0], "reward term 'probe' is non-finite \\(nan\\) at completion 1"),
    ([1.0, 2.0], "reward term 'probe' returned shape \\(2,\\) for 3 completions"),
])
def test_a_bad_term_output_names_the_term(monkeypatch: pytest.MonkeyPatch, values: list[float], says: str) -> None:
    monkeypatch.setitem(REWARD_TERMS, "probe", _probe(values))
    with pytest.raises(ExperimentError, match=says):
        Reward({"probe": 1.0})(_batch())


def test_scoring_input_is_checked() -> None:
    with pytest.raises(ExperimentError, match="2 prompts for 3 texts"):
        ScoringInput(texts=TEXTS, prompts=["p", "q"])
    with pytest.raises(ExperimentError, match="kl_N has shape \\(2,\\), expected \\(3,\\)"):
        ScoringInput(texts=TEXTS, prompts=["p"] * 3, kl_N=torch.zeros(2))
