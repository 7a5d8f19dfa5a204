"""`purplerl verl export`: a directory that runs one of purplerl's RL recipes on a veRL 0.9 cluster.

    train.parquet, test.parquet    the prompts in veRL's schema (`purplerl data prepare`'s writer)
    purplerl_reward.py (+ .json)   the reward behind veRL's custom-reward hook (purplerl.verl.reward)
    overrides.txt                  Hydra overrides of verl.trainer.main_ppo, one per line (purplerl.verl.mapping)
    run_verl.sh                    runs main_ppo with them; extra arguments are appended as further overrides
    README.md                      what was exported, and every setting veRL cannot honour

A reward term that reads more than the response text (or its row's ground truth, which the parquet rows carry as
veRL's reward_model.ground_truth) is refused (purplerl.verl.reward.check_term): the defense's
`response_entropy` and the adaptive attack's `entropy_bonus` are the policy's token entropies, and veRL 0.9 computes
a response's reward from its decoded text, before the actor computes any entropy; the KL is veRL's own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from purplerl.config import RLSettings
from purplerl.data.prepare import write_splits
from purplerl.data.sources import load_prompts
from purplerl.errors import UserError
from purplerl.rewards.compose import term_use
from purplerl.rewards.named import TermSpec
from purplerl.rewards.registry import term_params
from purplerl.types import PromptRecord
from purplerl.verl.hydra import format_override, parse_override
from purplerl.verl.mapping import REWARD_MODULE, Translation, translate
from purplerl.verl.reward import SETTINGS_FILE, check_term, write_reward_module

VerlExportConfig = Any  # a recipe's settings plus the verl section (purplerl.cli)


@dataclass(frozen=True)
class Exported:
    out_dir: Path
    rows: dict[str, int]
    translation: Translation

    def describe(self) -> str:
        lines = [f"wrote {self.out_dir}: train.parquet ({self.rows['train']} rows), test.parquet "
                 f"({self.rows['test']} rows), {REWARD_MODULE}, {SETTINGS_FILE}, overrides.txt "
                 f"({len(self.translation.overrides)} overrides), run_verl.sh, README.md"]
        if self.translation.unmapped:
            lines.append(f"{len(self.translation.unmapped)} settings have no veRL equivalent (also in README.md):")
            lines += [f"  {u.line()}" for u in self.translation.unmapped]
        return "\n".join(lines)


def check_exportable(cfg: VerlExportConfig) -> None:
    """An RL recipe whose reward terms veRL's reward hook can compute (each a "text" term of the registry; the KL
    is veRL's own), and an export dir: else one UserError, before anything is read or written."""
    if not isinstance(cfg, RLSettings):
        raise UserError(f"verl export runs an RL recipe (one with rollouts and a reward); got recipe '{cfg.recipe}'")
    for entry in cfg.reward.terms.values():
        check_term(entry.fn)
    if cfg.verl.out is None:
        raise UserError("name the export dir: --out DIR")


def verl_row(record: PromptRecord, system_prompt: str | None, split: str, index: int) -> dict[str, Any]:
    """One prompt in veRL's schema (the columns `purplerl data prepare` writes)."""
    messages = [dict(m) for m in record.messages]
    if system_prompt is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    # a row's reference answer goes where veRL's rule-based scorers read it (the hook's ground_truth argument)
    truth = {"style": "rule", "ground_truth": record.ground_truth} if record.ground_truth is not None else \
        {"style": "model", "ground_truth": ""}
    return {"data_source": record.source, "prompt": messages, "ability": "safety", "reward_model": truth,
            # question: the text the reward's judges read as the prompt, as purplerl's loop gives them
            "extra_info": {"split": split, "index": index, "uid": record.uid, "category": record.category,
                           "question": record.messages[-1]["content"]}}


def reward_spec_from(terms: Mapping[str, float | TermSpec | Mapping[str, Any]], *, recipe: str | None = None,
                     ) -> dict[str, Any]:
    """The settings file of a reward: each term (weight 0: logged only) with its fn, its parameters as plain data
    and its hack_at; a term is given as `Reward` takes it (purplerl.rewards.compose.term_use). The `kl` term is
    left out: veRL applies the KL itself (algorithm.use_kl_in_reward / use_kl_loss). A term the reward hook cannot
    compute, an unknown name or bad parameters are one UserError, before anything is written."""
    rows = []
    for name, entry in terms.items():
        if name == "kl":
            continue
        spec = term_use(name, entry)
        check_term(spec.fn)
        values = term_params(spec.fn, spec.params or None)
        row = {"name": name, "fn": spec.fn, "weight": float(spec.weight) + 0.0,  # an old penalty of 0: 0.0, not -0.0
               "settings": {} if values is None else values.model_dump(mode="json")}
        rows.append(row if spec.hack_at is None else {**row, "hack_at": spec.hack_at})
    if not rows:
        raise UserError("the reward has no term for veRL's reward hook to compute (only kl, which veRL applies)")
    return {"terms": rows} if recipe is None else {"recipe": recipe, "terms": rows}


def reward_spec(cfg: VerlExportConfig) -> dict[str, Any]:
    """The recipe's reward without its KL term (veRL applies the KL: algorithm.use_kl_in_reward / use_kl_loss)."""
    return reward_spec_from(dict(cfg.reward.terms), recipe=cfg.recipe)


def _extra_overrides(extra: list[str]) -> dict[str, Any]:
    return dict(parse_override(line) for line in extra)


def _check_out_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} already exists and is not an empty dir: choose a new one")


def export_verl(cfg: VerlExportConfig, announce: Callable[[str], None] = lambda line: None) -> Exported:
    check_exportable(cfg)
    spec = reward_spec(cfg)  # a term veRL's reward hook cannot compute is refused before anything is written
    out = Path(str(cfg.verl.out)).expanduser()
    _check_out_dir(out)
    extra = _extra_overrides(cfg.verl.extra)
    splits = {"train": load_prompts(cfg.data), "test": load_prompts(cfg.data, split=cfg.verl.val_split)}
    translation = translate(cfg, len(splits["train"]))  # before writing: a refused setting leaves no files
    translation.overrides.update(extra)
    rows = {split: [verl_row(r, cfg.data.system_prompt, split, i) for i, r in enumerate(records)]
            for split, records in splits.items()}
    announce(f"writing {out}")
    write_splits(out, rows, "verl export")
    write_reward_module(out, REWARD_MODULE, spec)
    lines = [format_override(key, value) for key, value in translation.overrides.items()]
    (out / "overrides.txt").write_text("\n".join(lines) + "\n")
    (out / "run_verl.sh").write_text(RUN_SCRIPT)
    (out / "run_verl.sh").chmod(0o755)
    (out / "README.md").write_text(readme(cfg, translation, {s: len(r) for s, r in rows.items()}, spec))
    return Exported(out, {split: len(r) for split, r in rows.items()}, translation)


# The export dir is known only where the script runs. Every override naming it is a single-quoted Hydra value
# (purplerl.verl.hydra.quote), so the dir goes in as such a value's text: a quote written \', and '${' written
# '\${' so that OmegaConf does not read an interpolation. A backslash would need Hydra's run-before-a-quote rule,
# so a dir holding one is refused. The substitution is bash's own: sed breaks on a dir holding its delimiter or '&'.
RUN_SCRIPT = r"""#!/usr/bin/env bash
# Written by `purplerl verl export`: runs veRL's trainer with the overrides in overrides.txt (one per line;
# @EXPORT_DIR@ stands for this directory). Needs veRL 0.9 and purplerl installed on every node.
# Arguments are appended as further overrides, e.g. ./run_verl.sh trainer.total_training_steps=10
set -euo pipefail
shopt -u patsub_replacement 2>/dev/null || true  # bash 5.2 would read '&' in a replacement as the match
DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
if [[ "$DIR" == *\\* ]]; then
  echo "run_verl.sh: the export dir '$DIR' holds a backslash, which Hydra's quoted values cannot carry as is:" \
       "move the dir to a path without one" >&2
  exit 2
fi
VALUE="${DIR//\'/\\\'}"
VALUE="${VALUE//\$\{/\\\$\{}"
OVERRIDES=()
while IFS= read -r line || [[ -n "$line" ]]; do
  OVERRIDES+=("${line//@EXPORT_DIR@/$VALUE}")
done < "$DIR/overrides.txt"
exec python3 -m verl.trainer.main_ppo "${OVERRIDES[@]}" "$@"
"""


def readme(cfg: VerlExportConfig, translation: Translation, rows: dict[str, int], spec: dict[str, Any]) -> str:
    unmapped = "\n".join(f"- `{u.setting}` = `{u.value!r}`: {u.why}" for u in translation.unmapped) or "- none"
    return f"""# purplerl {cfg.recipe} on veRL

Written by `purplerl verl export` for veRL 0.9.1. Run `./run_verl.sh` on the Ray head node (purplerl and
veRL installed on every node; this directory on a filesystem every node reads).

- `train.parquet` ({rows['train']} prompts), `test.parquet` ({rows['test']} prompts, split
  `{cfg.verl.val_split}`): veRL's schema (prompt, data_source, ability, reward_model, extra_info).
- `{REWARD_MODULE}` + `{SETTINGS_FILE}`: the reward, through `reward.custom_reward_function`. It imports
  purplerl and scores each response: {_reward_formula(spec)}. The KL to the base model is veRL's (below).
  A reward server (`reward.terms.toxicity.params.url`) reads its API key from PURPLERL_REWARD_API_KEY on the
  reward workers.
- `overrides.txt`: {len(translation.overrides)} Hydra overrides of `verl.trainer.main_ppo`; `run_verl.sh` passes
  them with `@EXPORT_DIR@` replaced by this directory.

## Settings veRL cannot honour

{unmapped}

## The entropy defense

purplerl's defense (Token Buncher) rewards the negative mean per-token entropy of the policy's response.
veRL 0.9.1 computes a response's reward while sampling, in its reward loop, from the decoded text and the
token ids (`prompts`, `responses`, `attention_mask`); the rollout's log-probs (`rollout_log_probs`) join the
batch only afterwards, and the actor's entropies (`entropys`) are computed later still and dropped after
logging. No reward function or reward manager receives per-token entropies. (Only with a colocated reward
model, `reward.reward_model.enable`, is the reward computed on the whole batch after sampling, where a custom
reward manager could read `rollout_log_probs`; -log p of each sampled token is then a one-sample estimate
of the entropy, not the entropy Token Buncher rewards, and this export does not offer it.) So
`purplerl verl export` refuses `recipe: defend` (and the reward terms `response_entropy` and `entropy_bonus`,
the adaptive attack's) rather than export a different objective. Run the defense on purplerl's own engines.
"""


def _reward_formula(spec: dict[str, Any]) -> str:
    """'1 x toxicity - 0.3 x repetition - 0 x refusal' (the terms' unweighted scores are logged beside it)."""
    first, *rest = spec["terms"]
    text = f"{first['weight']:g} x {first['name']}"
    for term in rest:
        text += f" {'-' if term['weight'] < 0 else '+'} {abs(term['weight']):g} x {term['name']}"
    return text
