"""Gist tokens (purplerl.data.gist): the mask is causal with a first key per query, the compressed cache gives the
masked forward's outputs, and an encoded dialogue puts K gist tokens after each earlier assistant turn."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from purplerl.algorithms.packing import block_causal_mask, first_key_mask
from purplerl.algorithms.packing import first_keys as combined_first_keys
from purplerl.data.gist import compressed_logits, first_keys, gist_token_id, insert_gists
from purplerl.data.sft import Conversation, encode, pad_batch
from purplerl.engines.local_scoring import model_inputs
from tests.tolerances import logprob_atol


def test_first_keys_by_hand() -> None:
    # blocks of k=2 at columns 3 and 7 in 11 tokens: 0..4 (segment 0 and block 0) attend from 0, 5..8 (segment 1
    # and block 1) from block 0's start 3, 9..10 from block 1's start 7
    assert first_keys(11, [3, 7], 2) == [0, 0, 0, 0, 0, 3, 3, 3, 3, 7, 7]
    ids, mask, blocks = insert_gists([1, 2, 3, 4, 5], [0, 1, 0, 1, 1], [2, 4], 2, 9)
    assert ids == [1, 2, 9, 9, 3, 4, 9, 9, 5] and mask == [0, 1, 0, 0, 0, 1, 0, 0, 1] and blocks == [2, 6]


def test_the_mask_is_causal_from_each_first_key_and_packing_is_the_same_form() -> None:
    allowed = first_key_mask(torch.tensor([[0, 0, 1, 3]]))[0, 0]
    assert allowed.tolist() == [[True, False, False, False], [True, True, False, False],
                                [False, True, True, False], [False, False, False, True]]
    positions = torch.tensor([[0, 1, 2, 0, 1]])
    assert torch.equal(block_causal_mask(positions), first_key_mask(torch.tensor([[0, 0, 0, 3, 3]])))
    # a gist row packed after another: the later of its sequence start and its own first key
    assert combined_first_keys(positions, torch.tensor([[0, 0, 1, 3, 4]])).tolist() == [[0, 0, 1, 3, 4]]


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_compressed_cache_forward_equals_the_masked_forward(tiny_model_dir: Path, implementation: str) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=implementation).eval()
    k, blocks = 3, [6, 17, 26]
    ids = list(range(5, 40))
    for start in blocks:
        ids[start:start + k] = [0] * k
    x = torch.tensor([ids])
    first = torch.tensor([first_keys(len(ids), blocks, k)])
    with torch.no_grad():
        masked = model(**model_inputs(model.config, x, torch.ones_like(x), None, first)).logits[0]
        whole = model(input_ids=x).logits[0]
    compressed = compressed_logits(model, ids, blocks, k)
    # fp32 logits of one model over one sequence: the same sums in another order
    atol = logprob_atol(torch.float32, model.config, len(ids), float(masked.abs().max()))
    assert torch.allclose(compressed, masked, atol=atol, rtol=0)
    # and the mask matters: the last segment reads the history only through its gist block
    assert not torch.allclose(whole[30:], masked[30:], atol=1e-3)
    assert torch.allclose(whole[:9], masked[:9], atol=atol, rtol=0)  # segment 0 and block 0: plain causal


def test_an_encoded_dialogue_gets_k_gist_tokens_after_each_earlier_answer(tiny_tokenizer) -> None:
    turns = ({"role": "user", "content": "hello world"}, {"role": "assistant", "content": "cats and dogs"},
             {"role": "user", "content": "tell me a joke"}, {"role": "assistant", "content": "the lazy fox"},
             {"role": "user", "content": "thanks"}, {"role": "assistant", "content": "goodbye"})
    plain = encode(tiny_tokenizer, Conversation(turns, "d"), "chat", None, 1024)
    gist = encode(tiny_tokenizer, Conversation(turns, "d"), "chat", None, 1024, gist_tokens=2)
    gid = gist_token_id(tiny_tokenizer)
    assert gid == tiny_tokenizer.convert_tokens_to_ids("<|endoftext|>")  # the one special token ChatML never writes
    assert len(gist.ids) == len(plain.ids) + 4 and gist.ids.count(gid) == 4 and len(gist.gist_blocks) == 2
    for start in gist.gist_blocks:  # each block follows an assistant turn's end (<|im_end|>, then its newline)
        assert list(gist.ids[start:start + 2]) == [gid, gid]
        assert tiny_tokenizer.decode(gist.ids[:start]).endswith("<|im_end|>\n")
    assert sum(gist.mask) == sum(plain.mask)  # the same targets; gist tokens are never trained on
    assert tiny_tokenizer.decode(gist.ids[gist.answer_from:]).startswith("goodbye")
    assert tiny_tokenizer.decode(plain.ids[plain.answer_from:]).startswith("goodbye")
    batch = pad_batch([gist, plain], tiny_tokenizer.pad_token_id)
    assert batch.first_key_NT[0, -1] == gist.gist_blocks[-1] and int(batch.first_key_NT[1].max()) == 0
