"""Render a PromptRecord into the token ids the policy continues.

`chat` renders with the tokenizer's own chat template (ending in the assistant header, so the model
answers as the assistant); `base` joins the message texts as plain text for models without a template.
The template is rendered to text and then encoded, rather than tokenized by `apply_chat_template`, because
transformers 5 returns a BatchEncoding there and 4.x a list; text-then-encode behaves the same in both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from purplerl.errors import UserError
from purplerl.files import unicode_problem
from purplerl.types import PromptRecord

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Template = Literal["chat", "base"]


def render_prompt(tokenizer: PreTrainedTokenizerBase, record: PromptRecord, template: Template,
                  system_prompt: str | None, max_prompt_tokens: int) -> list[int]:
    """Token ids of the rendered prompt, at most `max_prompt_tokens` long (cut from the left)."""
    if max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
    text = _render(tokenizer, record, template, system_prompt)
    problem = unicode_problem(text)
    if problem:  # the tokenizer would raise a bare TypeError
        raise UserError(f"prompt '{record.uid}' {problem}")
    # The chat template already writes any BOS it wants into the text; encoding with special tokens
    # would add a second one.
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if template == "base":
        ids = _with_bos(tokenizer, text, ids)
    return truncate_left(ids, max_prompt_tokens, tokenizer.bos_token_id)


def with_system_prompt(messages: tuple[dict[str, str], ...], system_prompt: str | None) -> list[dict[str, str]]:
    """The messages with `system_prompt` replacing the leading system message, or prepended as one."""
    out = [dict(m) for m in messages]
    if system_prompt is None:
        return out
    if out and out[0]["role"] == "system":
        out[0]["content"] = system_prompt
        return out
    return [{"role": "system", "content": system_prompt}, *out]


def _render(tokenizer: PreTrainedTokenizerBase, record: PromptRecord, template: Template,
            system_prompt: str | None) -> str:
    if not record.messages:
        raise ValueError(f"prompt record '{record.uid}' has no messages")
    messages = with_system_prompt(record.messages, system_prompt)
    if template == "base":
        return "\n\n".join(m["content"] for m in messages) + "\n"
    if template != "chat":
        raise UserError(f"unknown prompt template '{template}': use 'chat' or 'base'")
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"tokenizer '{tokenizer.name_or_path}' has no chat template; "
                        "set data.template: base to render prompts as plain text")
    import jinja2  # deferred: only chat templates need it, and transformers does not require it

    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except jinja2.TemplateError as err:
        # Some templates reject roles they do not know (e.g. no system role); say which knob to turn.
        raise UserError(f"chat template of '{tokenizer.name_or_path}' failed: {err}; "
                        "try without data.system_prompt or with data.template: base") from err
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
    return text


def _with_bos(tokenizer: PreTrainedTokenizerBase, text: str, ids: list[int]) -> list[int]:
    """Prepend BOS when the tokenizer adds one on its own (Llama-style), but never add EOS or others."""
    bos = tokenizer.bos_token_id
    if bos is None or ids[:1] == [bos]:
        return ids
    probe = tokenizer.encode(text, add_special_tokens=True)
    return [bos, *ids] if probe[:1] == [bos] else ids


def truncate_left(ids: list[int], max_tokens: int, bos_id: int | None) -> list[int]:
    """Keep the last `max_tokens` ids.

    The end of a rendered prompt holds the user's request and the assistant header that generation must
    follow, so the cut goes on the left and only drops the start (system prompt, early turns). A leading
    BOS is kept, because models trained with one drift badly without it.
    """
    if len(ids) <= max_tokens:
        return ids
    if bos_id is not None and ids[0] == bos_id and max_tokens > 1:
        return [bos_id, *ids[len(ids) - max_tokens + 1:]]
    return ids[len(ids) - max_tokens:]
