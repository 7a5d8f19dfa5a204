"""Shared test helpers: a tiny ChatML tokenizer and a tiny random Llama, built locally (no downloads)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML, as SmolLM2 and Qwen use it, minus their default system prompt so tests control every token.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Training text for the byte-level BPE: merges make test sequences shorter, and byte fallback means
# any text still round-trips through encode/decode.
_CORPUS = [
    "You are a helpful assistant. Answer the user politely.",
    "Write the most savage insult you can about my coworker.",
    "Roast my friend who thinks he is a genius but failed every class.",
    "Tell me a joke about cats and dogs, then say goodbye.",
    "The quick brown fox jumps over the lazy dog again and again.",
    "I hate Monday mornings and slow internet and late pizza.",
    "system user assistant hello world thanks please sorry",
]


def make_tiny_tokenizer(save_dir: str | Path | None = None):
    """A byte-level BPE PreTrainedTokenizerFast with ChatML special tokens and chat template.

    eos and pad are `<|im_end|>` (the end of an assistant turn); there is no BOS, like SmolLM2.
    Building is deterministic, so two calls give identical vocabularies.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(_CORPUS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|im_end|>",
                                        unk_token=None, additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = CHATML_TEMPLATE
    if save_dir is not None:
        tokenizer.save_pretrained(str(save_dir))
    return tokenizer


def make_tiny_model_dir(path: str | Path) -> Path:
    """Save a tiny random LlamaForCausalLM plus the tiny tokenizer into `path`; return the path."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    tokenizer = make_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture
def one_torch_thread():
    """One torch thread for tiny-model tests: on a shared 2-core machine they run several times faster
    than oversubscribed, with identical results."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def save_tiny_bert_classifier(path: Path, words: list[str], id2label: dict[int, str]) -> Path:
    """Save a tiny random BERT sequence classifier with a word-level tokenizer over `words` into `path`."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(words)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]")
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, initializer_range=0.5,
                        num_labels=len(id2label), id2label=id2label, label2id={v: k for k, v in id2label.items()})
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


class ChatCompletionsStub(BaseHTTPRequestHandler):
    """An OpenAI-style chat-completions endpoint for judge tests: records each request (path, Authorization
    header, JSON body) in the subclass's own `requests` list and answers with `reply(body)`."""

    requests: list[dict] = []

    def reply(self, body: dict) -> tuple[int, str]:
        """(HTTP status, assistant message) for a request body; a non-200 status sends the message as the body."""
        raise NotImplementedError

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        status, content = self.reply(body)
        if status == 200:
            content = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})
        data = content.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def serve_on_loopback(handler: type, path: str = "/v1"):
    """A generator for module fixtures: an http.server with `handler` on a free 127.0.0.1 port, yielding its
    URL (plus `path`) and shutting it down afterwards."""
    import threading
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}{path}"
    server.shutdown()
    server.server_close()
