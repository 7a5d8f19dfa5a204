"""TRL's GRPOTrainer on the benchmark's work (the `--child trl` and `--child trl-bf16` processes).

The trainer is TRL's own, subclassed only to time its phases: `_generate` (chat template, `generate`, decoding)
is the sampling phase; `_generate_and_score_completions` minus it is the reference pass + reward; a callback times
each optimizer step (on_step_begin -> on_step_end), and the rest of the step is training (forward/backward with
the loss, clipping, optimizer step). Before each step samples, the prompt ids TRL built are checked against
purplerl's rendering of the same step's prompts, and the reward function checks the prompt uids: a mismatch stops
the run rather than benchmarking different work.

Settings that differ from TRL's defaults, so that both systems do the same work: gradient_checkpointing=False
(purplerl keeps activations; TRL's default would recompute the forward), bf16=False (TRL's fp32 default on CPU;
`trl-bf16` sets bf16=True, autocast over fp32 weights, the nearest TRL setting to purplerl's bf16 `dtype auto`,
so run both), shuffle_dataset=False
(the dataset rows already are purplerl's prompt order), beta=0.1 (TRL's default 0 skips the reference pass).

Work.dtype 'bfloat16' loads the model in bf16 and sets bf16=True, TRL's usual GPU setting: LoRA adapters stay fp32
(PEFT's default), and full fine-tuning updates the bf16 weights themselves with bf16 AdamW states (no fp32
masters, unlike purplerl). Work.finetune 'full' passes no peft_config: TRL trains every weight and loads a second
copy of the model as the reference. Work.trl_micro_batch > 0 splits the B·G sequences into passes of that many
with gradient accumulation; one generation batch of B·G still makes one optimizer step, and the 'dapo' loss
divides by the whole batch's completion tokens, so the gradient is the one-pass gradient.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import datasets
import torch
from grpo_work import Work, peak_gpu_mib, peak_rss_mib, prompt_batches, purplerl_config, rendered_prompts
from peft import LoraConfig
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from purplerl.engines.loading import resolve_model_path
from purplerl.rewards import make_toxicity_scorer
from purplerl.rewards.base import checked_values
from purplerl.rewards.registry import term_params
from purplerl.types import PromptRecord

# recorded with the results: the GRPOConfig fields that define the work and how it is run
RECORDED_ARGS = ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                 "generation_batch_size", "steps_per_generation", "max_completion_length", "temperature", "top_p",
                 "top_k", "beta", "epsilon", "epsilon_high", "loss_type", "scale_rewards", "num_iterations",
                 "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm", "seed",
                 "use_cpu", "bf16", "gradient_checkpointing", "disable_dropout", "shuffle_dataset", "optim",
                 "adam_beta1", "adam_beta2", "adam_epsilon")


class StepRecorder(TrainerCallback):
    """Times each optimizer step and holds what the trainer and the reward function record during it."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.current: dict[str, Any] = {}
        self._started = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.current = {"step": state.global_step + 1}
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():  # the optimizer step's kernels end before the clock stops
            torch.cuda.synchronize()
        self.current["step_s"] = time.perf_counter() - self._started
        self.steps.append(self.current)


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with its rollout and scoring phases timed and its prompts checked."""

    def __init__(self, *args: Any, recorder: StepRecorder, expected_prompt_ids: list[list[list[int]]],
                 **kwargs: Any) -> None:
        self.recorder = recorder
        self.expected_prompt_ids = expected_prompt_ids
        super().__init__(*args, callbacks=[recorder], **kwargs)

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        step = self.recorder.current["step"]
        if [list(ids) for ids in prompt_ids] != self.expected_prompt_ids[step - 1]:
            raise RuntimeError(f"TRL step {step}: prompt token ids differ from purplerl's rendering of the "
                               "same prompts (chat template, system prompt or prompt order)")
        return super()._generate_single_turn(prompt_ids, *args, **kwargs)

    def _generate(self, prompts):
        started = time.perf_counter()
        out = super()._generate(prompts)
        prompt_ids, completion_ids = out[0], out[1]
        self.recorder.current.update(sample_s=time.perf_counter() - started,
                                     prompt_lens=[len(ids) for ids in prompt_ids],
                                     completion_lens=[len(ids) for ids in completion_ids])
        return out

    def _generate_and_score_completions(self, inputs):
        started = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        self.recorder.current["sample_score_s"] = time.perf_counter() - started
        return out


def toxicity_reward(recorder: StepRecorder, batches: list[list[PromptRecord]], group: int, toxicity_cfg):
    """The embedded toxicity scorer as a TRL reward function; records the step's mean toxicity."""
    scorer = make_toxicity_scorer(toxicity_cfg)

    def toxicity(prompts, completions, uid, **kwargs) -> list[float]:
        step = recorder.current["step"]
        expected = [r.uid for r in batches[step - 1] for _ in range(group)]
        if list(uid) != expected:
            raise RuntimeError(f"TRL step {step}: got prompts {list(uid)}, purplerl's step has {expected}")
        texts = [c[-1]["content"] for c in completions]
        scores = checked_values(scorer, texts, [p[-1]["content"] for p in prompts])
        recorder.current["toxicity"] = statistics.fmean(scores)
        return scores

    return toxicity


def grpo_config(work: Work, output_dir: Path, bf16: bool) -> GRPOConfig:
    sequences = work.prompts_per_step * work.group_size
    micro_batch = work.trl_micro_batch or sequences
    return GRPOConfig(
        output_dir=str(output_dir), max_steps=work.steps, seed=work.seed, bf16=bf16 or work.dtype == "bfloat16",
        use_cpu=not torch.cuda.is_available(),  # the same device as purplerl's 'auto'
        model_init_kwargs={"dtype": "float32" if work.dtype == "auto" else work.dtype},
        gradient_checkpointing=False, disable_dropout=True,
        # one generation batch of B·G sequences = one optimizer step (steps_per_generation defaults to the
        # accumulation steps), in passes of micro_batch sequences
        per_device_train_batch_size=micro_batch, gradient_accumulation_steps=sequences // micro_batch,
        num_generations=work.group_size, num_iterations=1, shuffle_dataset=False,
        max_completion_length=work.max_new_tokens, temperature=work.temperature, top_p=work.top_p,
        top_k=work.top_k,
        beta=work.kl_beta, epsilon=work.clip, loss_type="dapo", scale_rewards="group",
        learning_rate=work.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=work.max_grad_norm,
        report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True)


def _finish(step: dict[str, Any]) -> dict[str, Any]:
    """Phase times and token sums of one recorded step."""
    missing = {"sample_s", "sample_score_s", "toxicity", "step_s"} - step.keys()
    if missing:
        raise RuntimeError(f"TRL step {step['step']} recorded no {', '.join(sorted(missing))}")
    return {"step": step["step"], "step_s": step["step_s"], "sample_s": step["sample_s"],
            "score_s": step["sample_score_s"] - step["sample_s"], "train_s": step["step_s"] - step["sample_score_s"],
            "toxicity": step["toxicity"], "prompt_lens": step["prompt_lens"],
            "completion_lens": step["completion_lens"], "prompt_tokens": sum(step["prompt_lens"]),
            "completion_tokens": sum(step["completion_lens"]), "token_source": "counted"}


def run_trl(work: Work, bf16: bool, out: Path) -> None:
    """Train with GRPOTrainer on `work` and write the child JSON to `out`."""
    with tempfile.TemporaryDirectory(prefix="bench-grpo-trl-") as tmp:
        config = purplerl_config(work, Path(tmp), [])  # the same prompts, rendering and toxicity scorer
        batches = prompt_batches(config)
        # one row per prompt, batches in step order: with shuffle_dataset=False TRL's RepeatSampler yields rows
        # k·B .. k·B+B-1, each G times in a row, for step k+1 (group-major, like purplerl)
        rows = [{"prompt": [dict(m) for m in r.messages], "uid": r.uid} for batch in batches for r in batch]
        recorder = StepRecorder()
        path = resolve_model_path(work.model)
        peft_config = LoraConfig(r=work.lora_rank, lora_alpha=work.lora_alpha, lora_dropout=0.0,
                                 target_modules="all-linear", task_type="CAUSAL_LM") if work.lora else None
        args = grpo_config(work, Path(tmp), bf16)
        if args.gradient_checkpointing:  # transformers 5 resolves it through its activation_checkpointing alias
            raise RuntimeError("gradient checkpointing is on: TRL would recompute the forward that purplerl keeps")
        trainer = TimedGRPOTrainer(
            model=path, args=args, train_dataset=datasets.Dataset.from_list(rows),
            processing_class=AutoTokenizer.from_pretrained(path, padding_side="left"),
            reward_funcs=toxicity_reward(recorder, batches, work.group_size, term_params("toxicity", None)),
            peft_config=peft_config, recorder=recorder, expected_prompt_ids=rendered_prompts(config, batches))
        trainer.train()
    if len(recorder.steps) != work.steps:
        raise RuntimeError(f"TRL ran {len(recorder.steps)} steps, expected {work.steps}")
    # enums (optim, lr_scheduler_type) as their plain values
    settings = {name: getattr(getattr(args, name), "value", getattr(args, name)) for name in RECORDED_ARGS}
    settings["model_dtype"] = args.model_init_kwargs["dtype"]
    settings["lora"] = None if peft_config is None else {
        "r": peft_config.r, "alpha": peft_config.lora_alpha, "dropout": peft_config.lora_dropout,
        "target_modules": str(peft_config.target_modules)}
    name = "trl-bf16" if bf16 else "trl"
    out.write_text(json.dumps({"system": name, "settings": settings, "compute_dtype": "bf16" if args.bf16 else "fp32",
                               "peak_rss_mib": peak_rss_mib(), "peak_gpu_mib": peak_gpu_mib(),
                               "steps": [_finish(s) for s in recorder.steps]}))
