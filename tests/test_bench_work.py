"""The GRPO benchmark's work size: named shapes of bench/random_twin.py, the options that build a `Work`, and the
report's decode floor and MFU arithmetic, worked by hand. No benchmark runs; no model larger than a tiny one is
allocated (the published shapes are counted on the meta device)."""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
random_twin = importlib.import_module("random_twin")
grpo_flops = importlib.import_module("grpo_flops")
grpo_report = importlib.import_module("grpo_report")
bench_grpo = importlib.import_module("bench_grpo")
grpo_work = importlib.import_module("grpo_work")

SMOLLM2_VOCAB = 49152  # len() of the embedded SmolLM2 tokenizer, the twins' vocabulary
SPECIAL = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


@pytest.mark.parametrize("name", sorted(random_twin.SHAPES))
def test_named_shape_config_has_the_published_dimensions(name: str) -> None:
    published = random_twin.SHAPES[name]
    config = random_twin.shape_config(name, SMOLLM2_VOCAB, SPECIAL)
    assert config.model_type == published.model_type
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (
        published.hidden, published.intermediate, published.layers)
    assert (config.num_attention_heads, config.num_key_value_heads) == (published.heads, published.kv_heads)
    assert config.rope_parameters["rope_theta"] == published.rope["rope_theta"]
    assert config.tie_word_embeddings is published.tied
    assert config.max_position_embeddings == published.max_positions
    assert config.vocab_size == SMOLLM2_VOCAB and config.eos_token_id == 2


def test_the_table_holds_the_model_cards_numbers() -> None:
    # written out again here from the model cards, so a slip in the table is caught
    qwen15, llama, qwen7 = (random_twin.SHAPES[n] for n in ("qwen2.5-1.5b", "llama-3.2-1b", "qwen2.5-7b"))
    assert (qwen15.hidden, qwen15.intermediate, qwen15.layers, qwen15.heads, qwen15.kv_heads) == (1536, 8960, 28, 12, 2)
    assert (llama.hidden, llama.intermediate, llama.layers, llama.heads, llama.kv_heads) == (2048, 8192, 16, 32, 8)
    assert (qwen7.hidden, qwen7.intermediate, qwen7.layers, qwen7.heads, qwen7.kv_heads) == (3584, 18944, 28, 28, 4)
    assert (qwen15.tied, llama.tied, qwen7.tied) == (True, True, False)
    assert llama.rope["rope_type"] == "llama3" and llama.rope["factor"] == 32.0


@pytest.mark.parametrize("name", sorted(random_twin.SHAPES))
def test_published_parameter_count_on_the_meta_device(name: str) -> None:
    published = random_twin.SHAPES[name]
    count = random_twin.parameter_count(random_twin.shape_config(name, published.vocab, SPECIAL))
    assert count == pytest.approx(published.params, rel=0.03)


def test_the_1_5b_twin_differs_from_the_published_model_by_its_vocabulary_alone() -> None:
    published = random_twin.parameter_count(random_twin.shape_config("qwen2.5-1.5b", 151936, SPECIAL))
    assert published == pytest.approx(1.54e9, rel=0.03)
    twin_config = random_twin.shape_config("qwen2.5-1.5b", SMOLLM2_VOCAB, SPECIAL)
    twin = random_twin.parameter_count(twin_config)
    assert published - twin == (151936 - SMOLLM2_VOCAB) * 1536  # one tied embedding matrix
    # grpo_flops' N: every parameter but the norms (2 per layer + the final one) and the q/k/v biases
    shape = grpo_flops.ModelShape.from_hf_config(twin_config)
    assert (shape.head_dim, shape.vocab) == (128, SMOLLM2_VOCAB)
    norms, biases = (2 * 28 + 1) * 1536, 28 * (1536 + 2 * 256)
    assert grpo_flops.matmul_params(shape) == twin - norms - biases


def test_shape_twin_takes_the_tokenizers_vocabulary_and_files(tiny_model_dir: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    tiny = random_twin.PublishedShape("tiny", "qwen2", 32, 64, 2, 4, 2, {"rope_type": "default", "rope_theta": 1e4},
                                      True, 128, 1e-6, 1000, 0.0)
    monkeypatch.setitem(random_twin.SHAPES, "tiny", tiny)
    random_twin.make_shape_twin("tiny", tmp_path / "twin", tokenizer_dir=tiny_model_dir, dtype="bfloat16")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = AutoConfig.from_pretrained(tmp_path / "twin")
    assert config.vocab_size == len(tokenizer) != tiny.vocab
    assert (config.model_type, config.hidden_size, config.num_key_value_heads) == ("qwen2", 32, 2)
    assert (config.eos_token_id, config.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    twin_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "twin")
    assert twin_tokenizer("hello world")["input_ids"] == tokenizer("hello world")["input_ids"]
    weights = load_file(str(tmp_path / "twin" / "model.safetensors"))
    assert str(weights["model.layers.0.self_attn.q_proj.weight"].dtype) == "torch.bfloat16"
    assert "model.layers.0.self_attn.q_proj.bias" in weights
    with pytest.raises(SystemExit, match="unknown shape 'gpt-5'"):
        random_twin.shape_config("gpt-5", 10, SPECIAL)


def test_default_options_are_the_default_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCH_STEPS", raising=False)
    work = bench_grpo.work_from_args(bench_grpo.parse_args([]))
    assert work == grpo_work.Work()
    assert (work.prompts_per_step, work.group_size, work.max_new_tokens) == (8, 4, 48)
    assert (work.finetune, work.lora_rank, work.dtype, work.trl_micro_batch) == ("lora", 16, "auto", 0)


def test_work_options_reach_the_work_and_both_children(tmp_path: Path) -> None:
    args = bench_grpo.parse_args(["--steps", "5", "--prompts", "16", "--group-size", "8", "--new-tokens", "256",
                                  "--finetune", "full", "--dtype", "bfloat16", "--shape", "qwen2.5-1.5b",
                                  "--twin-dir", str(tmp_path), "--trl-micro-batch", "16"])
    work = bench_grpo.work_from_args(args)
    assert (work.steps, work.prompts_per_step, work.group_size, work.max_new_tokens) == (5, 16, 8, 256)
    assert (work.finetune, work.dtype, work.trl_micro_batch) == ("full", "bfloat16", 16)
    assert work.model == str(tmp_path / "qwen2.5-1.5b")
    # the child rebuilds the same Work from the JSON it is handed
    assert grpo_work.Work(**json.loads(json.dumps(asdict(work)))) == work
    config = grpo_work.purplerl_config(work, tmp_path, [])
    assert (config.model.finetune, config.model.dtype, config.training.batch_size) == ("full", "bfloat16", 16)
    assert (config.sampling.group_size, config.sampling.max_new_tokens) == (8, 256)


def test_trl_gets_the_same_work_in_micro_batches(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    grpo_trl = importlib.import_module("grpo_trl")
    work = grpo_work.Work(steps=5, prompts_per_step=16, group_size=8, max_new_tokens=256, dtype="bfloat16",
                          trl_micro_batch=16)
    args = grpo_trl.grpo_config(work, tmp_path, bf16=False)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (16, 8)
    assert (args.generation_batch_size, args.steps_per_generation, args.num_generations) == (128, 8, 8)
    assert (args.max_completion_length, args.max_steps, args.bf16) == (256, 5, True)
    assert args.model_init_kwargs["dtype"] == "bfloat16"
    default = grpo_trl.grpo_config(grpo_work.Work(), tmp_path, bf16=False)
    assert (default.per_device_train_batch_size, default.gradient_accumulation_steps, default.bf16) == (32, 1, False)
    assert default.model_init_kwargs["dtype"] == "float32"


def test_bad_work_options_stop_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="does not divide the 32 sequences"):
        bench_grpo.work_from_args(bench_grpo.parse_args(["--trl-micro-batch", "5"]))
    with pytest.raises(SystemExit):  # argparse: not both
        bench_grpo.parse_args(["--model", str(tmp_path), "--shape", "qwen2.5-7b"])
    args = bench_grpo.parse_args(["--dtype", "bfloat16", "--trl-bf16", "--steps", "2"])
    with pytest.raises(SystemExit, match="already runs TRL with bf16"):
        bench_grpo.checked_systems(args, bench_grpo.work_from_args(args))


def test_decode_floor_worked_by_hand() -> None:
    # two timed steps: 10 and 20 decode steps, 1.0 s and 2.0 s of sampling, 1e9 KV-cache bytes each;
    # 2e9 weight bytes at 100 GB/s = 0.02 s per decode step, so the floor is 30 x 0.02 = 0.6 s
    timed = [{"decode_steps": 10, "sample_s": 1.0, "kv_cache_bytes": 1e9},
             {"decode_steps": 20, "sample_s": 2.0, "kv_cache_bytes": 1e9}]
    floor = grpo_report.decode_floor(timed, weight_bytes=2e9, bandwidth_gb_s=100.0)
    assert floor["s_per_decode_step"] == pytest.approx(0.02)
    assert floor["floor_s_per_step"] == pytest.approx(0.3)
    assert floor["kv_cache_s_per_step"] == pytest.approx(0.01)
    assert floor["sampling_over_floor"] == pytest.approx(3.0 / 0.6)
    assert floor["sampling_over_floor_with_kv"] == pytest.approx(3.0 / 0.62)


def test_mfu_and_summary_worked_by_hand() -> None:
    assert grpo_flops.mfu(flops=2e12, seconds=4.0, peak_flops_per_s=1e12) == 0.5

    def step(n: int, step_s: float, train_s: float) -> dict:
        return {"step": n, "step_s": step_s, "sample_s": 1.0, "score_s": 0.5, "train_s": train_s,
                "toxicity": 0.1, "prompt_tokens": 30, "completion_tokens": 70, "token_source": "counted",
                "sampling_flops": 1e12, "reference_flops": 2e12, "training_flops": 6e12, "decode_steps": 50,
                "kv_cache_bytes": 0.0}

    steps = [step(1, 99.0, 90.0), step(2, 4.0, 2.0), step(3, 6.0, 4.0), step(4, 5.0, 3.0)]
    peaks = {"fp32": {"gflops": 1000.0}, "bf16": {"gflops": 4000.0}, "bandwidth": {"gb_per_s": 1000.0}}
    summary = grpo_report.summarize(steps, peaks, "bf16", weight_bytes=1e9)
    # step 1 is warm-up: 18e12 training FLOPs in 9 s = 2 TFLOP/s, half of the 4 TFLOP/s bf16 peak
    assert summary["mfu_compute_dtype"]["training"] == pytest.approx(0.5)
    assert summary["mfu"]["training"]["fp32"] == pytest.approx(2.0)
    assert summary["mfu_compute_dtype"]["sampling"] == pytest.approx(3e12 / 3.0 / 4e12)
    assert summary["mfu_compute_dtype"]["reference_and_reward"] == pytest.approx(6e12 / 1.5 / 4e12)
    assert summary["step_s"]["max_over_median"] == pytest.approx(6.0 / 5.0)
    # 1e9 bytes at 1000 GB/s = 1 ms per decode step, 150 steps: 0.15 s floor against 3 s of sampling
    assert summary["decode_floor"]["sampling_over_floor"] == pytest.approx(20.0)


def test_report_of_one_finished_and_one_failed_child() -> None:
    from types import SimpleNamespace

    shape = grpo_flops.ModelShape.from_hf_config(SimpleNamespace(
        num_hidden_layers=2, hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=1,
        head_dim=4, vocab_size=10))
    steps = [{"step": n, "step_s": 2.0, "sample_s": 1.0, "score_s": 0.5, "train_s": 0.5, "toxicity": 0.2,
              "prompt_lens": [3, 3], "completion_lens": [2, 1], "prompt_tokens": 6, "completion_tokens": 3,
              "token_source": "counted"} for n in (1, 2)]
    finished = {"system": "purplerl", "compute_dtype": "bf16", "peak_rss_mib": 100.0, "peak_gpu_mib": None,
                "steps": steps}
    failed = {"system": "trl", "failed": "ran past --child-timeout 60 s", "log_tail": []}
    peaks = {"fp32": {"gflops": 1.0}, "bf16": {"gflops": 2.0}, "bandwidth": {"gb_per_s": 1.0}}
    for result in (finished, failed):
        grpo_report.summarize_system(result, shape, 2, peaks)
    step = finished["steps"][1]
    assert step["training_flops"] == grpo_flops.training_flops(shape, [(3, 2), (3, 1)], 2)
    assert (step["decode_steps"], step["kv_cache_bytes"]) == (2, 32 * (9 + 4))
    # bf16 weights and the r=2 LoRA: 3488 bytes per decode step at 1 GB/s, 2 decode steps
    assert finished["summary"]["decode_floor"]["floor_s_per_step"] == pytest.approx(2 * 3488 / 1e9)
    assert "summary" not in failed
    rows = grpo_report.table({"purplerl": finished, "trl": failed}).splitlines()
    assert rows[2].startswith("| purplerl | bf16 | 2.00 |") and rows[2].count("|") == rows[0].count("|")
    assert rows[3].startswith("| trl | failed: ran past --child-timeout 60 s |")
    assert rows[3].count("|") == rows[0].count("|")


def test_memory_bandwidth_counts_bytes_read_and_written(monkeypatch: pytest.MonkeyPatch) -> None:
    grpo_machine = importlib.import_module("grpo_machine")
    monkeypatch.setattr(grpo_machine, "best_time", lambda fn, repeats: 0.001)
    assert grpo_machine.memory_bandwidth(nbytes=2**20) == {"gb_per_s": round(2 * 2**20 / 0.001 / 1e9, 1),
                                                           "copy_bytes": 2**20}
    before = {"bf16": {"gflops": 5.0}, "bandwidth": {"gb_per_s": 9.0}}
    after = {"bf16": {"gflops": 7.0}, "bandwidth": {"gb_per_s": 3.0}}
    best = grpo_machine.best_of(before, after)
    assert (best["bf16"]["gflops"], best["bandwidth"]["gb_per_s"]) == (7.0, 9.0)
    assert (best["bandwidth"]["before_gb_per_s"], best["bandwidth"]["after_gb_per_s"]) == (9.0, 3.0)


def test_matmul_peak_stops_at_the_probe_for_a_dtype_without_fast_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    grpo_machine = importlib.import_module("grpo_machine")
    calls: list[int] = []

    def timed(seconds_by_repeats: dict[int, float]):
        def best_time(fn, repeats):
            calls.append(repeats)
            return seconds_by_repeats[repeats]
        return best_time

    monkeypatch.setattr(grpo_machine, "PROBE_SIZE", 100)
    monkeypatch.setattr(grpo_machine, "best_time", timed({1: 2.0}))  # the probe: 2e6 FLOPs in 2 s
    assert grpo_machine.matmul_peak(torch.float32, sizes=(200, 400)) == {
        "gflops": 0.0, "by_size": {"100": 0.0}, "slow_dtype": True}
    assert calls == [1]  # the peak sizes never ran
    calls.clear()
    monkeypatch.setattr(grpo_machine, "best_time", timed({1: 1e-6, 5: 1e-3}))
    peak = grpo_machine.matmul_peak(torch.float32, sizes=(200, 400))
    assert peak == {"gflops": round(2 * 400**3 / 1e-3 / 1e9, 1),
                    "by_size": {"200": round(2 * 200**3 / 1e-3 / 1e9, 1), "400": round(2 * 400**3 / 1e-3 / 1e9, 1)}}
    assert calls == [1, 5, 5]
