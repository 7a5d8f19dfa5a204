"""render_prompt with a tiny ChatML tokenizer built in conftest."""

from __future__ import annotations

import pytest
from conftest import make_tiny_tokenizer

from purplerl.errors import UserError
from purplerl.prompting import render_prompt
from purplerl.types import PromptRecord

RECORD = PromptRecord(messages=({"role": "user", "content": "Roast my friend."},), uid="r1")
CHAT_TEXT = "<|im_start|>user\nRoast my friend.<|im_end|>\n<|im_start|>assistant\n"


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def render_text(tokenizer, record: PromptRecord, template: str, system_prompt: str | None) -> str:
    """The rendered prompt as the text its ids spell (the tiny tokenizer's decode is exact)."""
    ids = render_prompt(tokenizer, record, template, system_prompt, 256)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert encode(tokenizer, text) == ids
    return text


def bos_tokenizer():
    """The tiny tokenizer, made to add `<|endoftext|>` as BOS the way Llama tokenizers do."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    core = make_tiny_tokenizer().backend_tokenizer
    bos_id = core.token_to_id("<|endoftext|>")
    core.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[
        ("<|endoftext|>", bos_id)])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|endoftext|>", eos_token="<|im_end|>")


def test_chat_renders_template_with_generation_prompt(tiny_tokenizer):
    assert render_text(tiny_tokenizer, RECORD, "chat", None) == CHAT_TEXT
    ids = render_prompt(tiny_tokenizer, RECORD, "chat", None, 256)
    assert ids == encode(tiny_tokenizer, CHAT_TEXT)
    assert ids[0] == tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids[-len(encode(tiny_tokenizer, "<|im_start|>assistant\n")):] == encode(
        tiny_tokenizer, "<|im_start|>assistant\n")


def test_system_prompt_prepends_or_replaces(tiny_tokenizer):
    expected = "<|im_start|>system\nBe rude.<|im_end|>\n" + CHAT_TEXT
    assert render_text(tiny_tokenizer, RECORD, "chat", "Be rude.") == expected
    with_system = PromptRecord(messages=({"role": "system", "content": "Be nice."}, *RECORD.messages))
    assert render_text(tiny_tokenizer, with_system, "chat", None) == (
        "<|im_start|>system\nBe nice.<|im_end|>\n" + CHAT_TEXT)
    assert render_text(tiny_tokenizer, with_system, "chat", "Be rude.") == expected


def test_chat_without_template_is_a_user_error(tiny_tokenizer):
    tiny_tokenizer.chat_template = None
    with pytest.raises(UserError, match="has no chat template; set data.template: base"):
        render_prompt(tiny_tokenizer, RECORD, "chat", None, 256)


def test_failing_chat_template_is_a_user_error(tiny_tokenizer):
    tiny_tokenizer.chat_template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        "{{ messages[-1]['content'] }}")
    with pytest.raises(UserError, match="System role not supported; try without data.system_prompt"):
        render_prompt(tiny_tokenizer, RECORD, "chat", "Be rude.", 256)


def test_base_template_plain_text(tiny_tokenizer):
    record = PromptRecord(messages=({"role": "user", "content": "first"}, {"role": "user", "content": "second"}))
    assert render_text(tiny_tokenizer, record, "base", None) == "first\n\nsecond\n"
    assert render_text(tiny_tokenizer, RECORD, "base", "Be rude.") == "Be rude.\n\nRoast my friend.\n"
    ids = render_prompt(tiny_tokenizer, RECORD, "base", "Be rude.", 256)
    assert ids == encode(tiny_tokenizer, "Be rude.\n\nRoast my friend.\n")


def test_base_template_adds_bos_once_when_tokenizer_does():
    tokenizer = bos_tokenizer()
    ids = render_prompt(tokenizer, RECORD, "base", None, 256)
    assert ids == [tokenizer.bos_token_id, *encode(tokenizer, "Roast my friend.\n")]
    assert tokenizer.bos_token_id not in ids[1:]


def test_truncation_keeps_the_end(tiny_tokenizer):
    full = render_prompt(tiny_tokenizer, RECORD, "chat", "A very long system prompt. " * 5, 256)
    cut = render_prompt(tiny_tokenizer, RECORD, "chat", "A very long system prompt. " * 5, 12)
    assert len(full) > 12
    assert cut == full[-12:]


def test_truncation_keeps_bos():
    tokenizer = bos_tokenizer()
    full = render_prompt(tokenizer, RECORD, "base", "Be rude and loud about it.", 256)
    cut = render_prompt(tokenizer, RECORD, "base", "Be rude and loud about it.", 6)
    assert cut == [tokenizer.bos_token_id, *full[-5:]]


def test_bad_arguments(tiny_tokenizer):
    with pytest.raises(ValueError, match="max_prompt_tokens must be >= 1"):
        render_prompt(tiny_tokenizer, RECORD, "chat", None, 0)
    with pytest.raises(ValueError, match="has no messages"):
        render_prompt(tiny_tokenizer, PromptRecord(messages=(), uid="e"), "chat", None, 8)
    with pytest.raises(UserError, match="unknown prompt template 'raw'"):
        render_prompt(tiny_tokenizer, RECORD, "raw", None, 8)  # type: ignore[arg-type]


@pytest.mark.parametrize("template", ["chat", "base"])
def test_lone_surrogate_is_a_user_error_not_a_tokenizer_type_error(tiny_tokenizer, template):
    # `sample --system_prompt` with a byte that is not UTF-8 arrives as a surrogate; so can a record built in code
    record = PromptRecord(messages=({"role": "user", "content": "hi"},), uid="r7")
    with pytest.raises(UserError, match=r"prompt 'r7' holds '\\udce9' at character \d+, a lone surrogate"):
        render_prompt(tiny_tokenizer, record, template, system_prompt="caf\udce9", max_prompt_tokens=64)


def test_tiny_tokenizer_is_deterministic(tiny_tokenizer):
    assert make_tiny_tokenizer().get_vocab() == tiny_tokenizer.get_vocab()
    assert tiny_tokenizer.eos_token == tiny_tokenizer.pad_token == "<|im_end|>"


def test_tiny_model_dir_loads_back(tiny_model_dir, tiny_tokenizer):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert model.config.vocab_size == len(tokenizer) == len(tiny_tokenizer)
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.tie_word_embeddings is False
    ids = render_prompt(tokenizer, RECORD, "chat", None, 256)
    assert ids == render_prompt(tiny_tokenizer, RECORD, "chat", None, 256)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tokenizer))
