"""Reading settings written by an older purplerl: fields that moved to another section, and the old flat reward
weights. The same step runs on a run's saved config.yaml (so older runs still resume) and on a user's config file
and command line (so the old names keep working); only a saved config may also drop what its recipe never read.

Each recipe adds its own part (purplerl.train.recipe.Recipe.migrate), e.g. attack's reward weights becoming
`reward.terms`.
"""

from __future__ import annotations

import json
from typing import Any

# old dotted name -> new dotted name, for every recipe
MOVED = {
    **{f"model.{name}": f"engine.{name}"
       for name in ("threads", "autocast_bf16", "merged_sampler", "cuda_graphs", "fused_lora")},
    "training.adam_beta1": "training.optimizer.betas.0",
    "training.adam_beta2": "training.optimizer.betas.1",
    "training.adam_betas": "training.optimizer.betas",
    "training.adam_eps": "training.optimizer.eps",
    "training.weight_decay": "training.optimizer.weight_decay",
    "training.micro_batch_size": "engine.micro_batch_size",
    "training.micro_batch_tokens": "engine.micro_batch_tokens",
}
# the fields of the noiser, which only defend reads (its own section now), with the defaults they had
NOISER_DEFAULTS = {"noiser": False, "noiser_warmup": 25, "noiser_every": 2, "noiser_epsilon": 0.1,
                   "noiser_noise_weight": "reference"}
# the RL fields an older SFT run's config.yaml held, which SFT never read
RL_TRAINING_FIELDS = ("loss", "clip_low", "clip_high", "advantage", "advantage_std", "loss_agg", "ppo_epochs",
                      "mini_batches", "old_logprobs", "early_stop_toxicity", "early_stop_repetition", "collapse_stop",
                      "collapse_empty_frac", "collapse_top_share", "collapse_entropy_swing", *NOISER_DEFAULTS)
# settings that were removed, and what does their job now: a saved config.yaml drops them (they changed speed,
# never the maths), a config file or command line that sets one is refused with the hint
REMOVED = {"training.advantage_std": "the estimator grpo_std is GRPO divided by the group std "
                                     "(--training.advantage grpo_std)",
           "engine.threads": "torch's CPU threads come from the environment variable OMP_NUM_THREADS",
           "engine.micro_batch_size": "engine.micro_batch_tokens bounds each forward/backward pass"}
_ABSENT = object()


def copied(data: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(data))


def get_path(data: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """The value at a dotted path through nested dicts, or `default` where the path leads to none."""
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def pop_path(data: dict[str, Any], dotted: str) -> Any:
    """Remove and return the value at a dotted path (_ABSENT when there is none)."""
    *sections, leaf = dotted.split(".")
    node: Any = data
    for part in sections:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or leaf not in node:
        return _ABSENT
    return node.pop(leaf)


def set_path(data: dict[str, Any], dotted: str, value: Any, overwrite: bool = False) -> None:
    """Set a dotted path, making its sections; a value already there wins unless `overwrite`."""
    *sections, leaf = dotted.split(".")
    node = data
    for part in sections:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {} if child is None else child
            if not isinstance(child, dict):
                return  # not a section: validation names the field
        node = child
    if overwrite or leaf not in node:
        node[leaf] = value


def move(data: dict[str, Any], old: str, new: str, convert: Any = None) -> None:
    value = pop_path(data, old)
    if value is not _ABSENT:
        set_path(data, new, convert(value) if convert is not None else value)


def migrate_shared(data: dict[str, Any], saved: bool = False) -> dict[str, Any]:
    """Every recipe's moved fields (see MOVED), on a copy. `engine: vllm` becomes a section first. A removed
    setting (REMOVED) is dropped from a saved config, and from any config where it holds its old default."""
    data = copied(data)
    if isinstance(data.get("engine"), str):
        data["engine"] = {"kind": data["engine"]}
    if isinstance(get_path(data, "training.optimizer"), str):  # its shorthand, so that moved fields join it
        data["training"]["optimizer"] = {"name": data["training"]["optimizer"]}
    for old, new in MOVED.items():
        move(data, old, new)
    for dotted, unread in (("engine.threads", 0), ("engine.micro_batch_size", 64)):
        if saved:
            pop_path(data, dotted)
        else:
            drop_if(data, dotted, unread)
    _fold(data, "engine", ("merged_sampler", "cuda_graphs", "fused_lora"), "fast_paths")
    _fold_autocast(data)
    _fold_betas(data)
    _fold_advantage_std(data)
    _fold_print_samples(data)
    return data


def _fold(data: dict[str, Any], section: str, names: tuple[str, ...], into: str) -> None:
    """Old on/off fields (engine.merged_sampler: false) as the list of those on (engine.fast_paths)."""
    node = data.get(section)
    if not isinstance(node, dict) or not any(name in node for name in names):
        return
    on = node.get(into, list(names))
    for name in names:
        flag = node.pop(name, _ABSENT)
        if flag is False and isinstance(on, list):
            on = [n for n in on if n != name]
    node[into] = on


def _fold_autocast(data: dict[str, Any]) -> None:
    """engine.autocast_bf16: true (float32 weights, bfloat16 matmuls) as model.dtype autocast_bf16; bfloat16 weights
    never autocast, so there the flag meant nothing."""
    flag = pop_path(data, "engine.autocast_bf16")
    if flag is True and get_path(data, "model.dtype", "auto") in ("auto", "float32"):
        set_path(data, "model.dtype", "autocast_bf16", overwrite=True)
    elif flag is not _ABSENT and not isinstance(flag, bool):
        set_path(data, "engine.autocast_bf16", flag)  # validation names the mistyped, now unknown, field


def _fold_advantage_std(data: dict[str, Any]) -> None:
    """training.advantage_std: true with GRPO as the estimator grpo_std (GRPO divided by the group std); false is
    plain GRPO. With another estimator, which never divided, the flag stays for validation to refuse."""
    flag = pop_path(data, "training.advantage_std")
    if flag is True and get_path(data, "training.advantage", "grpo") in ("grpo", "grpo_std"):
        set_path(data, "training.advantage", "grpo_std", overwrite=True)
    elif flag is not _ABSENT and flag is not False:
        set_path(data, "training.advantage_std", flag)


def _fold_print_samples(data: dict[str, Any]) -> None:
    """logging.print_samples N (with the progress bar on) as logging.progress N; 0 prints none: the bar alone."""
    count = pop_path(data, "logging.print_samples")
    if isinstance(count, int) and not isinstance(count, bool) and count > 0 and \
            get_path(data, "logging.progress", True) is not False:
        set_path(data, "logging.progress", count, overwrite=True)
    elif count is not _ABSENT and count != 0:
        set_path(data, "logging.print_samples", count)  # validation names the mistyped, now unknown, field


def _fold_betas(data: dict[str, Any]) -> None:
    """training.adam_beta1 / adam_beta2 (moved to optimizer.betas.0 / .1 above) as the pair."""
    betas = get_path(data, "training.optimizer.betas")
    if isinstance(betas, dict):
        data["training"]["optimizer"]["betas"] = [betas.get("0", 0.9), betas.get("1", 0.999)]


def migrate_reward_weights(data: dict[str, Any], defaults: dict[str, float]) -> dict[str, Any]:
    """The attack's old flat reward weights as `reward.terms` (the same reward):
    toxicity_weight w -> toxicity w; repetition_penalty p -> repetition -p; refusal_penalty p -> refusal -p;
    entropy_bonus_cap c -> entropy_bonus 1 with cap c; repetition_ngram n -> repetition.ngram n. The weights join
    the terms already given, else the recipe's `defaults`."""
    reward = data.get("reward")
    if not isinstance(reward, dict):
        return data
    terms = reward.get("terms") if isinstance(reward.get("terms"), dict) else None
    weights: dict[str, Any] = {}
    for old, term, sign in (("toxicity_weight", "toxicity", 1.0), ("repetition_penalty", "repetition", -1.0),
                            ("refusal_penalty", "refusal", -1.0)):
        value = reward.pop(old, _ABSENT)
        if value is not _ABSENT:
            # + 0.0: a penalty of 0 is the weight 0.0, not -0.0
            weights[term] = sign * value + 0.0 if isinstance(value, int | float) and not isinstance(value, bool) \
                else value
    cap = reward.pop("entropy_bonus_cap", _ABSENT)
    if cap is not _ABSENT and cap is not None:
        weights["entropy_bonus"] = 1.0
        set_path(data, "reward.entropy_bonus.cap", cap)
    ngram = reward.pop("repetition_ngram", _ABSENT)
    if ngram is not _ABSENT:
        set_path(data, "reward.repetition.ngram", ngram)
    if weights:
        terms = dict(terms if terms is not None else defaults)
        for term, weight in weights.items():
            # a term written out ({fn, weight, params}) keeps its parameters
            terms[term] = {**terms[term], "weight": weight} if isinstance(terms.get(term), dict) else weight
        reward["terms"] = terms
    return data


def drop_if(data: dict[str, Any], dotted: str, unread: Any) -> None:
    """Drop a field a recipe never read, when it holds `unread` (its old default): a different value stays, and
    validation refuses it as unknown."""
    value = pop_path(data, dotted)
    if value is not _ABSENT and value != unread:
        set_path(data, dotted, value)
