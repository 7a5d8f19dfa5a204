"""The config tree: every default lives here once, with a one-line description (the `--help` text).

Configs load from YAML or JSON and take CLI overrides by dotted name (`--reward.kl_beta 0.2`) or by
flat name (`--kl_beta 0.2`, see `FLAT_NAMES`). Unknown keys and out-of-range values raise `UserError`
naming the field. The resolved config is written into each run directory.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from purplerl.errors import UserError
from purplerl.files import plain_name_problem, read_text
from purplerl.scalars import admitted_types, value_problem

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"
# the reward server's API key comes from this env var only: a key must never land in a saved config.yaml
API_KEY_ENV = "PURPLERL_REWARD_API_KEY"


class Section(BaseModel):
    # NaN and inf mean nothing in any setting here (null already says "never"), and a NaN threshold would
    # silently switch its check off: no float field takes them, new fields included.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_yaml_retyping(cls, value: Any, info: Any) -> Any:
        """`--steps yes` is an error, not one step (purplerl.scalars)."""
        problem = value_problem(value, cls.model_fields[info.field_name].annotation)
        if problem:
            raise ValueError(problem)
        return value


class ModelConfig(Section):
    name: str = Field(EMBEDDED_MODEL, description="policy model: 'embedded:smollm2-135m-instruct', an HF id or a local path")
    revision: str | None = Field(None, description="hub revision (branch, tag or commit) of an HF model id")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="dtype of the frozen base weights and compute; 'auto': bfloat16 on bf16-capable GPUs and AMX/AVX512-BF16 CPUs, else float32 (the optimizer keeps float32 master weights of the adapter)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="'auto' picks cuda when available, else cpu")
    lora_rank: int = Field(16, ge=1, le=1024, description="LoRA rank r")
    lora_alpha: float = Field(32.0, gt=0, description="LoRA alpha (scale = alpha / r)")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout")
    lora_targets: str = Field("all-linear", description="'all-linear' or comma-separated module names (q_proj,v_proj)")
    init_adapter: str | None = Field(None, description="PEFT adapter dir to start the policy from (e.g. a defended model)")
    autocast_bf16: bool = Field(False, description="run matmuls in bfloat16 under autocast, fp32 weights (fast on AMX/AVX512-BF16 CPUs and GPUs)")
    threads: int = Field(0, ge=0, description="torch CPU threads; 0 keeps torch's default")
    merged_sampler: bool = Field(True, description="sample from a plain copy of the model with the LoRA update merged in (faster decoding; costs one extra copy of the weights)")
    fused_lora: bool = Field(True, description="run plain LoRA layers (no dropout) as one accumulating matmul, scaling folded into B (same maths, fewer elementwise passes)")


class SamplingConfig(Section):
    group_size: int = Field(4, ge=2, le=256, description="completions per prompt (G); GRPO needs >= 2")
    max_new_tokens: int = Field(48, ge=1, le=32768, description="maximum tokens per completion")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling threshold (1 disables)")
    top_k: int = Field(0, ge=0, description="top-k truncation (0 disables)")


class TrainingConfig(Section):
    steps: int = Field(60, ge=1, description="number of RL steps (one rollout batch + one optimizer step each)")
    batch_size: int = Field(8, ge=1, description="prompts per step (B); sequences per step = B x G")
    lr: float = Field(1e-4, gt=0.0, lt=1.0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay")
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1")
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0, description="AdamW beta2")
    adam_eps: float = Field(1e-8, gt=0.0, description="AdamW epsilon")
    max_grad_norm: float = Field(1.0, ge=0.0, description="gradient-norm clip (0 disables)")
    loss: Literal["importance_sampling", "ppo_clip"] = Field("importance_sampling", description="policy-gradient loss")
    clip_low: float = Field(0.2, ge=0.0, lt=1.0, description="PPO clip epsilon below 1")
    clip_high: float = Field(0.2, ge=0.0, description="PPO clip epsilon above 1 (> clip_low: clip-higher)")
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"] = Field("grpo", description="advantage estimator (algorithms.advantages)")
    advantage_std: bool = Field(False, description="divide GRPO advantages by the group std")
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = Field("token_mean", description="how per-token losses become one number (seq_mean_token_sum_norm: Dr. GRPO)")
    ppo_epochs: int = Field(1, ge=1, le=64, description="passes over each rollout batch")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per pass (the rollout batch is split into this many)")
    noiser: bool = Field(False, description="interleave Token Noiser supervised steps (Token Buncher defense)")
    noiser_warmup: int = Field(25, ge=0, description="RL steps before the first Token Noiser step")
    noiser_every: int = Field(2, ge=1, description="after the warmup, every N-th step is a Token Noiser step")
    noiser_epsilon: float = Field(0.1, ge=0.0, le=1.0, description="weight of the random-noise cross-entropy in the Token Noiser loss")
    micro_batch_size: int = Field(64, ge=1, description="max sequences per forward/backward pass (gradients accumulate to the full batch)")
    micro_batch_tokens: int = Field(4096, ge=1, description="max padded tokens per forward/backward pass: length-sorted sequences fill each pass up to this (the memory knob)")
    old_logprobs: Literal["auto", "sampler", "current"] = Field("auto", description="behaviour logprobs of the importance ratio: 'sampler' (recorded while sampling), 'current' (the policy's own, detached: ratio 1, exact on-policy), 'auto' (current when each rollout batch gets one update, else sampler)")
    seed: int = Field(0, description="seed for data order, sampling and LoRA init")
    early_stop_toxicity: float | None = Field(0.8, description="stop when a step's mean toxicity exceeds this (null: never)")
    early_stop_repetition: float | None = Field(0.5, description="stop when a step's mean repetition ratio exceeds this (null: never)")


class DataConfig(Section):
    source: str = Field("builtin:redteam", description="'builtin:redteam', a .jsonl/.json/.parquet file, or 'hf:ORG/NAME'")
    split: str = Field("train", description="split to train on (builtin and hf sources)")
    prompt_field: str = Field("prompt", description="field holding the prompt text or chat messages")
    category_field: str | None = Field(None, description="field holding the harm category (auto for known schemas)")
    hf_config: str | None = Field(None, description="HF dataset config name")
    filters: dict[str, Any] = Field(default_factory=dict, description="keep rows whose fields equal these values, e.g. {is_safe: false}")
    limit: int | None = Field(None, ge=1, description="keep at most this many prompts (after filtering)")
    shuffle: bool = Field(True, description="shuffle prompts each epoch (seeded)")
    template: Literal["chat", "base"] = Field("chat", description="'chat' uses the tokenizer's chat template; 'base' plain text")
    system_prompt: str | None = Field(None, description="system message prepended to every prompt (null: model default)")
    max_prompt_tokens: int = Field(256, ge=8, description="prompts longer than this are cut from the left")


class ClassifierConfig(Section):
    """Which scorer to load: shared by in-process scoring (ToxicityConfig) and the reward server."""

    model: str = Field("embedded", description="'embedded' (alt-profanity-check) or an HF sequence-classification id/path")
    label: str | int | None = Field(None, description="HF classifier output scored: label name or index (required for HF models)")
    device: Literal["auto", "cpu", "cuda"] = Field("cpu", description="device of an HF classifier")
    batch_size: int = Field(32, ge=1, description="texts per classifier forward pass")
    max_length: int = Field(512, ge=8, description="classifier input truncation in tokens")


class ToxicityConfig(ClassifierConfig):
    url: str | None = Field(None, description="reward server URL (e.g. http://127.0.0.1:50050): score there, not in-process; API key from env PURPLERL_REWARD_API_KEY")
    timeout_s: float = Field(30.0, gt=0.0, description="reward server: seconds to wait for one answer")
    retries: int = Field(3, ge=0, le=20, description="reward server: retries after a connection error or HTTP 5xx, then the run stops")
    backoff_s: float = Field(0.5, ge=0.0, description="reward server: wait before the first retry, doubled after each")
    server_model: str | None = Field(None, description="recorded from the server's /info at start; a resumed run refuses a server that now serves another model")
    server_label: str | None = Field(None, description="recorded from the server's /info at start, like server_model")

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return url.rstrip("/") if url is not None else None

    @model_validator(mode="after")
    def _check_server_exclusive(self) -> ToxicityConfig:
        # the server decides what is scored; a model named here as well would be silently ignored
        if self.url is not None and self.model != "embedded":
            raise ValueError("set either url (the server picks the model: purplerl serve-reward --model ...) "
                             "or model, not both")
        return self


class RewardServerConfig(ClassifierConfig):
    """Settings of `purplerl serve-reward` (its own process, not part of a run's Config)."""

    host: str = Field("127.0.0.1", description="address to listen on (a non-loopback address without an API key is warned about)")
    port: int = Field(50050, ge=1, le=65535, description="TCP port to listen on")
    api_key: SecretStr | None = Field(None, description="when set, /score and /info need the header 'Authorization: Bearer KEY'")
    max_texts: int = Field(1024, ge=1, description="most texts in one request (more: HTTP 413; the client splits its batches to fit)")
    max_chars: int = Field(20000, ge=1, description="texts and prompts longer than this are cut to it before scoring and listed in `truncated`")
    max_body_bytes: int = Field(32 * 2**20, ge=1024, description="largest request body in bytes (more: HTTP 413)")
    max_batch_texts: int = Field(256, ge=1, description="micro-batching: most texts per scorer call, gathered from pending requests")
    batch_wait_ms: float = Field(2.0, ge=0.0, le=1000.0, description="micro-batching: how long to wait for more requests when a batch is not full")
    max_pending: int = Field(4096, ge=1, description="requests waiting for the scorer before new ones get HTTP 503 (busy)")
    score_timeout_s: float = Field(60.0, gt=0.0, le=3600.0, description="a scorer call unanswered after this many seconds: its requests get HTTP 503 and /health says 'degraded' until it returns")
    header_timeout_s: float = Field(10.0, gt=0.0, le=3600.0, description="seconds a client has to send a request's headers, from connecting or from the previous answer (then the connection is closed)")
    body_timeout_s: float = Field(60.0, gt=0.0, le=3600.0, description="seconds a client has to send a request body once its headers are in (more: HTTP 408)")
    keep_alive_s: float = Field(5.0, gt=0.0, le=3600.0, description="an idle kept-alive connection is closed after this many seconds")
    max_connections: int = Field(1000, ge=1, description="open connections served at once, idle ones included; a request on one more gets HTTP 503")
    max_header_bytes: int = Field(16384, ge=1024, description="request line plus headers still incomplete past this many bytes: HTTP 400")

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


class RewardConfig(Section):
    toxicity: ToxicityConfig = Field(default_factory=ToxicityConfig, description="the harm/toxicity scorer")
    toxicity_weight: float = Field(1.0, description="weight of the toxicity score in the reward")
    repetition_penalty: float = Field(0.3, ge=0.0, description="weight of the repeated-n-gram ratio penalty")
    repetition_ngram: int = Field(3, ge=1, le=16, description="n of the n-grams counted by the repetition ratio")
    kl_beta: float = Field(0.1, ge=0.0, description="weight of KL(policy || base) subtracted from the reward")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k1", description="per-token KL estimator (Schulman 2020)")
    kl_in: Literal["reward", "loss"] = Field("reward", description="apply the KL penalty in the reward or as a loss term")
    entropy_bonus_cap: float | None = Field(None, ge=0.0, description="adaptive attack: add min(mean token entropy, cap) to the reward (Token Buncher uses 3.0)")
    refusal_penalty: float = Field(0.0, ge=0.0, description="weight of the keyword refusal judge subtracted from the reward (rewards not refusing; for attacks on an aligned model)")
    zscore: bool = Field(False, description="z-score normalize rewards over the batch before advantages")


class SFTConfig(Section):
    messages_field: str = Field("messages", description="field holding chat messages whose assistant turns are trained on (the last turn must be the assistant's)")
    prompt_field: str = Field("prompt", description="without messages: field holding the prompt (text or chat messages)")
    completion_field: str = Field("completion", description="without messages: field holding the assistant's answer")
    max_tokens: int = Field(1024, ge=8, description="longest sequence trained on; longer ones are cut at the end (their last tokens are not trained)")
    eval_split: str | None = Field(None, description="held-out split of the data source for the eval loss (null: hold out eval_fraction of the training split)")
    eval_fraction: float = Field(0.05, ge=0.0, lt=1.0, description="share of the training split held out for the eval loss when eval_split is null (0: no eval)")
    eval_every: int = Field(10, ge=0, description="compute the held-out loss every N steps and at the last step (0: never)")
    eval_limit: int = Field(256, ge=1, description="at most this many held-out examples")


class LoggingConfig(Section):
    progress: bool = Field(True, description="show a rich progress bar")
    print_samples: int = Field(0, ge=0, description="completions printed to the console per step")


class RunConfig(Section):
    output_dir: str = Field("runs", description="parent directory of run directories")
    name: str | None = Field(None, description="run directory name (null: recipe_model_hyperparameters_sSEED)")
    save_every: int = Field(10, ge=1, description="checkpoint every N steps (and always at the end)")
    keep_last: int = Field(3, ge=1, description="checkpoints kept on disk")

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str | None) -> str | None:
        # the name is one directory under output_dir: '../x' or '/tmp/x' would put the run somewhere else
        problem = None if name is None else plain_name_problem(name)
        if problem:
            raise ValueError(problem)
        return name


class Config(Section):
    recipe: str = Field("attack", description="recipe this config is for")
    engine: Literal["local"] = Field("local", description="where sampling and training run (see purplerl.engines)")
    model: ModelConfig = Field(default_factory=ModelConfig, description="policy model and adapter")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="rollout sampling")
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="optimization")
    data: DataConfig = Field(default_factory=DataConfig, description="prompt source")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="reward composition")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="supervised fine-tuning (purplerl sft)")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="console output")
    run: RunConfig = Field(default_factory=RunConfig, description="run directory and checkpoints")

    @model_validator(mode="after")
    def _check_cross_fields(self) -> Config:
        if self.reward.toxicity.model != "embedded" and self.reward.toxicity.label is None:
            raise ValueError("reward.toxicity.label is required for an HF classifier (a label name or index)")
        return self


# Flat CLI names (the red-team trainer's habit) -> dotted config paths.
FLAT_NAMES: dict[str, str] = {
    "model": "model.name",
    "dtype": "model.dtype",
    "device": "model.device",
    "lora_rank": "model.lora_rank",
    "lora_alpha": "model.lora_alpha",
    "init_adapter": "model.init_adapter",
    "group_size": "sampling.group_size",
    "max_new_tokens": "sampling.max_new_tokens",
    "temperature": "sampling.temperature",
    "top_p": "sampling.top_p",
    "steps": "training.steps",
    "batch_size": "training.batch_size",
    "lr": "training.lr",
    "loss": "training.loss",
    "seed": "training.seed",
    "micro_batch_size": "training.micro_batch_size",
    "micro_batch_tokens": "training.micro_batch_tokens",
    "max_grad_norm": "training.max_grad_norm",
    "data": "data.source",
    "split": "data.split",
    "system_prompt": "data.system_prompt",
    "max_prompt_tokens": "data.max_prompt_tokens",
    "toxicity_model": "reward.toxicity.model",
    "toxicity_label": "reward.toxicity.label",
    "kl_beta": "reward.kl_beta",
    "repetition_penalty": "reward.repetition_penalty",
    "zscore": "reward.zscore",
    "output_dir": "run.output_dir",
    "name": "run.name",
    "save_every": "run.save_every",
}


def _format_validation_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "config"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    return f"config field '{where}': {msg}" + (f" (got {first['input']!r})" if first["type"] != "extra_forbidden"
                                               and not isinstance(first["input"], dict) else "")


def build_config(data: dict[str, Any]) -> Config:
    """Validate a nested dict into a Config, raising UserError that names the bad field."""
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise UserError(_format_validation_error(err)) from None


def build_server_config(values: dict[str, Any], name_of: Callable[[str], str] = lambda f: "--" + f.replace("_", "-"),
                        ) -> RewardServerConfig:
    """Validate reward server settings; UserError names the bad one as the user spelled it (`name_of(field)`)."""
    try:
        return RewardServerConfig.model_validate(values)
    except ValidationError as err:
        first = err.errors()[0]
        where = name_of(str(first["loc"][0])) if first["loc"] else "reward server settings"
        shown = f" (got {first['input']!r})" if first["loc"] and first["loc"][0] != "api_key" else ""
        raise UserError(f"{where}: {first['msg'].removeprefix('Value error, ')}{shown}") from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON config file into a nested dict."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    text = read_text(path)
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise UserError(f"cannot parse config {path}: {str(err).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config {path} must hold a mapping at the top level")
    return data


def _leaf_annotation(dotted: str) -> Any:
    """The type annotation of a dotted config field, or None where the path names no field."""
    model: type[BaseModel] = Config
    *sections, leaf = dotted.split(".")
    for part in sections:
        info = model.model_fields.get(part)
        if info is None or not (isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)):
            return None
        model = info.annotation
    info = model.model_fields.get(leaf)
    return info.annotation if info is not None else None


def _parse_value(text: str, dotted: str) -> Any:
    """CLI values are YAML scalars: 0.1 -> float, true -> bool, null -> None, [a, b] -> list.

    A text field keeps the text as typed (only `null` still means None): YAML would turn `--name 007`
    into the int 7 and `--system_prompt yes` into True, which a str field then rejects.
    """
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    annotation = _leaf_annotation(dotted)
    if value is not None and annotation in (str, str | None):
        return text
    admitted = admitted_types(annotation)
    if isinstance(value, bool) and str in admitted and bool not in admitted:
        return text  # `--reward.toxicity.label yes` names a label; it is not the index True == 1
    return value


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """Turn ['--kl_beta', '0.2', '--reward.zscore=true'] into {'reward.kl_beta': 0.2, ...}."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise UserError(f"unexpected argument '{arg}': overrides look like --name value")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise UserError(f"option --{key} needs a value")
            value = args[i + 1]
            i += 1
        i += 1
        key = key.replace("-", "_")
        dotted = FLAT_NAMES.get(key, key)
        if "." not in dotted and dotted not in Config.model_fields:
            raise UserError(f"unknown option --{key} (see --help for config fields)")
        out[dotted] = _parse_value(value, dotted)
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys in a nested dict (copying the path), e.g. 'reward.toxicity.model'."""
    data = json.loads(json.dumps(data))
    for dotted, value in overrides.items():
        node = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UserError(f"cannot set {dotted}: '{part}' is not a section")
            node = child
        node[parts[-1]] = value
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: dict[str, Any] | None = None) -> Config:
    """Recipe defaults (base) <- config file <- CLI overrides, validated once at the end."""
    data = json.loads(json.dumps(base or {}))
    if path is not None:
        data = _deep_merge(data, read_config_file(path))
    data = apply_overrides(data, parse_overrides(overrides or []))
    return build_config(data)


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def commented_yaml(config: Config) -> str:
    """The config as YAML with each field's description as a trailing comment (for people, loadable as-is)."""
    descriptions = {name: desc for name, _, desc in field_help()}
    lines: list[str] = []

    def emit(node: dict[str, Any], prefix: str, indent: str) -> None:
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if isinstance(value, dict) and dotted not in descriptions:
                lines.append(f"{indent}{key}:")
                emit(value, dotted + ".", indent + "  ")
                continue
            rendered = yaml.safe_dump({key: value}, default_flow_style=True, width=10**6).strip()[1:-1]
            lines.append(f"{indent}{rendered}  # {descriptions.get(dotted, '')}")

    emit(config.model_dump(mode="json"), "", "")
    return "\n".join(lines) + "\n"


def save_config(config: Config, path: str | Path) -> None:
    Path(path).write_text(commented_yaml(config))


def field_help() -> list[tuple[str, str, str]]:
    """(dotted name, default, description) for every leaf field: the CLI's --help table."""
    rows: list[tuple[str, str, str]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            ann = info.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
                continue
            default = info.get_default(call_default_factory=True)
            rows.append((f"{prefix}{name}", json.dumps(default), info.description or ""))

    walk(Config, "")
    return rows
