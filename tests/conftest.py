"""Shared test helpers: a tiny ChatML tokenizer and a tiny random Llama, built locally (no downloads)."""

from __future__ import annotations

import json
import multiprocessing.process
import os
import subprocess
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

# The tiers (README: Tests): a test that starts a process or a service is marked `process` and runs in
# `make test-process`; one that loads SmolLM2 is marked `slow`. The quick tier (`make test`) starts none: a test
# there that does is stopped at the start of its first child with the line below.
PROCESS_MARKERS = ("process", "slow", "gpu", "tinker", "vllm")
QUICK_TIER_CHILD = ("a test in the quick tier started a process ({}): mark it `process` (make test-process) "
                    "or do the work in this process")
_quick_test: list[str] = []  # the node id of the running quick-tier test, if one is running


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Note whether the running test (its fixtures included) may start processes."""
    quick = not any(item.get_closest_marker(name) for name in PROCESS_MARKERS)
    _quick_test[:] = [item.nodeid] if quick else []
    yield
    _quick_test.clear()


def _refuse_in_quick_tier(what: str) -> None:
    if _quick_test:
        pytest.fail(QUICK_TIER_CHILD.format(what), pytrace=False)


def _guard(cls: type, method: str, describe) -> None:
    original = getattr(cls, method)

    def guarded(self, *args, **kwargs):
        _refuse_in_quick_tier(describe(self, args, kwargs))
        return original(self, *args, **kwargs)

    setattr(cls, method, guarded)


def _command_line(_: subprocess.Popen, args: tuple, kwargs: dict) -> str:
    command = args[0] if args else kwargs.get("args")
    return (command if isinstance(command, str) else " ".join(map(str, command)))[:120]


def workers(config: pytest.Config) -> int:
    """How many pytest-xdist workers run the tests: 1 without xdist."""
    if "PYTEST_XDIST_WORKER_COUNT" in os.environ:  # in a worker
        return int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    asked = getattr(config.option, "numprocesses", None)
    return asked if isinstance(asked, int) and asked > 0 else (os.cpu_count() or 1) if asked else 1


def pytest_configure(config: pytest.Config) -> None:
    # matplotlib lists the system fonts with `fc-list` the first time it runs on a machine (a fresh clone's CI):
    # build its font cache here, before the guard, so a quick-tier report does not count as starting a process
    import matplotlib.font_manager  # noqa: F401

    _guard(subprocess.Popen, "__init__", _command_line)
    _guard(multiprocessing.process.BaseProcess, "start", lambda proc, *_: f"multiprocessing {proc.name}")
    # children get the thread budget of one worker: the cores shared among pytest-xdist's workers (set in the
    # controller too, whose environment the workers inherit)
    budget = str(max(1, (os.cpu_count() or 1) // workers(config)))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, budget)

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


def make_tiny_model_dir(path: str | Path, hidden_size: int = 32) -> Path:
    """Save a tiny random LlamaForCausalLM plus the tiny tokenizer into `path`; return the path. Its 4 attention
    heads are hidden_size / 4 wide (vLLM's CPU attention needs 32 or more)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    tokenizer = make_tiny_tokenizer()
    # a context of 2048 (no weights depend on it) holds every recipe's default longest sequence (sft.max_tokens
    # 1024), which runs check against the model's context
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=2 * hidden_size, max_position_embeddings=2048,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
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


@pytest.fixture(autouse=True)
def torch_threads(request: pytest.FixtureRequest):
    """The torch threads of the test process, set before every test (whatever the test before it set): one for
    the tiny models, which run several times faster on one thread than oversubscribed on a shared 2-core machine,
    with identical results; the worker's share of the cores for SmolLM2 (`slow`). Two pytest workers, or a test
    and the child it waits for, never fight over the cores."""
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]) if request.node.get_closest_marker("slow") else 1)
    yield


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


# The word the trained adapter answers every prompt with: one token of the tiny vocabulary, about 1/400 likely
# under the random base model and above 0.9 likely under the adapter after the answer's first token.
ADAPTER_WORD = " again"


def make_trained_adapter_dir(model_dir: str | Path, path: str | Path) -> Path:
    """Train a LoRA (q_proj, v_proj, lm_head; rank 4) on the tiny model until it answers any prompt with
    ADAPTER_WORD repeated, and save it into `path` as a plain PEFT adapter dir; return the path.

    Why trained: a fresh LoRA has B = 0 and computes exactly the base model, so a test that must tell
    "adapter loaded" from "adapter ignored" needs an adapter whose B is not zero and whose effect is large.
    Deterministic: fixed seeds, full-batch Adam, the same prompts every time.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    tokenizer = make_tiny_tokenizer()
    (word_id,) = tokenizer.encode(ADAPTER_WORD)
    generator = torch.Generator().manual_seed(0)
    prompts = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                              add_generation_prompt=True)) for text in _CORPUS]
    # random token strings too, so the adapter answers prompts it never saw (eval sets, arithmetic)
    for _ in range(24):
        length = int(torch.randint(3, 20, (1,), generator=generator))
        prompts.append(torch.randint(3, len(tokenizer), (length,), generator=generator).tolist())
    answer = [word_id] * 8
    width = max(len(p) for p in prompts) + len(answer)
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    attention, labels = torch.zeros_like(ids), torch.full_like(ids, -100)
    for i, p in enumerate(prompts):
        ids[i, :len(p) + len(answer)] = torch.tensor(p + answer)
        attention[i, :len(p) + len(answer)] = 1
        labels[i, len(p):len(p) + len(answer)] = word_id

    torch.manual_seed(0)  # PEFT draws the A matrices from the global generator
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "lm_head"])
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(model_dir)), lora)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(20):
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    path = Path(path)
    model.save_pretrained(str(path), save_embedding_layers=False)  # lm_head's base weights stay in the base
    return path


@pytest.fixture(scope="session")
def trained_adapter_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PEFT adapter dir on the tiny model that answers every prompt with ADAPTER_WORD (see above)."""
    return make_trained_adapter_dir(tiny_model_dir, tmp_path_factory.mktemp("trained_adapter"))


@pytest.fixture(scope="session")
def adapter_word_id() -> int:
    (word_id,) = make_tiny_tokenizer().encode(ADAPTER_WORD)
    return word_id


def invoke_cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`purplerl ARGS` in this process (typer's CliRunner), as a CompletedProcess: the exit code, stdout and stderr
    a child would give, without a child's seconds of imports. `env` is set for the call only. What only a real
    process shows (the console script, a signal, warnings printed at import) is tested in the process tier."""
    from typer.testing import CliRunner

    from purplerl.cli import app

    words = [str(a) for a in args]
    result = CliRunner().invoke(app, words, env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["purplerl", *words], result.exit_code, result.stdout, result.stderr)
