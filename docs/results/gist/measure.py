"""gist.json for docs/results/gist/: `measure.py WORK_DIR OUT.json`, after run.sh's runs.

Per run (k0_sS: no gist tokens; k4_sS: 4 gist tokens; both LoRA; k4full_sS: 4 gist tokens, every weight
trained), on the 92 held-out dialogues: the last answer's NLL per token
read as the run trained (compressed for k4), read whole (every earlier turn visible), and read without the history
(the last attack alone), with the keys an answer token attends. The first two come from the run's own final eval;
the third is scored here from the run's final checkpoint. The untrained model is read whole and without the history.
Means over seeds with 95% t intervals."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from purplerl.config import ModelConfig
from purplerl.data.gist import compressed_logits
from purplerl.data.sft import Conversation, encode
from purplerl.engines.local import LocalEngine
from purplerl.recipes.sft.step import heldout_metrics
from purplerl.runs.checkpoints import latest_checkpoint

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}  # Student's t, two-sided 95%, by degrees of freedom


def interval(values: list[float]) -> dict[str, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return {"mean": mean, "lo": math.nan, "hi": math.nan, "n": n}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = T975[n - 1] * sd / math.sqrt(n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n}


def score(engine: LocalEngine, conversations: list[Conversation]) -> dict[str, float]:
    tokenizer = engine.tokenizer
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    examples = [encode(tokenizer, c, "chat", None, 1024) for c in conversations]
    return heldout_metrics(engine, [e for e in examples if e is not None], pad, 8)


def greedy_last_answer(engine: LocalEngine, conversation: Conversation, k: int, tokens: int = 48) -> str:
    """The last answer decoded greedily as the run reads the dialogue: through the gist tokens' cache when k > 0
    (only the last gist block's keys and values are kept between turns), whole when k = 0."""
    encoded = encode(engine.tokenizer, conversation, "chat", None, 1024, k)
    ids, blocks = list(encoded.ids[:encoded.answer_from]), list(encoded.gist_blocks)
    stop = set(engine.trainer.stop_ids) | {engine.tokenizer.eos_token_id}
    lm = engine.trainer.causal_lm
    lm.eval()
    new: list[int] = []
    for _ in range(tokens):
        token = int(compressed_logits(lm, ids + new, blocks, k)[-1].argmax())
        if token in stop:
            break
        new.append(token)
    return engine.tokenizer.decode(new)


def final_eval(run: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "eval/answer_nll" in r][-1]


def main(work: Path, out: Path) -> None:
    rows = [json.loads(line) for line in (work / "dialogues.jsonl").read_text().splitlines() if line.strip()]
    held = [r for r in rows if r["split"] == "test"]
    whole = [Conversation(tuple(r["messages"]), r["uid"]) for r in held]
    alone = [Conversation(tuple(r["messages"][-2:]), r["uid"]) for r in held]
    per_run: dict[str, dict[str, float]] = {}
    samples: dict[str, list[dict[str, str]]] = {}
    base = LocalEngine(ModelConfig(device="cpu"), seed=0)
    read_whole = score(base, whole)
    per_run["base"] = {"whole": read_whole["eval/answer_nll"], "keys_whole": read_whole["eval/answer_keys"],
                       "alone": score(base, alone)["eval/answer_nll"]}
    del base
    for run in sorted((work / "runs").iterdir()):
        metrics = final_eval(run)
        group = run.name.split("_")[0]
        k = int(group[1:].removesuffix("full"))
        engine = LocalEngine(ModelConfig(device="cpu", finetune="full" if group.endswith("full") else "lora"), seed=0)
        engine.load(latest_checkpoint(run))
        entry = {"as_trained": metrics["eval/answer_nll"], "keys_as_trained": metrics["eval/answer_keys"],
                 "alone": score(engine, alone)["eval/answer_nll"]}
        if k:
            entry |= {"whole": metrics["eval/answer_nll_full_context"],
                      "keys_whole": metrics["eval/answer_keys_full_context"]}
        else:
            entry |= {"whole": metrics["eval/answer_nll"], "keys_whole": metrics["eval/answer_keys"]}
        per_run[run.name] = entry
        if run.name.endswith("_s0"):
            samples[run.name] = [{"uid": c.uid, "last_attack": c.messages[-2]["content"],
                                  "reference": c.messages[-1]["content"],
                                  "answer": greedy_last_answer(engine, c, k)} for c in whole[:6]]
        print(run.name, {key: round(v, 3) for key, v in entry.items()}, flush=True)
        del engine
    summary = {}
    for group in ("k0", "k4", "k4full"):
        runs = [v for name, v in per_run.items() if name.split("_")[0] == group]
        if not runs:
            continue
        summary[group] = {key: interval([r[key] for r in runs]) for key in runs[0]}
        summary[group]["as_trained_minus_whole"] = interval([r["as_trained"] - r["whole"] for r in runs])
        summary[group]["alone_minus_as_trained"] = interval([r["alone"] - r["as_trained"] for r in runs])
    out.write_text(json.dumps({"held_out_dialogues": len(held), "runs": per_run, "summary": summary,
                               "samples": samples}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
