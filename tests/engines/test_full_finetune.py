"""Full-parameter fine-tuning (`model.finetune: full`) in the local engine, beyond the engine contract (which runs
on a full factory too): tied embeddings trained once, mixed precision, the lazily loaded reference, and the
one-line refusals (named adapters, a LoRA start, a checkpoint of the other kind)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from purplerl.algorithms.registry import CrossEntropyParams, Loss
from purplerl.config import ModelConfig, PromptFormatConfig
from purplerl.engines import make_engine
from purplerl.errors import UserError
from purplerl.runs.policy import resolve_policy
from purplerl.types import AdamParams, TrainBatch
from tests.conftest import make_tiny_tokenizer
from tests.tolerances import gradient_atol

# Adam with beta1 = beta2 = 0 and eps >> |g| moves each weight by lr * g / (|g| + eps) ~ g (see the contract)
READOUT = AdamParams(lr=1e4, beta1=0.0, beta2=0.0, eps=1e4, weight_decay=0.0, max_grad_norm=0.0)
SFT_ADAM = AdamParams(lr=1e-2)
TEXTS = ["Tell me a joke about cats and dogs", "hello world thanks please", "The quick brown fox jumps"]


def _engine(model_dir: Path, finetune: str = "full", dtype: str = "float32", **extra):
    lora = {"lora_rank": 4, "lora_targets": "q_proj,v_proj"} if finetune == "lora" else {}
    cfg = ModelConfig(name=str(model_dir), dtype=dtype, device="cpu", finetune=finetune, **lora, **extra)
    return make_engine(cfg, seed=3)


def _batch(tokenizer) -> TrainBatch:
    """Right-padded texts, every token after the first trained."""
    encoded = [tokenizer.encode(t) for t in TEXTS]
    width = max(len(e) for e in encoded)
    ids = torch.full((len(encoded), width), int(tokenizer.pad_token_id))
    attn = torch.zeros_like(ids)
    for i, e in enumerate(encoded):
        ids[i, :len(e)], attn[i, :len(e)] = torch.tensor(e), 1
    mask = attn.float()
    mask[:, 0] = 0
    return TrainBatch(ids, attn, mask)


def _sft_step(engine, batch: TrainBatch, adam: AdamParams = SFT_ADAM) -> None:
    engine.forward_backward(batch, Loss("cross_entropy", CrossEntropyParams()))
    engine.optim_step(adam)


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama whose LM head is its input embedding (as SmolLM2's is)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tied")
    tokenizer = make_tiny_tokenizer(path)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=True, bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(path))
    return path


def test_tied_embeddings_are_one_weight_with_both_gradients(tied_model_dir: Path, tmp_path: Path) -> None:
    engine = _engine(tied_model_dir)
    embedding, head = engine.model.get_input_embeddings().weight, engine.model.get_output_embeddings().weight
    assert embedding is head and sum(p is embedding for p in engine.trainable) == 1  # one parameter, once
    batch = _batch(engine.tokenizer)
    # the gradient by plain autograd: the tied matrix gets the embedding's and the head's contributions
    plain = AutoModelForCausalLM.from_pretrained(str(tied_model_dir), dtype=torch.float32)
    logits_NTV = plain(input_ids=batch.input_ids_NT, attention_mask=batch.attention_mask_NT).logits[:, :-1]
    logp_NT = torch.log_softmax(logits_NTV, -1).gather(-1, batch.input_ids_NT[:, 1:, None])[..., 0]
    mask_NT = batch.loss_mask_NT[:, 1:]
    (-(logp_NT * mask_NT).sum() / mask_NT.sum()).backward()
    expected = plain.get_input_embeddings().weight.grad.clone()
    # the embedding's own part (through a separate copy looked up as inputs) is far from negligible: an engine
    # that trained the tied matrix for one of its two uses would miss the comparison below
    lookup = plain.get_input_embeddings().weight.detach().clone().requires_grad_(True)
    logits_NTV = plain(inputs_embeds=lookup[batch.input_ids_NT], attention_mask=batch.attention_mask_NT).logits[:, :-1]
    logp_NT = torch.log_softmax(logits_NTV, -1).gather(-1, batch.input_ids_NT[:, 1:, None])[..., 0]
    (-(logp_NT * mask_NT).sum() / mask_NT.sum()).backward()
    assert float(lookup.grad.abs().max()) > 0.1 * float(expected.abs().max())
    before = embedding.detach().clone()
    _sft_step(engine, batch, READOUT)
    after_embedding = engine.model.get_input_embeddings().weight.detach()
    after_head = engine.model.get_output_embeddings().weight.detach()
    assert torch.equal(after_embedding, after_head)
    # two fp32 paths to one gradient (tests/tolerances.py), read out through Adam as g / (1 + |g| / eps)
    largest = float(expected.abs().max())
    atol = gradient_atol(torch.float32, engine.model.config, batch.input_ids_NT.shape[1],
                         int(batch.attention_mask_NT.sum()), largest) + largest ** 2 / READOUT.eps
    torch.testing.assert_close(before - after_embedding, expected, atol=atol, rtol=0)
    engine.save(tmp_path)
    saved = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    assert saved.get_input_embeddings().weight is saved.get_output_embeddings().weight
    torch.testing.assert_close(saved.get_input_embeddings().weight, after_embedding, atol=0, rtol=0)


def test_the_reference_is_the_initial_model_loaded_on_first_use(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = _engine(tiny_model_dir)
    batch = _batch(engine.tokenizer)
    initial = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
    for _ in range(3):
        _sft_step(engine, batch)
    assert engine.trainer._reference_lm is None  # training without KL (SFT) never holds a second copy
    trained = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
    assert float((trained - initial).abs().max()) > 0.1
    reference = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, reference=True,
                                targets_NT=batch.loss_mask_NT)
    torch.testing.assert_close(reference, initial, atol=0, rtol=0)
    assert all(not p.requires_grad for p in engine.trainer._reference_lm.parameters())
    # a resumed engine's reference is still the initial model, not the checkpoint it loaded
    engine.save(tmp_path)
    resumed = _engine(tiny_model_dir)
    resumed.load(tmp_path)
    torch.testing.assert_close(resumed.logprobs(batch.input_ids_NT, batch.attention_mask_NT,
                                                targets_NT=batch.loss_mask_NT), trained, atol=0, rtol=0)
    torch.testing.assert_close(resumed.logprobs(batch.input_ids_NT, batch.attention_mask_NT, reference=True,
                                                targets_NT=batch.loss_mask_NT), initial, atol=0, rtol=0)


def test_mixed_precision_trains_fp32_masters_and_saves_them(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = _engine(tiny_model_dir, dtype="bfloat16")
    assert {p.dtype for p in engine.trainable} == {torch.bfloat16}
    assert {m.dtype for m in engine.master} == {torch.float32}
    batch = _batch(engine.tokenizer)
    # the reference (loaded in bf16) is the policy's starting point (loaded in fp32, then cast) to the bit
    torch.testing.assert_close(engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, reference=True),
                               engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT), atol=0, rtol=0)
    # an update below bf16's resolution (2^-8 relative) is kept by the masters, lost by the bf16 weights
    tiny = AdamParams(lr=1e-5)
    before = [m.clone() for m in engine.master]
    for _ in range(2):
        _sft_step(engine, batch, tiny)
    moved = [float((m - b).abs().max()) for m, b in zip(engine.master, before, strict=True)]
    assert min(moved) > 0
    norms = [i for i, (n, _) in enumerate(engine.model.named_parameters()) if "norm" in n]
    assert norms and all(torch.all(engine.trainable[i] == 1) for i in norms)  # initialized to 1, 2e-5 away
    assert all(float((engine.master[i] - 1).abs().max()) > 1e-6 for i in norms)
    engine.save(tmp_path)
    names = [n for n, _ in engine.model.named_parameters()]
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        for name, master in zip(names, engine.master, strict=True):
            assert torch.equal(f.get_tensor(name), master), name  # the exact fp32 masters
    again = _engine(tiny_model_dir, dtype="bfloat16")
    again.load(tmp_path)
    for a, b in zip(again.master, engine.master, strict=True):
        assert torch.equal(a, b)
    _sft_step(engine, batch)
    _sft_step(again, batch)  # the optimizer moments came back too: the same next step
    for a, b in zip(again.master, engine.master, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_a_checkpoint_of_the_other_kind_is_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    lora, full = _engine(tiny_model_dir, finetune="lora"), _engine(tiny_model_dir)
    lora.save(tmp_path / "lora")
    full.save(tmp_path / "full")
    with pytest.raises(UserError, match=r"is a LoRA adapter checkpoint .* set --model.finetune lora") as err:
        full.load(tmp_path / "lora")
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"is a full-parameter checkpoint .* set --model.finetune full") as err:
        lora.load(tmp_path / "full")
    assert "\n" not in str(err.value)
    # a LoRA run cannot start from a full model as its adapter: it is loaded as the model itself
    with pytest.raises(UserError, match=r"is a full model .*not a LoRA adapter: load it as the model itself"):
        _engine(tiny_model_dir, finetune="lora", init_adapter=str(tmp_path / "full"))
    # the settings refuse init_adapter without LoRA; the engine refuses a config that went around them too
    lora_start = ModelConfig(name=str(tiny_model_dir), dtype="float32", device="cpu",
                             init_adapter=str(tmp_path / "lora"))
    with pytest.raises(UserError, match="model.init_adapter is a LoRA adapter, model.finetune 'full'"):
        make_engine(lora_start.model_copy(update={"finetune": "full"}), seed=3)


def test_named_adapters_are_refused_in_full_mode(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    assert engine.adapters == ["default"] and engine.active_adapter == "default"
    with pytest.raises(UserError, match="cannot add adapter 'forget': named adapters need LoRA"):
        engine.create_adapter("forget")
    with pytest.raises(UserError, match="no adapter 'forget': named adapters need LoRA"):
        engine.use_adapter("forget")
    engine.use_adapter("default")
    assert engine.adapters == ["default"]


def test_a_bare_full_model_dir_is_loaded_as_the_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = _engine(tiny_model_dir)
    batch = _batch(engine.tokenizer)
    _sft_step(engine, batch)
    engine.save(tmp_path / "ckpt")
    base = ModelConfig(name=str(tiny_model_dir), dtype="float32", device="cpu")
    policy = resolve_policy(tmp_path / "ckpt", base, PromptFormatConfig())
    assert (policy.model.name, policy.model.finetune, policy.model.init_adapter) == (str(tmp_path / "ckpt"), "full",
                                                                                      None)
    assert "not a checkpoint of a run" in policy.note and "a full model" in policy.note
    assert policy.without_adapter().model.name == str(tiny_model_dir)
    loaded = policy.load()
    torch.testing.assert_close(loaded.logprobs(batch.input_ids_NT, batch.attention_mask_NT),
                               engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT), atol=0, rtol=0)
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "float32"
