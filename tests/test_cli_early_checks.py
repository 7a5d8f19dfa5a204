"""Output paths and adapters are checked before any work starts: in a subprocess, each mistake is one line on
stderr, a non-zero exit, no traceback, and nothing written (tiny models, no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli import Launched, assert_one_line_error, cli_env

from tests.conftest import make_tiny_model_dir

pytestmark = pytest.mark.process

FAST_EVAL = ["--suite", "diversity", "--limit", "2", "--n", "1", "--max-new-tokens", "4", "--device", "cpu"]
FAST_RUN = ["--steps", "1", "--batch_size", "2", "--group_size", "2", "--max_new_tokens", "4",
            "--logging.progress", "false", "--device", "cpu"]


def _save_lora(model_dir: Path, path: Path) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A LoRA of the tiny model, and one of a tiny model with twice its hidden size (which cannot fit it)."""
    root = tmp_path_factory.mktemp("early_adapters")
    wide = make_tiny_model_dir(root / "wide_model", hidden_size=64)
    return {"fits": _save_lora(tiny_model_dir, root / "fits"), "wide": _save_lora(wide, root / "wide")}


def test_bad_outputs_and_misfit_adapters_fail_before_any_work(tiny_model_dir: Path, adapters: dict[str, Path],
                                                              tmp_path: Path) -> None:
    model = ["--model", tiny_model_dir]
    existing_file = tmp_path / "eval.out"
    existing_file.write_text("mine\n")
    dangling = tmp_path / "merged"
    dangling.symlink_to(tmp_path / "nowhere")
    outs = {name: tmp_path / name for name in ("eval-misfit", "tamper-misfit", "runs-misfit")}
    (tmp_path / "runs-file").write_text("")
    cases = {
        "eval-out-file": (["eval", *model, "--out", existing_file, *FAST_EVAL],
                          f"--out {existing_file} is a file, not a directory"),
        "export-dangling": (["export", "--merge", adapters["fits"], "--out", dangling],
                            f"--out {dangling} is a symlink to {tmp_path / 'nowhere'}, which does not exist"),
        "eval-misfit": (["eval", *model, "--checkpoint", adapters["wide"], "--out", outs["eval-misfit"], *FAST_EVAL],
                        f"--checkpoint {adapters['wide']} does not fit model '{tiny_model_dir}' (hidden size 32"),
        "tamper-misfit": (["tamper-test", "--adapter", adapters["wide"], *model, "--out", outs["tamper-misfit"],
                           *FAST_RUN], f"--adapter {adapters['wide']} does not fit model"),
        "attack-misfit": (["attack", *model, "--init_adapter", adapters["wide"], "--output_dir",
                           outs["runs-misfit"], *FAST_RUN], f"model.init_adapter {adapters['wide']} does not fit"),
        "attack-output-file": (["attack", *model, "--output_dir", tmp_path / "runs-file", *FAST_RUN],
                               f"cannot be created: {tmp_path / 'runs-file'} is a file, not a directory"),
        # before the dataset is fetched (offline here: its error would come first otherwise)
        "prepare-out-file": (["data", "prepare", "gsm8k", "--out", existing_file],
                             f"--out {existing_file} is a file, not a directory"),
    }
    launched = Launched(cli_env(tmp_path / "cache"))
    try:
        for name, (args, _) in cases.items():
            launched.start(name, *args)
        lines = {name: assert_one_line_error(launched.result(name)) for name in cases}
    finally:
        launched.close()
    for name, (_, needle) in cases.items():
        assert needle in lines[name], (name, lines[name])
    assert existing_file.read_text() == "mine\n"
    assert dangling.is_symlink() and not (tmp_path / "nowhere").exists()
    for name, out in outs.items():
        # no generations, no utility.json or merged model, no run dir: the check came before any of that work
        assert not out.exists(), (name, sorted(out.rglob("*")))
