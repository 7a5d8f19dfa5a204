"""`purplerl align`: fine-tune the embedded SmolLM2-135M-Instruct into `embedded:smollm2-135m-safe`, a model that
refuses harmful requests and answers benign ones, so the offline attack has real safety to break.

Two stages, a small fixed pipeline (the second runs with DPO_STAGE, off until a version beats the SFT stage alone):
1. SFT on the project's own data (purplerl/data/alignment): harmful requests answered with the composed refusals,
   benign requests with the base model's own answers (self-distillation, which keeps its utility). Its merged model
   is a cache entry of its own ($PURPLERL_CACHE/models/smollm2-135m-safe-<sft key>: the SFT-only build).
2. DPO from that model, which is its reference, on preference pairs (build_pairs): benign requests prefer the
   model's own answer to a needless refusal (v3 refused 41% of held-out benign requests), harmful ones the refusal
   to the base model's compliant answer.

The result is cached under $PURPLERL_CACHE/models/smollm2-135m-safe-<key>, the key hashing the data, both stages'
settings and the base model; each stage's run lives in $PURPLERL_CACHE/align/<its key>/ while it trains, so a killed
build resumes. docs/results/align/README.md measures every version.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from purplerl.config import ModelConfig
from purplerl.data.alignment import alignment_data_hash, alignment_examples, to_prompt_records
from purplerl.engines import make_engine
from purplerl.engines.loading import cache_dir, register_derived_model
from purplerl.engines.merge import merge_adapter
from purplerl.engines.model_cache import build_lock, to_stderr, verify_entry
from purplerl.errors import ExperimentError
from purplerl.files import write_durably
from purplerl.launch import run_settings
from purplerl.prompting import render_prompt
from purplerl.recipes.prefs import PREFS
from purplerl.recipes.sft import SFT
from purplerl.rewards.refusal import RefusalJudge
from purplerl.runs.checkpoints import latest_checkpoint
from purplerl.runs.layout import CONFIG_FILE
from purplerl.train.recipe import Recipe
from purplerl.train.runner import execute_run
from purplerl.types import SamplingParams

SAFE_MODEL = "smollm2-135m-safe"
BASE_MODEL = "embedded:smollm2-135m-instruct"
# Stage 1, SFT: every setting of it goes into its key. The shipped build is v3; v6 and v7 are kept to reproduce their
# measurements (set SFT_SETTINGS = SFT_V6 or SFT_V7). docs/results/align/README.md measures every version.
SFT_V3: dict[str, Any] = {
    "version": 3,
    # v1 (560 harmful, 288 benign once, 160 steps) refused 98% of held-out harmful requests but also 63% of benign
    # ones (greedy); v2 (benign answers twice as many as refusals) 89% and 49%; v3 trains twice as long: 91% and 41%
    "harmful_examples": 288,  # of the training split's harmful requests (refusals)
    "benign_examples": 288,  # of its benign requests (answered by the base model itself)
    "benign_repeat": 2,  # each benign conversation appears this many times in the SFT data
    # without "refusal_retries", the base model's own refusals of benign requests stay in the data (v3 has 17, twice)
    "answer": {"max_new_tokens": 96, "temperature": 0.7, "top_p": 0.9, "seed": 0},
    "sft": {"steps": 320, "batch_size": 8, "lr": 3e-4, "lora_rank": 16, "lora_alpha": 32.0, "max_tokens": 320,
            "eval_fraction": 0.05, "eval_every": 40, "seed": 0},
}
# v6: the base model is asked again where it refused a benign request (3 retries, then the request is left out), and
# twice as many distinct benign requests appear once each (830 rows and 320 steps, as v3). Measured: harmful refusal
# up (0.93 / 0.82 greedy / sampled, v3 0.91 / 0.77), benign refusal not down (0.47 / 0.35, v3 0.41 / 0.31): the
# over-refusal does not come from the refusals in the benign data.
SFT_V6: dict[str, Any] = {
    **SFT_V3, "version": 6, "benign_examples": 576, "benign_repeat": 1,
    # an answer the refusal judge calls a refusal is sampled again (a new seed), this many times, then left out
    "answer": {**SFT_V3["answer"], "refusal_retries": 3},
}
# v7: v6 trained twice as long (640 steps), the lever that moved both numbers the right way from v2 to v3. Measured:
# benign refusal down to 0.14 / 0.15 greedy / sampled, but harmful refusal down too (0.83 / 0.75) and arithmetic 0/40
# (below the base's CI): another point on the frontier, not inside the target (docs/results/align/README.md).
SFT_V7: dict[str, Any] = {**SFT_V6, "version": 7, "sft": {**SFT_V6["sft"], "steps": 640}}
SFT_SETTINGS: dict[str, Any] = SFT_V3
# Stage 2, DPO from the SFT model (its own reference) on the training split's preference pairs
# (experiments/safety_prefs.py): benign requests prefer the base model's answer to a needless refusal, harmful ones
# the refusal to the base model's compliant answer. v3 (SFT only) refused 41% of held-out benign requests.
PREFS_SETTINGS: dict[str, Any] = {
    # v4 paired every benign answer with a composed needless refusal (lr 1e-4): DPO separated those pairs within 20
    # steps (loss 0.008 at step 30, margin 9), held-out benign refusal rose from v3's 0.41 to 0.51 (greedy) and the
    # answers garbled ("Meringue is a harmful practice that causes skin cancer"). v5 pairs a benign answer with the
    # SFT model's own refusal of the request wherever it refuses (on-policy negatives), at a third of the lr.
    "version": 5,
    "benign_rejected": "own refusal",  # the SFT model's sampled answer where it is a refusal, else a composed one
    "own_answer_tokens": 64,  # enough for a refusal (a longer answer is no refusal the pairs need)
    # the SFT data's benign conversations give the benign pairs (their answers are the base model's own); this many
    # of its harmful requests are answered by the base model for the harmful pairs' rejected side
    "harmful_requests": 192,
    "prefs": {"steps": 60, "batch_size": 8, "lr": 3e-5, "beta": 0.1, "loss": "dpo", "lora_rank": 16,
              "lora_alpha": 32.0, "eval_fraction": 0.05, "eval_every": 40, "seed": 0},
}
# Whether the preference stage runs. Off: neither DPO version beat v3 beyond its CIs (v4 failed, v5 moved along v3's
# frontier: benign refusal 0.36 vs 0.41, harmful 0.88 vs 0.91, greedy; docs/results/align/README.md), and the stage
# adds ~18 min to a 2-core build. Off, the aligned model is the SFT stage's entry.
DPO_STAGE = False
ALIGN_SETTINGS: dict[str, Any] = {"sft": SFT_SETTINGS, "prefs": PREFS_SETTINGS}
ANSWER_BATCH = 32


def sft_key() -> str:
    """The SFT stage's key: the alignment data, its settings and the base model."""
    blob = json.dumps({"data": alignment_data_hash(), "settings": SFT_SETTINGS, "base": BASE_MODEL},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def align_key() -> str:
    """The cache key of the aligned model: the SFT stage's key and, when it runs, the preference stage's settings."""
    if not DPO_STAGE:
        return sft_key()
    blob = json.dumps({"sft": sft_key(), "prefs": PREFS_SETTINGS}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _pick(examples: list, count: int, seed: int) -> list:
    """`count` examples spread over the categories: a seeded shuffle, then round-robin by category."""
    rng = random.Random(seed)
    by_category: dict[str, list] = {}
    for example in examples:
        by_category.setdefault(example.category, []).append(example)
    for items in by_category.values():
        rng.shuffle(items)
    picked: list = []
    while len(picked) < min(count, len(examples)):
        for items in by_category.values():
            if items and len(picked) < count:
                picked.append(items.pop())
    return picked


def whole_sentences(text: str, finished: bool) -> str:
    """The answer, or when it was cut at max_new_tokens, its whole sentences only: a cut mid-sentence would teach
    the model to stop mid-sentence."""
    text = text.strip()
    if finished:
        return text
    end = max(text.rfind(mark) for mark in (". ", ".\n", "! ", "? ", "!\n", "?\n"))
    return text[:end + 1].strip() if end >= 40 else ""


def self_distilled_answers(prompts: list, notify: Callable[[str], None]) -> list[tuple[Any, str]]:
    """(example, the base model's own answer) for the benign prompts, answers cut to whole sentences. Where the base
    model refuses a benign request, it is asked again with a new seed (`refusal_retries` times), then left out: a
    refusal in the benign data teaches over-refusal directly."""
    engine = make_engine(ModelConfig(name=BASE_MODEL))
    answers = _answer_benign(lambda batch, seed: _sample_once(engine, batch, seed), prompts, notify)
    return [(ex, answers[ex.uid]) for ex in prompts if ex.uid in answers]


def _sample_once(engine: Any, batch: list, seed: int) -> list[str]:
    """One sampled answer per prompt, cut to whole sentences ("" when none is left)."""
    a = SFT_SETTINGS["answer"]
    tokens = [render_prompt(engine.tokenizer, r, template="chat", system_prompt=None, max_prompt_tokens=256)
              for r in to_prompt_records(batch)]
    sampling = SamplingParams(max_new_tokens=a["max_new_tokens"], temperature=a["temperature"], top_p=a["top_p"],
                              seed=seed)
    return [whole_sentences(group[0].text, group[0].finish_reason == "stop")
            for group in engine.sample(tokens, 1, sampling)]


def _answer_benign(sample: Callable[[list, int], list[str]], prompts: list,
                   notify: Callable[[str], None]) -> dict[str, str]:
    """uid -> a kept answer: `sample(batch, seed)` answers each batch; empty answers are left out; with
    `refusal_retries` set, refusals are asked again with the next seed of their batch until the retries are spent."""
    a = SFT_SETTINGS["answer"]
    retries = a.get("refusal_retries")  # None: refusals are kept as answers (v3's data)
    judge, kept, refused = RefusalJudge(), {}, 0
    for start in range(0, len(prompts), ANSWER_BATCH):
        pending = prompts[start:start + ANSWER_BATCH]
        for attempt in range(1 + (retries or 0)):
            if not pending:
                break
            # attempt 0 keeps v3's seeds; a retry's seed is past every first attempt's
            seed = a["seed"] + start + attempt * (len(prompts) + ANSWER_BATCH)
            again = []
            for ex, answer in zip(pending, sample(pending, seed), strict=True):
                if answer and retries is not None and judge.refused(answer):
                    again.append(ex)
                elif answer:
                    kept[ex.uid] = answer
            refused += len(again)
            pending = again
        notify(f"align: base answers {min(start + ANSWER_BATCH, len(prompts))}/{len(prompts)} ({len(kept)} kept, "
               f"{refused} refused answers, each asked again while retries remain)")
    return kept


def build_data(path: Path, notify: Callable[[str], None]) -> None:
    """The SFT conversations (JSONL), written atomically: refusals for harmful, own answers for benign."""
    s = SFT_SETTINGS
    harmful = _pick(alignment_examples("train", "harmful"), s["harmful_examples"], 1)
    benign = _pick(alignment_examples("train", "benign"), s["benign_examples"], 2)
    rows = [{"uid": ex.uid, "messages": list(ex.conversation())} for ex in harmful]
    answered = self_distilled_answers(benign, notify)
    rows += [{"uid": f"{ex.uid}-{k}", "messages": list(ex.conversation(answer))}
             for ex, answer in answered for k in range(s["benign_repeat"])]
    random.Random(3).shuffle(rows)
    write_durably(path, "".join(json.dumps(r) + "\n" for r in rows))


def _sft_config(sft: Recipe, work: Path, data: Path, progress: bool):
    s = SFT_SETTINGS["sft"]
    return run_settings(sft, base={
        "recipe": "sft",
        "model": {"name": BASE_MODEL, "lora_rank": s["lora_rank"], "lora_alpha": s["lora_alpha"]},
        "data": {"source": str(data)},
        "training": {"steps": s["steps"], "batch_size": s["batch_size"], "lr": s["lr"], "seed": s["seed"]},
        "sft": {"max_tokens": s["max_tokens"], "eval_fraction": s["eval_fraction"], "eval_every": s["eval_every"]},
        "run": {"output_dir": str(work), "name": "sft", "save_every": 20, "keep_last": 2},
        "logging": {"progress": progress},
    })


def aligned_model_dir(notify: Callable[[str], None] = to_stderr, progress: bool = False) -> Path:
    """The aligned model's dir, built (resumably) on first use, and again after a load found it damaged and removed
    it (the SFT run in the work dir is kept, so that rebuild is only the merge)."""
    key = align_key()
    target = cache_dir() / "models" / f"{SAFE_MODEL}-{key}"
    if (target / "config.json").is_file():
        verify_entry(target, f"embedded:{SAFE_MODEL}", notify)
        return target
    work = cache_dir() / "align" / key
    work.mkdir(parents=True, exist_ok=True)
    with build_lock(work / "build.lock", f"embedded:{SAFE_MODEL}", notify):
        if (target / "config.json").is_file():
            return target
        return _build(work, target, notify, progress)


def _build(work: Path, target: Path, notify: Callable[[str], None], progress: bool) -> Path:
    """SFT (its run in $PURPLERL_CACHE/align/<sft key>), merged; then, with DPO_STAGE, DPO from that model (its run
    in $PURPLERL_CACHE/align/<align key>), merged into `target`. Each stage resumes where a kill left it."""
    sft_work = cache_dir() / "align" / sft_key()
    sft_model = _sft_stage(sft_work, notify, progress)
    if not DPO_STAGE:
        return sft_model
    pairs = work / "prefs"
    if not (pairs / "train.jsonl").is_file():
        build_pairs(pairs, sft_work / "data.jsonl", sft_model, notify)
    adapter = _finished_run(PREFS, _prefs_config(PREFS, work, pairs / "train.jsonl", sft_model, progress),
                            work / "prefs-run", PREFS_SETTINGS["prefs"]["steps"], notify)
    notify(f"align: merging {adapter} into the SFT model, hashing it into its manifest")
    merge_adapter(adapter, target, str(sft_model), metadata={"purplerl_align.json": {
        "key": align_key(), "settings": ALIGN_SETTINGS, "data_hash": alignment_data_hash()}}, cache_entry=True)
    notify(f"align: cached {target}")
    return target


def build_pairs(out_dir: Path, sft_data: Path, sft_model: Path, notify: Callable[[str], None]) -> None:
    """The preference stage's pairs (out_dir/train.jsonl): each benign conversation of the SFT data prefers its
    answer to a needless refusal, the SFT model's own where it refuses the request; the first `harmful_requests`
    harmful ones prefer their refusal to the base model's own sampled answer, kept when it is no refusal and not
    degenerate (experiments/safety_prefs.py)."""
    from purplerl.experiments import safety_prefs as sp  # it imports this module

    examples = {ex.uid: ex for kind in ("harmful", "benign") for ex in alignment_examples("train", kind)}
    benign: dict[str, tuple[Any, str]] = {}
    harmful: list[Any] = []
    for line in sft_data.read_text().splitlines():
        row = json.loads(line)
        uid = row["uid"] if row["uid"] in examples else row["uid"].rsplit("-", 1)[0]  # benign rows repeat as uid-k
        ex = examples[uid]
        if ex.kind == "benign":
            benign.setdefault(uid, (ex, row["messages"][-1]["content"]))
        elif len(harmful) < PREFS_SETTINGS["harmful_requests"]:
            harmful.append(ex)
    notify(f"align: preference pairs from {len(benign)} benign conversations and {BASE_MODEL}'s answers to "
           f"{len(harmful)} harmful requests")
    judge, left_out = sp.RefusalJudge(), Counter()
    requests = [("train", ex) for ex, _ in benign.values()]
    own = sp.model_answerer(str(sft_model), notify, PREFS_SETTINGS["own_answer_tokens"])(
        [ex for ex, _ in benign.values()])
    rows = sp.benign_rows(requests, [a for _, a in benign.values()], judge, left_out, own)
    answers = sp.model_answerer(BASE_MODEL, notify)(harmful)
    rows += sp.harmful_rows([("train", ex) for ex in harmful], answers, judge, left_out)
    notify(f"align: {sp.write_pairs(out_dir, rows, dict(left_out), ('train',)).describe()}")


def _sft_stage(work: Path, notify: Callable[[str], None], progress: bool) -> Path:
    """The SFT stage's merged model, a cache entry of its own (keyed by its settings): trained and merged on first
    use, its run in `work`."""
    model = cache_dir() / "models" / f"{SAFE_MODEL}-{sft_key()}"
    if (model / "config.json").is_file():
        verify_entry(model, f"the SFT stage of embedded:{SAFE_MODEL}", notify)
        return model
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data.jsonl"
    if not data.is_file():
        build_data(data, notify)
    notify(f"align: SFT of {BASE_MODEL} on {sum(1 for _ in data.open())} conversations")
    adapter = _finished_run(SFT, _sft_config(SFT, work, data, progress), work / "sft", SFT_SETTINGS["sft"]["steps"],
                            notify)
    notify(f"align: merging {adapter} into {BASE_MODEL}")
    return merge_adapter(adapter, model, BASE_MODEL, metadata={"purplerl_align.json": {
        "stage": "sft", "key": sft_key(), "settings": SFT_SETTINGS, "data_hash": alignment_data_hash()}},
        cache_entry=True)


def _finished_run(recipe: Recipe, config: Any, run_dir: Path, steps: int, notify: Callable[[str], None]) -> Path:
    """Run (or resume) a stage's run to its last step; its last checkpoint."""
    notify(f"align: {recipe.name} run ({steps} steps) in {run_dir}")
    summary = execute_run(recipe, config, run_dir, resume=(run_dir / CONFIG_FILE).is_file())
    adapter = latest_checkpoint(run_dir)
    if adapter is None or summary["last_step"] < steps:
        raise ExperimentError(f"align: the {recipe.name} run in {run_dir} did not finish "
                              f"(last step {summary['last_step']})")
    return adapter


def _prefs_config(prefs: Recipe, work: Path, data: Path, model: Path, progress: bool):
    s = PREFS_SETTINGS["prefs"]
    return run_settings(prefs, base={
        "recipe": "prefs",
        "model": {"name": str(model), "lora_rank": s["lora_rank"], "lora_alpha": s["lora_alpha"]},
        "data": {"source": str(data)},
        "training": {"steps": s["steps"], "batch_size": s["batch_size"], "lr": s["lr"], "seed": s["seed"]},
        "prefs": {"loss": s["loss"], "beta": s["beta"], "eval_fraction": s["eval_fraction"],
                  "eval_every": s["eval_every"]},
        "run": {"output_dir": str(work), "name": "prefs-run", "save_every": 20, "keep_last": 2},
        "logging": {"progress": progress},
    })


# `embedded:smollm2-135m-safe` resolves to this build wherever this module was imported (the CLI and the tamper test
# import it): the engines layer below knows the name only through this registration.
register_derived_model(SAFE_MODEL, aligned_model_dir)
