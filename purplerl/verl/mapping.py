"""A recipe's config as veRL 0.9 Hydra overrides of `verl.trainer.main_ppo`, and what has no veRL equivalent.

Every leaf setting of the config ends in one of three places: a veRL override (`overrides`), the export's
own files (the parquet rows, the reward settings), or `unmapped` with one line saying why veRL cannot
honour it. A setting that nothing here handles is still named (`NOT_TRANSLATED`), so a config field added
later is never dropped silently. Key names are veRL 0.9.1's (`verl/trainer/config/_generated_ppo_trainer.yaml`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from purplerl.config import RLSettings, Section
from purplerl.config.base import read_condition
from purplerl.errors import UserError

VerlExportConfig = Any  # a recipe's settings plus the verl section (purplerl.cli)

EXPORT_DIR = "@EXPORT_DIR@"  # replaced by run_verl.sh with the export dir's absolute path on the cluster
REWARD_MODULE = "purplerl_reward.py"
NOT_TRANSLATED = "not translated by the veRL export"
WHY_STOP = "veRL has no early stop on reward components: watch the logged reward terms"

ADVANTAGES = {"grpo": "grpo", "grpo_std": "grpo", "dr_grpo": "grpo", "rloo": "rloo",
              "reinforce_pp": "reinforce_plus_plus"}
LOSS_AGGREGATIONS = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean",
                     "seq_mean_token_sum_norm": "seq-mean-token-sum-norm"}
KL_ESTIMATORS = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}  # veRL's names of Schulman's estimators

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
MODEL = "actor_rollout_ref.model"

# Settings that the export itself carries out (parquet rows, reward settings) or that are the veRL run's own. Each
# term of reward.terms carries its parameters, which are written with the reward settings (see `_reward`).
WRITTEN_BY_EXPORT = (
    "recipe", "data.source", "data.split", "data.prompt_field", "data.category_field", "data.hf_config",
    "data.filters", "data.limit", "data.system_prompt", "reward.terms", "verl.",
)


@dataclass(frozen=True)
class Unmapped:
    setting: str  # dotted config path
    value: Any
    why: str

    def line(self) -> str:
        return f"{self.setting}={self.value!r}: {self.why}"


@dataclass
class Translation:
    overrides: dict[str, Any] = field(default_factory=dict)  # veRL key path -> value, in writing order
    unmapped: list[Unmapped] = field(default_factory=list)
    used: set[str] = field(default_factory=set)  # config settings translated into overrides

    def set(self, settings: str | tuple[str, ...], **overrides: Any) -> None:
        """Overrides (keys with '.' written as '__') that carry out `settings`."""
        self.used.update((settings,) if isinstance(settings, str) else settings)
        self.overrides.update({key.replace("__", "."): value for key, value in overrides.items()})

    def name(self, setting: str, value: Any, why: str) -> None:
        self.unmapped.append(Unmapped(setting, value, why))


def leaf_settings(config: BaseModel, prefix: str = "") -> dict[str, Any]:
    """{dotted path: value} of every leaf setting of a config that is read (a field its section's values make unread,
    such as the vLLM fields of a local engine, is no setting in force)."""
    out: dict[str, Any] = {}
    unread = config.unread_fields() if isinstance(config, Section) else set()
    for name in type(config).model_fields:
        if name in unread:
            continue
        value = getattr(config, name)
        if isinstance(value, BaseModel):
            out.update(leaf_settings(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def translate(cfg: VerlExportConfig, train_rows: int) -> Translation:
    """The overrides and the unmapped settings of `cfg`, whose prompts made `train_rows` training rows."""
    out = Translation()
    _model(cfg, out)
    _data(cfg, train_rows, out)
    _sampling(cfg, out)
    _optimization(cfg, out)
    _algorithm(cfg, out)
    _kl(cfg, out)
    _reward(cfg, out)
    _run(cfg, out)
    _engine_only(cfg, out)
    _recipe_own(cfg, out)
    named = {u.setting for u in out.unmapped}
    for setting, value in leaf_settings(cfg).items():
        done = setting in out.used or setting in named or setting.startswith(WRITTEN_BY_EXPORT)
        if not done:
            out.name(setting, value, NOT_TRANSLATED)
    return out


def _model(cfg: VerlExportConfig, out: Translation) -> None:
    m = cfg.model
    if m.name.startswith("embedded:"):
        raise UserError(f"model '{m.name}' is purplerl's embedded model, which a veRL cluster cannot load: "
                        "pass --model with an HF id or a model dir the cluster can read")
    out.set("model.name", **{f"{MODEL}__path": m.name})
    if m.finetune == "full":
        out.set(("model.finetune", "model.lora_rank", "model.lora_alpha", "model.lora_targets"),
                **{f"{MODEL}__lora_rank": 0})
    else:
        targets = m.lora_targets if m.lora_targets == "all-linear" else [t.strip() for t in m.lora_targets.split(",")]
        # veRL's HFModelConfig.lora_alpha is an int
        alpha = round(m.lora_alpha)
        out.set(("model.finetune", "model.lora_rank", "model.lora_targets"),
                **{f"{MODEL}__lora_rank": m.lora_rank, f"{MODEL}__lora_alpha": alpha,
                   f"{MODEL}__target_modules": targets})
        if alpha == m.lora_alpha:
            out.set("model.lora_alpha")
        else:
            out.name("model.lora_alpha", m.lora_alpha, f"veRL's lora_alpha is an integer: exported as {alpha}")
    if m.init_adapter is not None:
        out.set("model.init_adapter", **{f"{MODEL}__lora_adapter_path": m.init_adapter})
    out.used.add("model.init_adapter")
    if m.lora_dropout:
        out.name("model.lora_dropout", m.lora_dropout, "veRL's FSDP LoRA (actor_rollout_ref.model) has no dropout")
    if m.revision is not None:
        out.name("model.revision", m.revision, "veRL loads model.path as it is: download that revision to a dir "
                                               "and pass it as --model")
    if m.quantize != "none":
        out.name("model.quantize", m.quantize, "the export does not carry a bitsandbytes base: veRL's actor loads "
                                               "model.path unquantized")
    out.used.update(("model.lora_dropout", "model.revision", "model.quantize"))


def _data(cfg: VerlExportConfig, train_rows: int, out: Translation) -> None:
    t, d = cfg.training, cfg.data
    batches_per_epoch = train_rows // t.batch_size  # veRL's train dataloader drops the last partial batch
    if batches_per_epoch == 0:
        raise UserError(f"training.batch_size {t.batch_size} is more than the {train_rows} training prompts: "
                        "veRL would train on nothing (lower --batch_size or add prompts)")
    out.set(("training.batch_size", "training.steps"),
            data__train_batch_size=t.batch_size, trainer__total_training_steps=t.steps,
            trainer__total_epochs=math.ceil(t.steps / batches_per_epoch))
    out.set("data.max_prompt_tokens", data__max_prompt_length=d.max_prompt_tokens,
            data__truncation="left")  # purplerl cuts long prompts from the left too
    out.set("data.shuffle", data__shuffle=d.shuffle)
    out.set((), data__train_files=f"{EXPORT_DIR}/train.parquet", data__val_files=f"{EXPORT_DIR}/test.parquet",
            data__prompt_key="prompt", data__reward_fn_key="data_source")
    if d.template == "base":
        out.name("data.template", d.template, "veRL always renders prompts with the tokenizer's chat template")
    out.used.add("data.template")


def _sampling(cfg: VerlExportConfig, out: Translation) -> None:
    s = cfg.sampling
    out.set("sampling.group_size", **{f"{ROLLOUT}__n": s.group_size})
    out.set("sampling.max_new_tokens", data__max_response_length=s.max_new_tokens)
    out.set(("sampling.temperature", "sampling.top_p", "sampling.top_k"),
            **{f"{ROLLOUT}__temperature": s.temperature, f"{ROLLOUT}__top_p": s.top_p,
               f"{ROLLOUT}__top_k": s.top_k if s.top_k > 0 else -1})  # veRL's "no top-k" is -1


def _optimization(cfg: VerlExportConfig, out: Translation) -> None:
    t = cfg.training
    sequences = t.batch_size * cfg.sampling.group_size
    if t.batch_size % t.mini_batches:
        raise UserError(f"training.mini_batches {t.mini_batches} does not divide training.batch_size "
                        f"{t.batch_size}: veRL's ppo_mini_batch_size counts whole prompts")
    gpus = cfg.verl.nnodes * cfg.verl.gpus_per_node
    mini_sequences = sequences // t.mini_batches
    if mini_sequences % gpus:
        # veRL splits every mini-batch evenly over all GPUs (data parallel)
        raise UserError(f"a mini-batch of {mini_sequences} sequences (batch_size x group_size / mini_batches) does "
                        f"not split over {gpus} GPUs (nnodes x gpus_per_node): make it a multiple")
    per_gpu = mini_sequences // gpus
    # purplerl bounds a pass by padded tokens; veRL by sequences per GPU: as many of the longest sequences
    # (prompt + completion) as fit, and a divisor of the GPU's share of the mini-batch
    longest = cfg.data.max_prompt_tokens + cfg.sampling.max_new_tokens
    fit = max(1, cfg.engine.micro_batch_tokens // longest)
    micro = max(d for d in range(1, per_gpu + 1) if per_gpu % d == 0 and d <= fit)
    out.set(("training.mini_batches", "engine.micro_batch_tokens"),
            **{f"{ACTOR}__ppo_mini_batch_size": t.batch_size // t.mini_batches,
               f"{ACTOR}__ppo_micro_batch_size_per_gpu": micro,
               f"{ROLLOUT}__log_prob_micro_batch_size_per_gpu": micro,
               "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": micro})
    out.set("training.ppo_epochs", **{f"{ACTOR}__ppo_epochs": t.ppo_epochs})
    o = t.optimizer
    out.set(("training.lr", "training.optimizer.weight_decay", "training.optimizer.betas"),
            **{f"{ACTOR}__optim__lr": t.lr, f"{ACTOR}__optim__weight_decay": o.weight_decay,
               f"{ACTOR}__optim__betas": list(o.betas)})
    if o.eps != 1e-8:
        out.name("training.optimizer.eps", o.eps, "veRL's FSDP optimizer config has no epsilon (torch's AdamW "
                                                  "default 1e-08 applies)")
    out.used.add("training.optimizer.eps")
    if o.name != "adamw":
        out.name("training.optimizer.name", o.name, "veRL's FSDP actor runs torch's AdamW")
    out.used.add("training.optimizer.name")
    if t.max_grad_norm > 0:
        out.set("training.max_grad_norm", **{f"{ACTOR}__optim__clip_grad": t.max_grad_norm})
    else:
        out.name("training.max_grad_norm", t.max_grad_norm, "veRL always clips gradients (optim.clip_grad keeps "
                                                            "its default 1.0)")
    out.set("training.seed", data__seed=t.seed, **{f"{ROLLOUT}__seed": t.seed})


def _algorithm(cfg: VerlExportConfig, out: Translation) -> None:
    t = cfg.training
    if t.advantage not in ADVANTAGES:
        raise UserError(f"advantage estimator '{t.advantage}' has no veRL counterpart here "
                        f"(exported: {', '.join(ADVANTAGES)})")
    # Dr. GRPO is GRPO without the std division (its other half is the seq_mean_token_sum_norm aggregation)
    scale = t.advantage == "grpo_std"
    out.set("training.advantage",
            algorithm__adv_estimator=ADVANTAGES[t.advantage], algorithm__norm_adv_by_std_in_grpo=scale)
    out.set("training.loss_agg", **{f"{ACTOR}__loss_agg_mode": LOSS_AGGREGATIONS[t.loss_agg]})
    out.set(("training.clip_low", "training.clip_high"),
            **{f"{ACTOR}__clip_ratio_low": t.clip_low, f"{ACTOR}__clip_ratio_high": t.clip_high})
    on_policy = t.ppo_epochs == 1 and t.mini_batches == 1
    if t.loss == "ppo_clip" or on_policy:
        # veRL's 'vanilla' loss is PPO's clipped objective; with one update per rollout batch the ratio is 1 and
        # the clip never acts, so it is then exactly purplerl's importance_sampling loss too
        out.set("training.loss", **{f"{ACTOR}__policy_loss__loss_mode": "vanilla"})
    else:
        out.name("training.loss", t.loss, "veRL has no unclipped importance-sampling loss: with several updates per "
                                          "rollout batch its 'vanilla' loss clips the ratio (clip_low/clip_high)")
    if t.old_logprobs == "sampler":
        out.set("training.old_logprobs", algorithm__rollout_correction__bypass_mode=True)
    else:
        out.set("training.old_logprobs")  # veRL recomputes the behaviour logprobs with the actor (ratio 1 on-policy)


def _kl(cfg: VerlExportConfig, out: Translation) -> None:
    r = cfg.reward
    settings = ("reward.kl_beta", "reward.kl_estimator", "reward.kl_in")
    if r.kl_beta == 0:
        out.set(settings, algorithm__use_kl_in_reward=False, **{f"{ACTOR}__use_kl_loss": False})
    elif r.kl_in == "loss":
        out.set(settings, algorithm__use_kl_in_reward=False, **{
            f"{ACTOR}__use_kl_loss": True, f"{ACTOR}__kl_loss_coef": r.kl_beta,
            f"{ACTOR}__kl_loss_type": KL_ESTIMATORS[r.kl_estimator]})
    else:
        out.set(settings, algorithm__use_kl_in_reward=True, algorithm__kl_penalty=KL_ESTIMATORS[r.kl_estimator],
                algorithm__kl_ctrl__type="fixed", algorithm__kl_ctrl__kl_coef=r.kl_beta,
                **{f"{ACTOR}__use_kl_loss": False})
        if cfg.training.advantage != "reinforce_pp":
            out.name("reward.kl_in", r.kl_in, "purplerl subtracts kl_beta x the MEAN per-token KL of a response; "
                                              "veRL's use_kl_in_reward subtracts kl_coef x every token's KL, which "
                                              "outcome estimators sum over the response (a penalty ~length times "
                                              "stronger)")
    if r.zscore:
        out.name("reward.zscore", r.zscore, "veRL scores each response alone: no batch z-score of the reward")
    out.used.add("reward.zscore")


def _reward(cfg: VerlExportConfig, out: Translation) -> None:
    """The reward's terms and their parameters are written into the reward settings (purplerl.verl.export); a term
    veRL's reward hook cannot compute is refused there."""
    out.used.add("reward.terms")  # each term with its own parameters


def _run(cfg: VerlExportConfig, out: Translation) -> None:
    v, run = cfg.verl, cfg.run
    out.set(("run.name", "run.output_dir"), trainer__project_name=v.project,
            trainer__experiment_name=run.name or f"{cfg.recipe}_verl",
            trainer__default_local_dir=f"{run.output_dir}/{run.name or cfg.recipe + '_verl'}")
    out.set("run.save_every", trainer__save_freq=run.save_every)
    out.set("run.keep_last", trainer__max_actor_ckpt_to_keep=run.keep_last)
    # veRL's own trackers take the same names (its trainer.logger backends)
    out.set("logging.trackers", trainer__logger=["console", *cfg.logging.trackers])
    out.set((), trainer__nnodes=v.nnodes, trainer__n_gpus_per_node=v.gpus_per_node,
            **{f"{ROLLOUT}__name": v.rollout, f"{ROLLOUT}__tensor_model_parallel_size": v.tensor_parallel,
               f"{ROLLOUT}__gpu_memory_utilization": v.gpu_memory_utilization})
    out.set((), **{"reward__custom_reward_function__path": f"{EXPORT_DIR}/{REWARD_MODULE}",
                   "reward__custom_reward_function__name": "compute_score"})


def _engine_only(cfg: VerlExportConfig, out: Translation) -> None:
    """Settings of purplerl's own loop and engines, which veRL replaces with its own: named where they would
    change what the run does (an active early stop) or differ from their defaults."""
    t = cfg.training
    why_engine = "purplerl engine knob; veRL's FSDP workers and rollout engine decide this"
    unread = cfg.engine.unread_fields()  # e.g. the vLLM fields of a local engine: they hold their defaults
    engine = [f"engine.{name}" for name in type(cfg.engine).model_fields if name not in unread]
    # engine.micro_batch_tokens is translated (_optimization); the rest are purplerl's own
    for setting in ("model.dtype", "model.device", *(s for s in engine if s not in out.used)):
        section, _, name = setting.partition(".")
        part = getattr(cfg, section)
        if getattr(part, name) != type(part).model_fields[name].get_default(call_default_factory=True):
            out.name(setting, getattr(part, name), why_engine)
        out.used.add(setting)
    for name in type(t).model_fields:
        if name.startswith("early_stop_") and getattr(t, name) is not None:
            out.name(f"training.{name}", getattr(t, name), WHY_STOP)
    if t.collapse_stop:
        out.name("training.collapse_stop", t.collapse_stop, WHY_STOP)
    out.used.update(f"training.{name}" for name in type(t).model_fields
                    if name.startswith(("early_stop_", "collapse_")))
    out.used.add("logging.progress")  # purplerl's console; veRL has trainer.logger


def _recipe_own(cfg: VerlExportConfig, out: Translation) -> None:
    """The recipe's own sections (those every RL recipe's settings lack, e.g. its own stop rule or extra steps) are
    hooks of purplerl's loop, which veRL's trainer does not run. Each setting of them that asks something of the
    run is named: an early stop with a threshold, a switch that is on, any other value that is not null. Fields read
    only because of another (a switch's parameters) go with that one and are not named again."""
    for section in type(cfg).model_fields:
        if section in RLSettings.model_fields or section == "verl":
            continue
        part = getattr(cfg, section)
        for setting, value in leaf_settings(part, f"{section}.").items():
            out.used.add(setting)
            name = setting.removeprefix(f"{section}.")
            info = type(part).model_fields.get(name)
            if value is None or value is False or info is None or read_condition(info.metadata) is not None:
                continue
            out.name(setting, value, WHY_STOP if name.startswith("early_stop_") else
                     "a step of the recipe's own in purplerl's loop; veRL's trainer has no such step")
