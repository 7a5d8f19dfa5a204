"""The sections of the config tree, by concern. Every default lives here once, with a one-line description
(the `--help` text and the comment in a run's config.yaml); commands share a section where they share a
concern (GenerationConfig for every sampler, PromptFormatConfig for every prompt renderer)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, SecretStr, field_validator, model_validator

from purplerl.algorithms.names import CRITIC_ESTIMATOR_NAMES
from purplerl.config.base import EMBEDDED_MODEL, Registry, Section, Template, comma_list, once_each, read_when
from purplerl.files import absolute_source, looks_local, plain_name_problem

# choices: the algorithm registries' names (which each registry checks it holds), never typed again here
POLICY_LOSS = Registry("purplerl.algorithms.names:POLICY_GRADIENT_LOSS_NAMES", "policy-gradient loss").field()
ADVANTAGE = Registry("purplerl.algorithms.names:ESTIMATOR_NAMES", "advantage estimator").field()
LOSS_AGGREGATION = Registry("purplerl.algorithms.names:LOSS_AGGREGATION_NAMES", "loss aggregation").field()
KL_ESTIMATOR = Registry("purplerl.algorithms.names:KL_ESTIMATOR_NAMES", "KL estimator").field()
TRACKER_NAMES = ("wandb", "tensorboard", "mlflow")  # purplerl.train.trackers opens each


def _hub_id(model: Any) -> bool:
    return not model.name.startswith("embedded:") and not looks_local(model.name)


class ModelLoadConfig(Section):
    """Which model to load and where: all that evaluating or sampling a model needs."""

    name: str = Field(EMBEDDED_MODEL, description="policy model: 'embedded:smollm2-135m-instruct', 'embedded:smollm2-135m-safe' (built by purplerl align; the attack's default), an HF id or a local path")
    revision: read_when(str | None, _hub_id, "model.name is a hub id") = Field(None, description="hub revision (branch, tag or commit) of an HF model id")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="dtype of the frozen base weights and compute; 'auto': bfloat16 on bf16-capable GPUs and AMX/AVX512-BF16 CPUs, else float32 (the optimizer keeps float32 master weights of the adapter)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="'auto' picks cuda when available, else cpu")


def _lora(model: Any) -> bool:
    return model.finetune == "lora"


def _lora_on_cuda(model: Any) -> bool:
    # bitsandbytes' 4-bit kernels run on CUDA only: the setting is listed once the device is named (--device cuda)
    return model.finetune == "lora" and model.device == "cuda"


class ModelConfig(ModelLoadConfig):
    """The policy a recipe trains: the model to load and what of it trains."""

    finetune: Literal["lora", "full"] = Field("lora", description="what trains: 'lora' (adapters on a frozen base) or 'full' (every weight, with an fp32 master and two AdamW moments each, ~16 bytes/param: ~2.2 GB for a 135M model)")
    lora_rank: read_when(int, _lora, "model.finetune is lora") = Field(16, ge=1, le=1024, description="LoRA rank r")
    lora_alpha: read_when(float, _lora, "model.finetune is lora") = Field(32.0, gt=0, description="LoRA alpha (scale = alpha / r)")
    lora_dropout: read_when(float, _lora, "model.finetune is lora") = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout")
    lora_targets: read_when(str, _lora, "model.finetune is lora") = Field("all-linear", description="'all-linear' or comma-separated module names (q_proj,v_proj)")
    init_adapter: read_when(str | None, _lora, "model.finetune is lora") = Field(None, description="PEFT adapter dir to start the policy from (e.g. a defended model)")
    quantize: read_when(Literal["none", "4bit"], _lora_on_cuda, "model.finetune is lora and model.device is cuda") = Field("none", description="'4bit': load the frozen base in 4 bits through bitsandbytes (QLoRA: NF4, double quantization, bf16 compute); the local engine on CUDA only")


class GenerationConfig(Section):
    """How completions are drawn: shared by RL rollouts, `sample` and `eval`, so each default is written once."""

    max_new_tokens: int = Field(48, ge=1, le=32768, description="maximum tokens per completion")
    temperature: float = Field(1.0, ge=0.0, le=10.0, description="sampling temperature (0: greedy; RL needs > 0)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling threshold (1 disables)")
    top_k: int = Field(0, ge=0, description="top-k truncation (0 disables)")


class SamplingConfig(GenerationConfig):
    """Rollout sampling of an RL recipe: a group of completions per prompt."""

    group_size: int = Field(4, ge=2, le=256, description="completions per prompt (G); GRPO needs >= 2")

    @field_validator("temperature")
    @classmethod
    def _sampled(cls, temperature: float) -> float:
        # greedy decoding gives a group G identical completions: every advantage would be zero
        if temperature <= 0.0:
            raise ValueError("must be > 0 for RL rollouts (0 would make every completion of a group the same)")
        return temperature


class TrainingConfig(Section):
    """The optimizer and the step budget: shared by every training recipe."""

    @field_validator("adam_betas")
    @classmethod
    def _betas(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"each beta must be in [0, 1), got {list(betas)}")
        return betas

    steps: int = Field(60, ge=1, description="number of training steps (one optimizer step each)")
    batch_size: int = Field(8, ge=1, description="prompts (RL) or examples (SFT) per step (B)")
    lr: float = Field(1e-4, gt=0.0, lt=1.0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (beta1, beta2), each in [0, 1)")
    adam_eps: float = Field(1e-8, gt=0.0, description="AdamW epsilon")
    max_grad_norm: float = Field(1.0, ge=0.0, description="gradient-norm clip (0 disables)")
    seed: int = Field(0, description="seed for data order, sampling and LoRA init")


def _clipped(t: Any) -> bool:
    return t.loss != "importance_sampling"


def _collapse(t: Any) -> bool:
    return t.collapse_stop


def _critic(t: Any) -> bool:
    return t.advantage in CRITIC_ESTIMATOR_NAMES


class RLTrainingConfig(TrainingConfig):
    """An RL recipe's training: the optimizer, the policy-gradient loss, and the stop rules every RL recipe has."""

    loss: POLICY_LOSS = Field("importance_sampling", description="policy-gradient loss")
    clip_low: read_when(float, _clipped, "training.loss clips the ratio (ppo_clip)") = Field(0.2, ge=0.0, lt=1.0, description="PPO clip epsilon below 1")
    clip_high: read_when(float, _clipped, "training.loss clips the ratio (ppo_clip)") = Field(0.2, ge=0.0, description="PPO clip epsilon above 1 (> clip_low: clip-higher)")
    advantage: ADVANTAGE = Field("grpo", description="advantage estimator (algorithms.advantages)")
    advantage_std: read_when(bool, lambda t: not _critic(t), "training.advantage takes no critic's values") = Field(False, description="divide GRPO advantages by the group std")
    gamma: read_when(float, _critic, "training.advantage takes a critic's values (gae)") = Field(1.0, ge=0.0, le=1.0, description="GAE discount of later tokens' rewards (1: none, TRL's default)")
    lam: read_when(float, _critic, "training.advantage takes a critic's values (gae)") = Field(0.95, ge=0.0, le=1.0, description="GAE lambda (Schulman et al. 2016): 1 is the return minus the critic's value, 0 the one-step TD error; TRL's default 0.95")
    loss_agg: LOSS_AGGREGATION = Field("token_mean", description="how per-token losses become one number (seq_mean_token_sum_norm: Dr. GRPO)")
    ppo_epochs: int = Field(1, ge=1, le=64, description="passes over each rollout batch")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per pass (the rollout batch is split into this many)")
    old_logprobs: Literal["auto", "sampler", "current"] = Field("auto", description="behaviour logprobs of the importance ratio: 'sampler' (recorded while sampling), 'current' (the policy's own, detached: ratio 1, exact on-policy), 'auto' (current when each rollout batch gets one update, else sampler)")
    early_stop_repetition: float | None = Field(0.5, description="stop when a step's mean repetition ratio (the repetition reward term, logged at any weight) exceeds this (null: never)")
    collapse_stop: bool = Field(False, description="stop the run as failed when its completions collapse (empty, one identical text, or an entropy jump; defend turns it on)")
    collapse_empty_frac: read_when(float, _collapse, "training.collapse_stop is true") = Field(0.25, ge=0.0, le=1.0, description="collapse: the share of empty completions above which a step has collapsed")
    collapse_top_share: read_when(float, _collapse, "training.collapse_stop is true") = Field(0.9, ge=0.0, le=1.0, description="collapse: the share of a step's completions taken by one identical text above which it has collapsed")
    collapse_entropy_swing: read_when(float, _collapse, "training.collapse_stop is true") = Field(2.0, gt=0.0, description="collapse: the largest change of mean token entropy (nats) from one step to the next")


class RowSourceConfig(Section):
    """Where rows come from and which of them are kept (purplerl.data.sources)."""

    source: Annotated[str, AfterValidator(absolute_source)] = Field("builtin:redteam", description="'builtin:redteam', a .jsonl/.json/.parquet file, or 'hf:ORG/NAME'")
    split: str = Field("train", description="split to read (builtin and hf sources)")
    hf_config: read_when(str | None, lambda d: (d.source or "").startswith("hf:"), "data.source is hf:ORG/NAME") = Field(None, description="HF dataset config name")
    filters: dict[str, Any] = Field(default_factory=dict, description="keep rows whose fields equal these values, e.g. {is_safe: false}")
    limit: int | None = Field(None, ge=1, description="keep at most this many rows (after filtering)")


def _not_builtin(source: Any) -> bool:
    # a built-in set has its own fixed fields
    return not source.source.startswith("builtin:")


class PromptSourceConfig(RowSourceConfig):
    """Where prompts come from and which of them are kept (purplerl.data.sources.load_prompts)."""

    prompt_field: read_when(str, _not_builtin, "data.source is a file or hf:ORG/NAME") = Field("prompt", description="field holding the prompt text or chat messages")
    category_field: read_when(str | None, _not_builtin, "data.source is a file or hf:ORG/NAME") = Field(None, description="field holding the harm category (auto for known schemas)")

    @field_validator("prompt_field")
    @classmethod
    def _named(cls, field: str) -> str:
        if not field.strip():
            raise ValueError("must name a field")
        return field


class PromptFormatConfig(Section):
    """How a prompt becomes the policy's tokens; a checkpoint is prompted the way its run trained it."""

    template: Template = Field("chat", description="'chat' uses the tokenizer's chat template; 'base' plain text")
    system_prompt: str | None = Field(None, description="system message prepended to every prompt (null: model default)")
    max_prompt_tokens: int = Field(256, ge=8, description="prompts longer than this are cut from the left")


class EvalDataConfig(PromptFormatConfig, PromptSourceConfig):
    """Prompts of an evaluation: their source and, for targets that are not run checkpoints, their format."""


class SFTDataConfig(RowSourceConfig):
    """The conversations of a supervised run: their source and how they are rendered."""

    source: Annotated[str, AfterValidator(absolute_source)] = Field("builtin:redteam", description="a .jsonl/.json/.parquet file, a prepared dataset dir, or 'hf:ORG/NAME'")
    template: Template = Field("chat", description="'chat' uses the tokenizer's chat template; 'base' plain text")
    system_prompt: str | None = Field(None, description="system message prepended to every conversation (null: model default)")


class PreferenceDataConfig(PromptFormatConfig, RowSourceConfig):
    """Preference data (pairs, or KTO's labelled answers), and how prompts and answers become tokens (as the
    policy samples them): `purplerl prefs` and `purplerl reward-model`."""

    source: Annotated[str, AfterValidator(absolute_source)] | None = Field(None, description="preference data: a .jsonl/.json/.parquet file, a prepared dir or 'hf:ORG/NAME' (pairs: prompt + chosen + rejected as text or chat messages, HH-RLHF dialogues, UltraFeedback message lists; KTO rows: prompt + completion + label)")  # noqa: E501
    max_answer_tokens: int = Field(256, ge=1, description="answers longer than this (with their end-of-turn token) are cut at the end")  # noqa: E501
    skip_bad_rows: bool = Field(False, description="leave out rows that hold no usable example (counted, the first one named) instead of stopping at the first: public sets like HH-RLHF hold a few")  # noqa: E501


class DataConfig(EvalDataConfig):
    """Prompts of an RL recipe: source, format, and the order they are drawn in."""

    shuffle: bool = Field(True, description="shuffle prompts each epoch (seeded)")


def _hf(scorer: Any) -> bool:
    return scorer.model != "embedded"


def _served(scorer: Any) -> bool:
    return scorer.url is not None


class ClassifierConfig(Section):
    """Which scorer to load: shared by in-process scoring (ToxicityConfig) and the reward server."""

    model: str = Field("embedded", description="'embedded' (alt-profanity-check) or an HF sequence-classification id/path")
    label: read_when(str | int | None, _hf, "model is an HF classifier") = Field(None, description="HF classifier output scored: label name or index (required for HF models)")
    device: read_when(Literal["auto", "cpu", "cuda"], _hf, "model is an HF classifier") = Field("cpu", description="device of an HF classifier")
    batch_size: read_when(int, _hf, "model is an HF classifier") = Field(32, ge=1, description="texts per classifier forward pass")
    max_length: read_when(int, _hf, "model is an HF classifier") = Field(512, ge=8, description="classifier input truncation in tokens")


class ToxicityConfig(ClassifierConfig):
    url: str | None = Field(None, description="reward server URL (e.g. http://127.0.0.1:50050): score there, not in-process; API key from env PURPLERL_REWARD_API_KEY")
    timeout_s: read_when(float, _served, "url is set") = Field(30.0, gt=0.0, description="reward server: seconds to wait for one answer")
    retries: read_when(int, _served, "url is set") = Field(3, ge=0, le=20, description="reward server: retries after a connection error or HTTP 5xx, then the run stops")
    backoff_s: read_when(float, _served, "url is set") = Field(0.5, ge=0.0, description="reward server: wait before the first retry, doubled after each")
    server_model: read_when(str | None, _served, "url is set") = Field(None, description="metadata, not a setting: recorded from the server's /info at start; a resumed run refuses a server that now serves another model")
    server_label: read_when(str | None, _served, "url is set") = Field(None, description="metadata, not a setting: recorded from the server's /info at start, like server_model")

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

    model: str = Field("embedded", description="'embedded' (alt-profanity-check), an HF sequence-classification id/path, or a reward model's run dir or checkpoint (purplerl reward-model; its term's parameters: --serve.term reward_model)")
    # the server refuses a label for the embedded scorer itself, naming --label (purplerl.rewards.served)
    label: str | int | None = Field(None, description="HF classifier output scored: label name or index (required for HF models)")
    host: str = Field("127.0.0.1", description="address to listen on (a non-loopback address without an API key is warned about)")
    port: int = Field(50050, ge=1, le=65535, description="TCP port to listen on")
    api_key: SecretStr | None = Field(None, description="when set, /score and /info need the header 'Authorization: Bearer KEY'; set it by env PURPLERL_REWARD_API_KEY, since on the command line every user of the machine sees it (ps)")
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
    max_header_bytes: int = Field(16384, ge=1024, description="request line plus headers over this many bytes, however they arrive: HTTP 400")

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

    kl_beta: float = Field(0.1, ge=0.0, description="weight of KL(policy || base): subtracted from the reward, or a loss term (kl_in)")
    kl_estimator: KL_ESTIMATOR = Field("k1", description="per-token KL estimator (Schulman 2020)")
    kl_in: Literal["reward", "loss"] = Field("reward", description="apply the KL penalty in the reward or as a loss term")
    zscore: bool = Field(False, description="z-score normalize rewards over the batch before advantages")


ENGINE_KINDS = ("local", "vllm", "tinker")  # purplerl.engines.make_engine builds each
FAST_PATHS = ("merged_sampler", "cuda_graphs", "fused_lora")
FastPath = Literal["merged_sampler", "cuda_graphs", "fused_lora"]


def _kind(*kinds: str) -> tuple[Any, str]:
    return (lambda engine: engine.kind in kinds), "engine.kind is " + " or ".join(kinds)


def _engine_field(annotation: Any, *kinds: str) -> Any:
    return read_when(annotation, *_kind(*kinds))


class EngineConfig(Section):
    """Where and how sampling and training run (purplerl.engines). The fields of a kind exist only for it.
    `--engine vllm` is short for `--engine.kind vllm`, and a config file may say `engine: vllm`."""

    kind: Literal["local", "vllm", "tinker"] = Field("local", description="engine: 'local' (torch in this process, or `procs` processes), 'vllm' (vLLM samples, torch trains), 'tinker' (a Tinker-API service); each kind has its own fields")
    procs: _engine_field(int, "local") = Field(1, ge=1, le=1024, description="data-parallel processes on this machine, launched with torchrun (1: this process)")
    autocast_bf16: _engine_field(bool, "local", "vllm") = Field(False, description="run matmuls in bfloat16 under autocast, fp32 weights (fast on AMX/AVX512-BF16 CPUs and GPUs)")
    fast_paths: _engine_field(list[FastPath], "local", "vllm") = Field(default_factory=lambda: list(FAST_PATHS), description="same-maths fast paths that are on (leave one out to turn it off): merged_sampler (sample from a copy of the model with the LoRA update merged in: faster decoding, one extra copy of the weights), cuda_graphs (CUDA: each decoded token's forward replayed as one captured graph over a static KV cache), fused_lora (plain LoRA layers as one accumulating matmul); 'merged_sampler,fused_lora' works too")

    @field_validator("fast_paths", mode="before")
    @classmethod
    def _split_paths(cls, value: Any) -> Any:
        return comma_list(value)

    @field_validator("fast_paths")
    @classmethod
    def _paths_once(cls, paths: list[str]) -> list[str]:
        return once_each(paths, "fast path")

    def fast_path(self, name: str) -> bool:
        return name in self.fast_paths
    micro_batch_tokens: _engine_field(int, "local", "vllm") = Field(4096, ge=1, description="max padded tokens per forward/backward pass: length-sorted sequences fill each pass up to this (the memory knob)")
    tinker_url: _engine_field(str | None, "tinker") = Field(None, description="base URL of the Tinker-API service (null: the SDK's default, or TINKER_BASE_URL); the API key is read from TINKER_API_KEY only")
    tinker_retries: _engine_field(int, "tinker") = Field(3, ge=0, le=20, description="retries of one HTTP request before it fails")
    tinker_timeout_s: _engine_field(float, "tinker") = Field(600.0, gt=0, le=86400, description="seconds one call to the service (retries included) may take before the run stops with one line")
    tinker_loss_reduction: _engine_field(Literal["sum", "sequence_mean"], "tinker") = Field("sum", description="how the service reduces a datum's token losses: 'sum' (the Tinker API) or 'sequence_mean' (each datum divided by its weights' sum, gradients averaged over a step's datums: SkyRL's server)")
    vllm_kv_cache_gib: _engine_field(int, "vllm") = Field(1, ge=1, description="on CPU: GiB of memory for vLLM's KV cache (VLLM_CPU_KVCACHE_SPACE)")
    vllm_gpu_memory_utilization: _engine_field(float, "vllm") = Field(0.3, gt=0.0, lt=1.0, description="on CUDA: share of the GPU's memory vLLM takes (weights + KV cache); the trainer needs the rest")
    vllm_is_correction: _engine_field(bool, "vllm") = Field(True, description="weight each token's policy gradient by min(pi_trainer / pi_vllm, vllm_is_cap), truncated importance sampling, with the trainer's logprobs as the old policy (off: vLLM's logprobs are the sampling logprobs)")
    vllm_is_cap: _engine_field(float, "vllm") = Field(2.0, ge=1.0, description="truncation cap C of the importance-sampling weight")

    @model_validator(mode="before")
    @classmethod
    def _kind_alone(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value


class LoggingConfig(Section):
    progress: bool = Field(True, description="show a rich progress bar")
    print_samples: read_when(int, lambda log: log.progress, "logging.progress is true") = Field(0, ge=0, description="completions printed to the console per step")
    trackers: list[Literal["wandb", "tensorboard", "mlflow"]] = Field(default_factory=list, description="experiment trackers that get the metrics, samples and evaluations of the JSONL logs, each step once its checkpoint is saved: wandb (offline, run_dir/wandb), tensorboard (run_dir/tensorboard), mlflow (file store run_dir/mlruns); 'wandb,mlflow' works too; needs pip install 'purplerl[trackers]'")

    @field_validator("trackers", mode="before")
    @classmethod
    def _split_trackers(cls, value: Any) -> Any:
        return comma_list(value)

    @field_validator("trackers")
    @classmethod
    def _trackers_once(cls, trackers: list[str]) -> list[str]:
        return once_each(trackers, "tracker")


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


class RunSettings(Section):
    """The sections every training recipe shares; each recipe's settings class adds its own
    (purplerl.train.recipe)."""

    recipe: str = Field(description="metadata, not a setting: the recipe this config is for (each recipe's tree sets it)")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="where and how sampling and training run")
    model: ModelConfig = Field(default_factory=ModelConfig, description="policy model and adapter")
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="optimization")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="console output and experiment trackers")
    run: RunConfig = Field(default_factory=RunConfig, description="run directory and checkpoints")


class RLSettings(RunSettings):
    """The shared RL sections: prompts, rollout sampling, the policy-gradient training and the KL. The `reward`
    section is each RL recipe's own (its terms: purplerl.train.recipe.reward_section)."""

    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="rollout sampling")
    training: RLTrainingConfig = Field(default_factory=RLTrainingConfig, description="optimization and stop rules")
    data: DataConfig = Field(default_factory=DataConfig, description="prompt source")
    reward: RewardBase = Field(default_factory=RewardBase, description="reward composition")
