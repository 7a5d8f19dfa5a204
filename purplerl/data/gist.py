"""Gist tokens (Mu et al. 2023, "Learning to Compress Prompts with Gist Tokens", arXiv 2304.08467) for dialogues:
after each earlier assistant turn, K gist tokens; a later turn reads the earlier ones only through them.

Layout. A dialogue's tokens are cut at its gist blocks into segments: segment 0 runs through gist block 0, segment s
from the token after block s-1 through block s, the last segment from the token after the last block to the end.
A query of segment s attends the keys from the first token of gist block s-1 on (causally): the previous block and
its own segment, nothing earlier. So gist block s compresses block s-1 and the turn before it, recursively, and the
mask is causal with a first key per query (`first_key`, TrainBatch.first_key_NT; purplerl.algorithms.packing).

At inference a conversation then costs K keys for all its history: feeding each segment onto a cache that holds only
the last gist block, with positions continued, gives the masked forward's outputs exactly (`compressed_logits`,
tested against it). SFT on gist rows trains the behaviour: the loss on later assistant turns reaches the gist
tokens' states through the mask.

The gist token is one token id repeated K times (its K positions make the states differ): the tokenizer's
`<|gist|>` if it has one, else its highest added special token that is none of bos/eos/pad/unk and that the chat
template never writes (SmolLM2: `<empty_output>`). A LoRA adapter learns the gist states through the layers it adapts;
the token's input embedding stays the base's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from purplerl.errors import UserError

GIST_TOKEN = "<|gist|>"


def gist_token_id(tokenizer) -> int:
    """The id the gist blocks repeat (see the module doc); UserError when the tokenizer has none to spare."""
    added = {token.content: token_id for token_id, token in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    if GIST_TOKEN in added:
        return int(added[GIST_TOKEN])
    taken = {tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token, tokenizer.unk_token}
    template = getattr(tokenizer, "chat_template", None) or ""
    spare = [token_id for content, token_id in added.items() if content not in taken and content not in template]
    if not spare:
        raise UserError(f"tokenizer '{tokenizer.name_or_path}' has no spare special token for gist tokens: add "
                        f"'{GIST_TOKEN}' to it (tokenizer.add_special_tokens) or set dialogue.gist_tokens 0")
    return int(max(spare))


def insert_gists(ids: Sequence[int], mask: Sequence[float], ends: Sequence[int], k: int, gist_id: int
                 ) -> tuple[list[int], list[float], list[int]]:
    """(ids, mask, blocks) with k gist tokens inserted at each token index of `ends` (where an earlier assistant
    turn ends), the gist tokens untrained (mask 0); blocks: the column where each gist block starts."""
    out_ids, out_mask, blocks = [], [], []
    last = 0
    for end in sorted(ends):
        out_ids += ids[last:end]
        out_mask += mask[last:end]
        blocks.append(len(out_ids))
        out_ids += [gist_id] * k
        out_mask += [0.0] * k
        last = end
    out_ids += ids[last:]
    out_mask += mask[last:]
    return out_ids, out_mask, blocks


def first_keys(length: int, blocks: Sequence[int], k: int) -> list[int]:
    """Each token's first key: the start of the last gist block that ends before it (0 before any)."""
    out, block, current = [], 0, 0
    for i in range(length):
        while block < len(blocks) and blocks[block] + k <= i:
            current = blocks[block]
            block += 1
        out.append(current)
    return out


def attended_keys(first_key: Sequence[int], columns: Sequence[int]) -> float:
    """Mean keys a query attends at `columns` (q + 1 - first_key[q]): the attention's per-token cost."""
    return sum(q + 1 - first_key[q] for q in columns) / max(1, len(columns))


def row_keys(loss_mask_NT: torch.Tensor, first_key_NT: torch.Tensor | None = None) -> torch.Tensor:
    """float [N]: the mean keys each row's target tokens attend, q + 1 - first_key[q] (first key 0 without gist
    tokens; rows start at column 0): the attention's cost per answer token."""
    columns_NT = torch.arange(loss_mask_NT.shape[1], dtype=torch.float32)[None] + 1
    keys_NT = columns_NT - (0.0 if first_key_NT is None else first_key_NT.float())
    return (keys_NT * loss_mask_NT).sum(-1) / loss_mask_NT.sum(-1).clamp(min=1)


@torch.no_grad()
def compressed_logits(causal_lm, ids: Sequence[int], blocks: Sequence[int], k: int) -> torch.Tensor:
    """fp32 logits [T, V] of a gist row computed segment by segment, keeping only the last gist block's keys and
    values between segments (positions continued): the cost of a conversation of any length with K keys of
    history. Equal, to float precision, to the forward under the gist mask (`first_keys`)."""
    import inspect

    from transformers import DynamicCache

    device = next(causal_lm.parameters()).device
    # transformers renamed the KV-cache argument from past_key_values to cache (5.x); take what the model has
    cache_kwarg = "cache" if "cache" in inspect.signature(causal_lm.forward).parameters else "past_key_values"
    ends = [start + k for start in blocks] + [len(ids)]
    cache, begin, out = DynamicCache(), 0, []
    for end in ends:
        if end <= begin:
            continue
        kept = cache.get_seq_length()
        segment = torch.tensor([list(ids[begin:end])], device=device)
        positions = torch.arange(begin, end, device=device)[None]
        attention = torch.ones((1, kept + end - begin), dtype=torch.long, device=device)
        result = causal_lm(input_ids=segment, position_ids=positions, attention_mask=attention, use_cache=True,
                           **{cache_kwarg: cache})
        out.append(result.logits[0].float())
        _keep_last(cache, k)
        begin = end
    return torch.cat(out)


def _keep_last(cache, k: int) -> None:
    """Keep only the cache's last k positions (the gist block just fed) in every layer."""
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[:, :, -k:], layer.values[:, :, -k:]
