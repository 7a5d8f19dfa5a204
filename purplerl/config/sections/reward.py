"""What scores completions: a text classifier in-process or behind the reward server, the server's own settings,
and the KL part of every RL recipe's reward."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from purplerl.config.base import Registry, Section, read_when

KL_ESTIMATOR = Registry("purplerl.algorithms.names:KL_ESTIMATOR_NAMES", "KL estimator").field()


def _hf(scorer: Any) -> bool:
    return scorer.model != "embedded"


def _served(scorer: Any) -> bool:
    return scorer.url is not None


def _hf_field(annotation: Any) -> Any:
    return read_when(annotation, _hf, "model is an HF classifier")


def _served_field(annotation: Any) -> Any:
    return read_when(annotation, _served, "url is set")


class ClassifierConfig(Section):
    """Which scorer to load: shared by in-process scoring (ToxicityConfig) and the reward server."""

    model: str = Field("embedded", description=(
        "'embedded' (alt-profanity-check) or an HF sequence-classification id/path"))
    label: _hf_field(str | int | None) = Field(None, description=(
        "HF classifier output scored: label name or index (required for HF models)"))
    device: _hf_field(Literal["auto", "cpu", "cuda"]) = Field("cpu", description="device of an HF classifier")
    batch_size: _hf_field(int) = Field(32, ge=1, description="texts per classifier forward pass")
    max_length: _hf_field(int) = Field(512, ge=8, description="classifier input truncation in tokens")


class ToxicityConfig(ClassifierConfig):
    url: str | None = Field(None, description=(
        "reward server URL (e.g. http://127.0.0.1:50050): score there, not in-process; API key from env "
        "PURPLERL_REWARD_API_KEY"))
    timeout_s: _served_field(float) = Field(30.0, gt=0.0, description="reward server: seconds to wait for one answer")
    retries: _served_field(int) = Field(3, ge=0, le=20, description=(
        "reward server: retries after a connection error or HTTP 5xx, then the run stops"))
    backoff_s: _served_field(float) = Field(0.5, ge=0.0, description=(
        "reward server: wait before the first retry, doubled after each"))
    server_model: _served_field(str | None) = Field(None, description=(
        "metadata, not a setting: recorded from the server's /info at start; a resumed run refuses a server that now "
        "serves another model"))
    server_label: _served_field(str | None) = Field(None, description=(
        "metadata, not a setting: recorded from the server's /info at start, like server_model"))

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return url.rstrip("/") if url is not None else None

    def incomplete(self) -> str | None:
        """What this scorer still lacks as a reward term: an HF classifier's label."""
        if self.model != "embedded" and self.label is None:
            return "label is required for an HF classifier (a label name or index)"
        return None

    @model_validator(mode="after")
    def _check_server_exclusive(self) -> ToxicityConfig:
        # the server decides what is scored; a model named here as well would be silently ignored
        if self.url is not None and self.model != "embedded":
            raise ValueError("set either url (the server picks the model: purplerl serve-reward --model ...) "
                             "or model, not both")
        return self


class RewardServerConfig(ClassifierConfig):
    """Settings of `purplerl serve-reward` (its own process, not part of a run's Config)."""

    model: str = Field("embedded", description=(
        "'embedded' (alt-profanity-check), an HF sequence-classification id/path, or a reward model's run dir or "
        "checkpoint (purplerl reward-model or prm; its term's parameters: --serve.term reward_model or prm)"))
    # the server refuses a label for the embedded scorer itself, naming --label (purplerl.rewards.served)
    label: str | int | None = Field(None, description=(
        "HF classifier output scored: label name or index (required for HF models)"))
    host: str = Field("127.0.0.1", description=(
        "address to listen on (a non-loopback address without an API key is warned about)"))
    port: int = Field(50050, ge=1, le=65535, description="TCP port to listen on")
    api_key: SecretStr | None = Field(None, description=(
        "when set, /score and /info need the header 'Authorization: Bearer KEY'; set it by env "
        "PURPLERL_REWARD_API_KEY, since on the command line every user of the machine sees it (ps)"))
    max_texts: int = Field(1024, ge=1, description=(
        "most texts in one request (more: HTTP 413; the client splits its batches to fit)"))
    max_chars: int = Field(20000, ge=1, description=(
        "texts and prompts longer than this are cut to it before scoring and listed in `truncated`"))
    max_body_bytes: int = Field(32 * 2**20, ge=1024, description="largest request body in bytes (more: HTTP 413)")
    max_batch_texts: int = Field(256, ge=1, description=(
        "micro-batching: most texts per scorer call, gathered from pending requests"))
    batch_wait_ms: float = Field(2.0, ge=0.0, le=1000.0, description=(
        "micro-batching: how long to wait for more requests when a batch is not full"))
    max_pending: int = Field(4096, ge=1, description=(
        "requests waiting for the scorer before new ones get HTTP 503 (busy)"))
    score_timeout_s: float = Field(60.0, gt=0.0, le=3600.0, description=(
        "a scorer call unanswered after this many seconds: its requests get HTTP 503 and /health says 'degraded' until "
        "it returns"))
    header_timeout_s: float = Field(10.0, gt=0.0, le=3600.0, description=(
        "seconds a client has to send a request's headers, from connecting or from the previous answer (then the "
        "connection is closed)"))
    body_timeout_s: float = Field(60.0, gt=0.0, le=3600.0, description=(
        "seconds a client has to send a request body once its headers are in (more: HTTP 408)"))
    keep_alive_s: float = Field(5.0, gt=0.0, le=3600.0, description=(
        "an idle kept-alive connection is closed after this many seconds"))
    max_connections: int = Field(1000, ge=1, description=(
        "open connections served at once, idle ones included; a request on one more gets HTTP 503"))
    max_header_bytes: int = Field(16384, ge=1024, description=(
        "request line plus headers over this many bytes, however they arrive: HTTP 400"))

    @staticmethod
    def key_problem(key: str) -> str | None:
        """Why `key` cannot serve as a bearer token, or None; the reward server's client checks its key with it too."""
        if not key.strip():
            return "an empty API key would let anyone in; leave it unset instead"
        bad = next((i for i, ch in enumerate(key) if not "!" <= ch <= "~"), None)
        if bad is not None:
            # an HTTP header carries ASCII, and servers strip the spaces around it: such a key can never match.
            # The character itself is not shown: the key is a secret.
            return (f"an API key must be printable ASCII without spaces, but character {bad + 1} of "
                    f"{len(key)} is not")
        return None

    @field_validator("api_key")
    @classmethod
    def _check_key(cls, key: SecretStr | None) -> SecretStr | None:
        problem = None if key is None else cls.key_problem(key.get_secret_value())
        if problem is not None:
            raise ValueError(problem)
        return key


class RewardBase(Section):
    """What every RL recipe's reward section holds besides its terms (each recipe adds `terms` and the parameters
    of the registered reward terms: purplerl.train.recipe.reward_section)."""

    kl_beta: float = Field(0.1, ge=0.0, description=(
        "weight of KL(policy || base): subtracted from the reward, or a loss term (kl_in)"))
    kl_estimator: KL_ESTIMATOR = Field("k1", description="per-token KL estimator (Schulman 2020)")
    kl_in: Literal["reward", "loss"] = Field("reward", description=(
        "apply the KL penalty in the reward or as a loss term"))
    zscore: bool = Field(False, description="z-score normalize rewards over the batch before advantages")
