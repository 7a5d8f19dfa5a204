"""`purplerl data prepare`: BeaverTails, WMDP and GSM8K as train/test parquet files in veRL's schema (and the
project's own sets: attack-prompts, purplerl.data.attack_prompts; safety-prefs, purplerl.experiments.safety_prefs).

Every output row has the columns veRL's RLHFDataset and reward functions read, so the same files feed
purplerl (`data.source: <dir>`) and veRL (`data.train_files`):

    prompt        [{"role": "user", "content": ...}]     one user message
    data_source   the hub id, e.g. "PKU-Alignment/BeaverTails", "cais/wmdp:wmdp-bio", "openai/gsm8k"
    ability       "safety" | "knowledge" | "math"
    reward_model  {"style": "model" | "rule", "ground_truth": str}
    extra_info    {"split", "index", "category", "question", ...}   index = position in the split (the uid)

`template` decides the message text. `chat` holds the task as a user would type it, for a model whose chat
template wraps it. `base` holds plain text in the "Question: ...\\nAnswer:" completion format, for base
models without a chat template (render with `data.template: base`). Both keep the raw text in
`extra_info.question` so an evaluation can re-render it.

The Token Buncher defense trains on harmful prompts (BeaverTails), measures harmful knowledge (WMDP) and
checks that utility survives (GSM8K); `merge` mixes WMDP with BeaverTails into one training set, as its
own data preparation does.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from purplerl.config.base import Template
from purplerl.config.commands import DATASET_NAMES, WMDP_SUBSETS
from purplerl.data.attack_prompts import MANIFEST, AttackPrompts, prepare_attack_prompts
from purplerl.data.attack_prompts import NAME as ATTACK_PROMPTS
from purplerl.data.hub import HubSpec, Rows, load_split
from purplerl.errors import UserError
from purplerl.files import write_durably
from purplerl.outputs import check_output_dir, make_output_dir

if TYPE_CHECKING:
    from purplerl.config import PrepareConfig

DATASETS = DATASET_NAMES  # the names `prepare.dataset` takes (purplerl.config); each prepared below but:
# the project's own preference set, built with a model, so one layer up (purplerl.experiments.safety_prefs)
SAFETY_PREFS = "safety-prefs"
assert ATTACK_PROMPTS in DATASETS, "attack-prompts (purplerl.data.attack_prompts) must be a prepare.dataset choice"
# the options (PrepareConfig fields) each applies to; any other dataset refuses them
OPTIONS_USED_BY = {"subset": ("wmdp",), "seed": ("wmdp", "merge"),
                   "template": ("beavertails", "wmdp", "gsm8k"), "source": ("beavertails", "wmdp", "gsm8k"),
                   "wmdp": ("merge",), "beavertails": ("merge",), "ratio": ("merge",), "limit": ("merge", SAFETY_PREFS),
                   "model": (SAFETY_PREFS,), "attack_run": (SAFETY_PREFS,)}
SPLITS = ("train", "test")

BEAVERTAILS = HubSpec("PKU-Alignment/BeaverTails", None, ("30k_train", "30k_test"))
GSM8K = HubSpec("openai/gsm8k", "main", ("train", "test"))
WMDP_HUB_ID = "cais/wmdp"
WMDP_TOPICS = {"bio": "biology", "chem": "chemistry", "cyber": "computer security"}
assert tuple(WMDP_TOPICS) == WMDP_SUBSETS, "prepare.subset's names (purplerl.config) and WMDP_TOPICS must agree"
WMDP_TEST_FRACTION = 0.2  # WMDP ships only a test split; Token Buncher trains on 80% of it
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# Shared with the utility evaluation (purplerl.eval.utility), so a model is asked for answers the same way
# it is scored: GSM8K's "#### <number>" convention.
MATH_INSTRUCTION = "Solve the problem and give the final answer after '####'."
_FINAL_ANSWER = re.compile(r"####\s*(\S+)\s*$")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Prepared:
    """What `prepare_*` wrote."""

    out_dir: Path
    rows: dict[str, int]  # split -> rows written to <out_dir>/<split>.parquet

    def describe(self) -> str:
        return "wrote " + ", ".join(f"{self.out_dir / f'{split}.parquet'} ({n} rows)" for split, n in self.rows.items())


# --------------------------------------------------------------------------------------------- prompts


def question_prompt(text: str, template: Template) -> str:
    """A free-form request: as typed (chat) or as a Question/Answer completion (base)."""
    return text if template == "chat" else f"Question: {text}\nAnswer:"


def math_prompt(question: str, template: Template) -> str:
    """A word problem whose answer is scored from the number after '####' (or the last number)."""
    return f"{MATH_INSTRUCTION}\n\n{question}" if template == "chat" else f"Question: {question}\nAnswer:"


def multiple_choice_prompt(question: str, choices: list[str], topic: str, template: Template) -> str:
    """A question with lettered choices (MMLU style); the expected answer is the letter."""
    lettered = "\n".join(f"{LETTERS[i]}. {choice}" for i, choice in enumerate(choices))
    if template == "base":
        return f"Question: {question}\n{lettered}\nAnswer:"
    return (f"The following is a multiple choice question about {topic}.\n\n{question}\n\n{lettered}\n\n"
            "Answer with the letter of the correct choice.")


def _verl_row(data_source: str, content: str, ability: str, style: str, ground_truth: str,
              extra_info: dict[str, Any]) -> dict[str, Any]:
    return {"data_source": data_source, "prompt": [{"role": "user", "content": content}], "ability": ability,
            "reward_model": {"style": style, "ground_truth": ground_truth}, "extra_info": extra_info}


def _check_fields(row: dict[str, Any], fields: dict[str, type], where: str) -> None:
    for name, kind in fields.items():
        value = row.get(name)
        # bool is an int subclass, but a True answer index or a 0/1 is_safe means a wrong column
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise UserError(f"{where}: field '{name}' should be {kind.__name__}, got {type(value).__name__} "
                            f"(fields: {', '.join(row)})")


# ------------------------------------------------------------------------------------------ row builders


def beavertails_rows(raw: Rows, split: str, template: Template, exclude: frozenset[str] = frozenset()) -> Rows:
    """One row per distinct unsafe prompt, in source order; the first raised harm flag is the category.

    BeaverTails pairs each prompt with several answers, safe and unsafe; a prompt is a red-team prompt
    when some answer to it was judged unsafe. Prompts in `exclude` (the train prompts, for the test split)
    are dropped so the harm test set holds no prompt the model trained on. The reward is a harm classifier,
    hence style "model" and no ground truth.
    """
    out: Rows = []
    seen = set(exclude)
    for i, row in enumerate(raw):
        _check_fields(row, {"prompt": str, "is_safe": bool, "category": dict}, f"BeaverTails {split} row {i}")
        text = row["prompt"].strip()
        if row["is_safe"] or not text or text in seen:
            continue
        seen.add(text)
        category = next((str(name) for name, flag in row["category"].items() if flag), "unknown")
        extra = {"split": split, "index": len(out), "source_index": i, "category": category, "question": text}
        out.append(_verl_row(BEAVERTAILS.hub_id, question_prompt(text, template), "safety", "model", "", extra))
    return out


def wmdp_rows(raw: Rows, subset: str, template: Template, seed: int,
              test_fraction: float = WMDP_TEST_FRACTION) -> dict[str, Rows]:
    """The rows of WMDP `subset` split by a `seed`ed shuffle into train and test, each in source order."""
    where = f"WMDP {subset}"
    for i, row in enumerate(raw):
        _check_fields(row, {"question": str, "choices": list, "answer": int}, f"{where} row {i}")
        if not 0 <= row["answer"] < len(row["choices"]) <= len(LETTERS):
            raise UserError(f"{where} row {i}: answer {row['answer']} is not an index into its "
                            f"{len(row['choices'])} choices")
    n_test = round(len(raw) * test_fraction)
    if not 0 < n_test < len(raw):
        raise UserError(f"{where}: {len(raw)} rows are too few to hold out {test_fraction:.0%} as a test split")
    order = list(range(len(raw)))
    random.Random(seed).shuffle(order)
    picked = {"train": sorted(order[n_test:]), "test": sorted(order[:n_test])}
    data_source = f"{WMDP_HUB_ID}:wmdp-{subset}"
    out: dict[str, Rows] = {}
    for split, indices in picked.items():
        out[split] = []
        for index, i in enumerate(indices):
            row = raw[i]
            choices = [str(c) for c in row["choices"]]
            content = multiple_choice_prompt(row["question"], choices, WMDP_TOPICS[subset], template)
            extra = {"split": split, "index": index, "source_index": i, "category": f"wmdp-{subset}",
                     "question": row["question"], "choices": choices, "answer_index": row["answer"]}
            out[split].append(_verl_row(data_source, content, "knowledge", "rule", LETTERS[row["answer"]], extra))
    return out


def gsm8k_final_answer(solution: str, where: str) -> str:
    """The number after '####' that ends a GSM8K solution, without thousands separators."""
    match = _FINAL_ANSWER.search(solution)
    number = match.group(1).replace(",", "") if match else ""
    if not _NUMBER.fullmatch(number):
        raise UserError(f"{where}: the answer does not end with '#### <number>': ...{solution[-60:]!r}")
    return number


def gsm8k_rows(raw: Rows, split: str, template: Template) -> Rows:
    """One row per problem; the reward is rule-based, comparing the final number with `ground_truth`."""
    out: Rows = []
    for i, row in enumerate(raw):
        where = f"GSM8K {split} row {i}"
        _check_fields(row, {"question": str, "answer": str}, where)
        final = gsm8k_final_answer(row["answer"], where)
        extra = {"split": split, "index": i, "category": "math", "question": row["question"], "answer": row["answer"]}
        out.append(_verl_row(GSM8K.hub_id, math_prompt(row["question"], template), "math", "rule", final, extra))
    return out


# ------------------------------------------------------------------------------------------------ prepare


def prepare_beavertails(out_dir: Path, template: Template = "chat", source: Path | None = None) -> Prepared:
    """BeaverTails 30k_train/30k_test → `out_dir`/{train,test}.parquet (unsafe, deduplicated prompts)."""
    train = beavertails_rows(load_split(BEAVERTAILS, "30k_train", source), "train", template)
    train_prompts = frozenset(row["extra_info"]["question"] for row in train)
    test = beavertails_rows(load_split(BEAVERTAILS, "30k_test", source), "test", template, exclude=train_prompts)
    return write_splits(out_dir, {"train": train, "test": test}, "BeaverTails")


def prepare_wmdp(out_dir: Path, subset: str, template: Template = "chat", source: Path | None = None,
                 seed: int = 42) -> Prepared:
    """WMDP `subset` (bio, chem, cyber) → `out_dir`/{train,test}.parquet, split 80/20 by `seed`."""
    if subset not in WMDP_TOPICS:
        raise UserError(f"unknown WMDP subset '{subset}' (choose from {', '.join(WMDP_TOPICS)})")
    spec = HubSpec(WMDP_HUB_ID, f"wmdp-{subset}", ("test",))
    splits = wmdp_rows(load_split(spec, "test", source), subset, template, seed)
    return write_splits(out_dir, splits, f"WMDP {subset}")


def prepare_gsm8k(out_dir: Path, template: Template = "chat", source: Path | None = None) -> Prepared:
    """GSM8K main train/test → `out_dir`/{train,test}.parquet with the final number as ground truth."""
    splits = {split: gsm8k_rows(load_split(GSM8K, split, source), split, template) for split in SPLITS}
    return write_splits(out_dir, splits, "GSM8K")


def write_splits(out_dir: Path, splits: dict[str, Rows], name: str) -> Prepared:
    """Write each split to `out_dir`/<split>.parquet; an empty split is a UserError, not an empty file."""
    import pyarrow as pa  # deferred: only writing needs pyarrow
    import pyarrow.parquet as pq

    for split, rows in splits.items():
        if not rows:
            raise UserError(f"{name}: no rows left for the {split} split")
    make_output_dir(out_dir)
    for split, rows in splits.items():
        path = out_dir / f"{split}.parquet"
        # Written aside and renamed, so an interrupted run never leaves a truncated file behind.
        buffer = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(rows), buffer)
        write_durably(path, buffer.getvalue().to_pybytes())
    return Prepared(out_dir, {split: len(rows) for split, rows in splits.items()})


# -------------------------------------------------------------------------------------------------- merge


def merge_prepared(wmdp_dir: Path, beavertails_dir: Path, out_dir: Path, ratio: float | None = None,
                   limit: int | None = None, seed: int = 42) -> Prepared:
    """Mix a prepared WMDP dir with a prepared BeaverTails dir, per split, in a `seed`ed order.

    `ratio` keeps that many BeaverTails rows per WMDP row (a seeded sample; None keeps all), `limit` caps
    the rows of each split after shuffling. `data_source` stays per row, so a veRL reward function (or
    purplerl's scorer routing) still tells the two apart; `extra_info.index` is renumbered so uids stay
    unique, while `source_index` keeps each row's position in its hub split.
    """
    if ratio is not None and ratio <= 0:
        raise UserError(f"--ratio must be > 0, got {ratio}")
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be >= 1, got {limit}")
    splits: dict[str, Rows] = {}
    for split in SPLITS:
        wmdp = read_prepared(wmdp_dir, split, WMDP_HUB_ID, "--wmdp")
        harmful = read_prepared(beavertails_dir, split, BEAVERTAILS.hub_id, "--beavertails")
        rng = random.Random(f"{seed}-{split}")
        if ratio is not None:
            harmful = rng.sample(harmful, min(len(harmful), round(ratio * len(wmdp))))
        rows = wmdp + harmful
        rng.shuffle(rows)
        rows = rows[:limit] if limit is not None else rows
        splits[split] = [{**row, "extra_info": {**row["extra_info"], "split": split, "index": i}}
                         for i, row in enumerate(rows)]
    return write_splits(out_dir, splits, "merge")


def read_prepared(path: Path, split: str, data_source: str, option: str) -> Rows:
    """The rows of a `purplerl data prepare` output split, checked to come from `data_source`."""
    import pyarrow.parquet as pq

    file = path.expanduser() / f"{split}.parquet"
    if not file.is_file():
        raise UserError(f"{option} {path} has no {split}.parquet: prepare it first with `purplerl data prepare`")
    try:
        rows = pq.read_table(file).to_pylist()
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise UserError(f"cannot read parquet file {file}: {err}") from err
    for row in rows:
        if not str(row.get("data_source", "")).startswith(data_source):
            raise UserError(f"{option} {path}: expected {data_source} rows, found data_source "
                            f"{row.get('data_source')!r}")
    return rows


# --------------------------------------------------------------------------------------------------- CLI


def default_out_dir(dataset: str, subset: str | None, template: Template) -> Path:
    """data/<name>, with a -base suffix so chat and base preparations never overwrite each other."""
    name = f"wmdp-{subset}" if dataset == "wmdp" else dataset
    return Path("data") / (name if template == "chat" else f"{name}-base")


def check_options(cfg: PrepareConfig) -> str:
    """The dataset `cfg` names, once a missing one and the options it does not use are refused."""
    if cfg.dataset is None:
        raise UserError(f"name a dataset: purplerl data prepare DATASET (choose from {', '.join(DATASETS)})")
    given = cfg.model_fields_set
    # An option the dataset ignores is a mistake the user should hear about, not a silent no-op.
    for option, used_by in OPTIONS_USED_BY.items():
        if option in given and cfg.dataset not in used_by:
            raise UserError(f"--{option} does not apply to '{cfg.dataset}' (only to {', '.join(used_by)})")
    return cfg.dataset


def prepare_dataset(cfg: PrepareConfig) -> Prepared | AttackPrompts:
    """The `purplerl data prepare DATASET` command: refuse the options DATASET does not use, then prepare."""
    if check_options(cfg) == SAFETY_PREFS:
        raise ValueError("safety-prefs needs a model: build it with purplerl.experiments.safety_prefs")
    if cfg.dataset == ATTACK_PROMPTS:
        out = default_out_dir(ATTACK_PROMPTS, None, "chat") if cfg.out is None else Path(cfg.out)
        out = check_output_dir(out, "--out", files=[f"{split}.jsonl" for split in SPLITS] + [MANIFEST])
        return prepare_attack_prompts(out)
    if cfg.dataset == "wmdp" and cfg.subset is None:
        raise UserError(f"wmdp needs --subset (choose from {', '.join(WMDP_TOPICS)})")
    out = default_out_dir(cfg.dataset, cfg.subset, cfg.template) if cfg.out is None else Path(cfg.out)
    out = check_output_dir(out, "--out", files=[f"{split}.parquet" for split in SPLITS],
                           inputs=[cfg.source, cfg.wmdp, cfg.beavertails])  # before any download
    source = Path(cfg.source) if cfg.source is not None else None
    if cfg.dataset == "beavertails":
        return prepare_beavertails(out, cfg.template, source)
    if cfg.dataset == "wmdp":
        return prepare_wmdp(out, str(cfg.subset), cfg.template, source, cfg.seed)
    if cfg.dataset == "gsm8k":
        return prepare_gsm8k(out, cfg.template, source)
    if cfg.wmdp is None or cfg.beavertails is None:
        raise UserError("merge needs --wmdp DIR and --beavertails DIR (outputs of `purplerl data prepare`)")
    return merge_prepared(Path(cfg.wmdp), Path(cfg.beavertails), out, cfg.ratio, cfg.limit, cfg.seed)
