"""`purplerl data prepare safety-prefs`: an offline preference set built from the project's alignment data.

- Harmful requests (purplerl/data/alignment): chosen = the alignment data's refusal of the request; rejected =
  a harmful answer. With `--attack_run DIR` the rejected answers are the completions mined from that attack's
  samples.jsonl as tamper-test's sft threat mines them (harm score >= tamper.sft_min_toxicity, not a refusal,
  not degenerate, distinct); a mined prompt that is no alignment request is refused with a refusal composed
  for its category the same way. The alignment data itself holds no harmful answers (only refusals), so
  without an attack run the rejected answer is `--model`'s own sampled answer to the request (ANSWER_SAMPLING),
  kept only when the keyword refusal judge finds no refusal in it and it is not degenerate; a request the model
  refuses gets no pair.
- Benign requests, the look-alikes of harmful ones included: chosen = `--model`'s own sampled answer (the
  self-distillation of `purplerl align`), kept when it is no refusal; rejected = a needless refusal, an opener
  of the alignment refusals plus an over-cautious reason, both drawn by hashing the request's uid.

Answers cut at ANSWER_TOKENS keep their whole sentences only, and degenerate ones (empty, or repeating their
3-grams past tamper.max_repetition) are left out. Every draw is a hash or seeded sampling, so a model gives the
same file every time. Each pair keeps its request's split: the alignment data's test split holds out whole
templates and whole topics; a mined prompt outside it is held out by a hash of the prompt. Written as
OUT/train.jsonl and OUT/test.jsonl (the file is the split) in the preference pair format (prompt, chosen,
rejected as text) with the request's kind, category, uid, template, topic and tags, and where each answer came
from; `purplerl.data.preference.load_pairs` reads them.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from purplerl.config import EMBEDDED_MODEL, ModelConfig, PrepareConfig, TamperConfig
from purplerl.data.alignment import SPLITS, AlignExample, alignment_examples, to_prompt_records
from purplerl.data.alignment import refusals as refusal_table
from purplerl.data.preference import held_out_by_prompt
from purplerl.data.prepare import SAFETY_PREFS, check_options, default_out_dir
from purplerl.engines import make_engine
from purplerl.engines.base import Engine
from purplerl.engines.model_cache import to_stderr
from purplerl.errors import ExperimentError, UserError
from purplerl.experiments.align import whole_sentences
from purplerl.experiments.tamper.heldout import degenerate
from purplerl.experiments.tamper.mining import mine_rows
from purplerl.files import read_jsonl, write_durably
from purplerl.outputs import check_output_dir, make_output_dir
from purplerl.prompting import render_prompt
from purplerl.rewards.refusal import RefusalJudge
from purplerl.runs.layout import SAMPLES_FILE
from purplerl.types import PreferencePair, SamplingParams

Answerer = Callable[[Sequence[AlignExample]], list[str]]  # requests -> the model's answers, '' for none usable
ANSWER_TOKENS = 128
ANSWER_BATCH = 16
# Answers are sampled as `purplerl align` samples its self-distilled ones: greedy decoding of the instruct model
# loops on harmful requests (3 of 3 degenerate in a --limit 3 run), and the benign answers are then the same kind
# as the SFT data's.
ANSWER_SAMPLING = {"temperature": 0.7, "top_p": 0.9}
# share of mined prompts outside the alignment data held out, about the alignment data's own test share
MINED_TEST_SHARE = 0.25
_TAMPER = TamperConfig.model_fields
MIN_TOXICITY = _TAMPER["sft_min_toxicity"].default
MAX_REPETITION = _TAMPER["max_repetition"].default
# Why a needless refusal refuses: over-caution about a request that is fine (the benign side's rejected answers).
OVERCAUTIOUS_REASONS: tuple[str, ...] = (
    "Questions like this can lead to harm, so I'd rather not answer.",
    "I'm not comfortable giving advice on this topic.",
    "This is the kind of thing that could be misused, so I'll stay out of it.",
    "I can't be sure this wouldn't hurt someone, so I won't go into it.",
    "This could be risky, and I don't want to be responsible for what happens.",
    "It's safer for me not to get into this.",
    "Topics like this are outside what I'm allowed to discuss.",
)


@dataclass(frozen=True)
class SafetyPrefs:
    """What `prepare_safety_prefs` wrote."""

    out_dir: Path
    rows: dict[str, int]  # split -> pairs written to <out_dir>/<split>.jsonl
    left_out: dict[str, int]  # why a request got no pair -> how many

    def describe(self) -> str:
        wrote = ", ".join(f"{self.out_dir / f'{split}.jsonl'} ({n} pairs)" for split, n in self.rows.items())
        skipped = "; ".join(f"{n} {why}" for why, n in sorted(self.left_out.items()))
        return f"wrote {wrote}" + (f"; left out: {skipped}" if skipped else "")


def prepare_safety_prefs(out_dir: Path, answer: Answerer, attack_run: Path | None = None,
                         limit: int | None = None, splits: Sequence[str] = SPLITS) -> SafetyPrefs:
    """Build the set (module docstring) into `out_dir`, the model's answers from `answer` (`model_answerer`);
    `limit` caps the requests of each kind per split; `splits` are the splits written (`purplerl align` trains on
    the training split only)."""
    samples = _attack_samples(attack_run) if attack_run is not None else None  # a bad dir fails before the model
    requests = {kind: [(split, ex) for split in splits for ex in _spread(alignment_examples(split, kind), limit)]
                for kind in ("harmful", "benign")}
    judge, left_out = RefusalJudge(), Counter()
    benign = requests["benign"]
    rows = benign_rows(benign, answer([ex for _, ex in benign]), judge, left_out)
    if samples is None:
        harmful = requests["harmful"]
        rows += harmful_rows(harmful, answer([ex for _, ex in harmful]), judge, left_out)
    else:
        rows += [row for row in _mined_rows(samples, limit, left_out) if row["split"] in splits]
    return write_pairs(out_dir, rows, dict(left_out), splits)


def model_answerer(model: str = EMBEDDED_MODEL, notify: Callable[[str], None] = print,
                   max_new_tokens: int | None = None) -> Answerer:
    """`model_answers` of `model` (at most `max_new_tokens`, default ANSWER_TOKENS), loaded on the first call."""
    engines: list[Engine] = []

    def answer(examples: Sequence[AlignExample]) -> list[str]:
        if not engines:
            engines.append(make_engine(ModelConfig(name=model)))
        return model_answers(engines[0], examples, notify, max_new_tokens=max_new_tokens or ANSWER_TOKENS)

    return answer


def prepare_command(cfg: PrepareConfig) -> SafetyPrefs:
    """`purplerl data prepare safety-prefs`: refuse the options it does not use, then build into --out
    (default data/safety-prefs)."""
    check_options(cfg)
    out = default_out_dir(SAFETY_PREFS, None, "chat") if cfg.out is None else Path(cfg.out)
    out = check_output_dir(out, "--out", files=[f"{split}.jsonl" for split in SPLITS],
                           inputs=[cfg.attack_run])  # before the model loads
    attack_run = Path(cfg.attack_run) if cfg.attack_run is not None else None
    return prepare_safety_prefs(out, model_answerer(cfg.model, to_stderr), attack_run, cfg.limit)


def model_answers(engine: Engine, examples: Sequence[AlignExample], notify: Callable[[str], None],
                  seed: int = 0, max_new_tokens: int = ANSWER_TOKENS) -> list[str]:
    """The model's sampled answer to each request (ANSWER_SAMPLING, seeded per batch: the same answers every time), a
    cut answer kept to its whole sentences ('' when none)."""
    answers: list[str] = []
    for start in range(0, len(examples), ANSWER_BATCH):
        records = to_prompt_records(examples[start:start + ANSWER_BATCH])
        tokens = [render_prompt(engine.tokenizer, r, template="chat", system_prompt=None, max_prompt_tokens=256)
                  for r in records]
        groups = engine.sample(tokens, 1, SamplingParams(max_new_tokens=max_new_tokens, seed=seed + start,
                                                         **ANSWER_SAMPLING))
        answers += [whole_sentences(g[0].text, g[0].finish_reason == "stop") for g in groups]
        notify(f"safety-prefs: answered {len(answers)}/{len(examples)} requests")
    return answers


def needless_refusal(example: AlignExample) -> str:
    """A refusal of a benign request: an alignment refusal opener and an over-cautious reason, drawn by uid."""
    openers = refusal_table.OPENERS + refusal_table.KIND_OPENERS[example.template_kind]
    return f"{openers[_draw(example.uid, 'opener', len(openers))]} " \
           f"{OVERCAUTIOUS_REASONS[_draw(example.uid, 'reason', len(OVERCAUTIOUS_REASONS))]}"


def _draw(uid: str, part: str, n: int) -> int:
    return int.from_bytes(hashlib.sha256(f"needless/{part}/{uid}".encode()).digest()[:8], "big") % n


def _spread(examples: list[AlignExample], limit: int | None) -> list[AlignExample]:
    """At most `limit` examples, every k-th: the examples are in category order, so the picks spread over them."""
    if limit is None or limit >= len(examples):
        return examples
    return examples[::len(examples) // limit][:limit]


def _unusable(answer: str, judge: RefusalJudge) -> str | None:
    """Why a model's answer cannot stand as a compliant answer, or None."""
    if degenerate(answer, MAX_REPETITION):
        return "empty or degenerate answers"
    return "refused by the model" if judge.refused(answer) else None


def _compliant(kind: str, requests: list[tuple[str, AlignExample]], answers: list[str], judge: RefusalJudge,
               left_out: Counter) -> Iterator[tuple[str, AlignExample, str]]:
    """(split, request, answer) for each answer that can stand as a compliant one; why the others cannot is
    counted in `left_out` as '`kind` requests <why>'."""
    for (split, ex), answer in zip(requests, answers, strict=True):
        why = _unusable(answer, judge)
        if why is None:
            yield split, ex, answer
        else:
            left_out[f"{kind} requests {why}"] += 1


def benign_rows(requests: list[tuple[str, AlignExample]], answers: list[str], judge: RefusalJudge,
                left_out: Counter, own: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Benign pairs: the model's usable answer over a needless refusal. `own`: the answers of the model that will be
    trained on the pairs; where one is a refusal it is the rejected answer (an on-policy needless refusal), else a
    composed one is (needless_refusal)."""
    own_refusal = {ex.uid: text for (_, ex), text in zip(requests, own or [""] * len(requests), strict=True)
                   if text.strip() and judge.refused(text)}
    return [_row(split, ex, answer, own_refusal.get(ex.uid, needless_refusal(ex)), chosen_from="model",
                 rejected_from="own refusal" if ex.uid in own_refusal else "needless refusal")
            for split, ex, answer in _compliant("benign", requests, answers, judge, left_out)]


def harmful_rows(requests: list[tuple[str, AlignExample]], answers: list[str], judge: RefusalJudge,
                  left_out: Counter) -> list[dict[str, Any]]:
    return [_row(split, ex, str(ex.refusal), answer, chosen_from="refusal", rejected_from="model")
            for split, ex, answer in _compliant("harmful", requests, answers, judge, left_out)]


def _attack_samples(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir.expanduser() / SAMPLES_FILE
    if not path.is_file():
        raise UserError(f"--attack_run {run_dir}: no {SAMPLES_FILE} (it must be an attack run dir)")
    return read_jsonl(path, cut_tail=True)


def _mined_rows(samples: list[dict[str, Any]], limit: int | None, left_out: Counter) -> list[dict[str, Any]]:
    """Harmful pairs from an attack's mined completions: the request's refusal (or one composed for the sample's
    category) against what the attacked model said."""
    mined = mine_rows(samples, MIN_TOXICITY, MAX_REPETITION)
    if not mined:
        raise ExperimentError(f"no sample of the attack run has a harm score >= {MIN_TOXICITY} and is a distinct, "
                              "non-degenerate, non-refusing answer: attack longer, or leave out --attack_run")
    requests = {ex.prompt.strip(): (split, ex) for split in SPLITS for ex in alignment_examples(split, "harmful")}
    categories = {str(s.get("prompt", "")).strip(): str(s.get("category", "")) for s in samples}
    rows = []
    for item in mined:
        prompt = item["prompt"].strip()
        if prompt in requests:
            split, ex = requests[prompt]
            rows.append(_row(split, ex, str(ex.refusal), item["completion"], chosen_from="refusal",
                             rejected_from="attack"))
        elif categories[prompt] in refusal_table.REASONS:
            rows.append(_outside_row(prompt, categories[prompt], item["completion"]))
        else:
            left_out["mined completions whose category has no refusal"] += 1
    kept = []
    for split in SPLITS:  # the limit caps each split, as it caps the requests of each kind
        of_split = [r for r in rows if r["split"] == split]
        kept += of_split[:limit]
        if limit is not None and len(of_split) > limit:
            left_out["mined completions past --limit"] += len(of_split) - limit
    return kept


def _outside_row(prompt: str, category: str, completion: str) -> dict[str, Any]:
    """A mined prompt that is no alignment request: refused as a question of its category, split by a hash."""
    uid = f"attack:{hashlib.sha256(prompt.encode()).hexdigest()[:12]}"
    refusal = refusal_table.build_refusal(uid, category, "question")
    messages = ({"role": "user", "content": prompt},)
    _, held = held_out_by_prompt([PreferencePair(messages, refusal, completion, uid)], MINED_TEST_SHARE, seed=0)
    return {"prompt": prompt, "chosen": refusal, "rejected": completion, "split": "test" if held else "train",
            "kind": "harmful", "category": category, "uid": uid, "template_id": None, "topic_id": None, "tags": [],
            "chosen_from": "composed refusal", "rejected_from": "attack"}


def _row(split: str, ex: AlignExample, chosen: str, rejected: str, chosen_from: str,
         rejected_from: str) -> dict[str, Any]:
    return {"prompt": ex.prompt, "chosen": chosen, "rejected": rejected, "split": split, "kind": ex.kind,
            "category": ex.category, "uid": ex.uid, "template_id": ex.template_id, "topic_id": ex.topic_id,
            "tags": list(ex.tags), "chosen_from": chosen_from, "rejected_from": rejected_from}


def write_pairs(out_dir: Path, rows: list[dict[str, Any]], left_out: dict[str, int],
           splits: Sequence[str]) -> SafetyPrefs:
    by_split = {split: [r for r in rows if r["split"] == split] for split in splits}
    for split, kept in by_split.items():
        if not kept:
            raise ExperimentError(f"safety-prefs: no pairs left for the {split} split (left out: {left_out})")
    make_output_dir(out_dir)
    for split, kept in by_split.items():
        # the file is the split: a "split" field would make data.split pick rows within it (purplerl.data.sources)
        lines = [json.dumps({k: v for k, v in r.items() if k != "split"}, ensure_ascii=False) + "\n" for r in kept]
        write_durably(out_dir / f"{split}.jsonl", "".join(lines))
    return SafetyPrefs(out_dir, {split: len(kept) for split, kept in by_split.items()}, left_out)
