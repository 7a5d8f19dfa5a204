"""`purplerl doctor`, `--version` and the CPU's kind: what a user pastes into a bug report, read without torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from purplerl import __version__
from purplerl.devices import cpu_kind
from purplerl.engines.model_cache import MANIFEST, seal_entry
from tests.conftest import invoke_cli

FLAGS = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 {extra}\nbugs\t\t: spectre\n"


@pytest.mark.parametrize(("extra", "kind"), [
    ("avx512f avx512_bf16 amx_tile amx_bf16", "amx"),
    ("avx512f avx512_bf16", "avx512_bf16"),
    ("avx512f", "avx2"),
    ("", "avx2"),
])
def test_cpu_kind_is_the_fastest_matmul_isa_the_flags_list(extra: str, kind: str) -> None:
    assert cpu_kind(FLAGS.format(extra=extra)) == kind
    # a flag's name inside another line (bugs, model name) is no flag
    assert cpu_kind("flags\t: fpu sse2\nbugs\t: amx_bf16 avx512_bf16 avx2\n") == "baseline"
    assert cpu_kind("") == "baseline"


def _entry(models: Path, name: str, files: dict[str, bytes], sealed: bool = True) -> Path:
    build = models / f"{name}.build"
    build.mkdir(parents=True)
    for file, data in files.items():
        (build / file).write_bytes(data)
    target = models / name
    if sealed:
        seal_entry(build, target)
    else:
        build.rename(target)
    return target


def test_doctor_lists_the_machine_and_checks_the_model_cache(tmp_path: Path) -> None:
    models = tmp_path / "cache" / "models"
    _entry(models, "whole", {"model.safetensors": b"x" * 3000, "config.json": b"{}"})
    cut = _entry(models, "cut", {"model.safetensors": b"y" * 2000})
    (cut / "model.safetensors").write_bytes(b"y" * 10)
    flipped = _entry(models, "flipped", {"model.safetensors": b"z" * 2000})
    (flipped / "model.safetensors").write_bytes(b"q" * 2000)  # same size, other bytes: only a hash finds it
    _entry(models, "old", {"config.json": b"{}"}, sealed=False)
    (models / "half.123.tmp").mkdir()  # a build in progress
    (models / "whole.lock").write_text("")
    env = {"PURPLERL_CACHE": str(tmp_path / "cache")}

    done = invoke_cli("doctor", env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"purplerl {__version__}, Python ")
    assert lines[1].startswith(f"CPU: {os.cpu_count()} cores, kind {cpu_kind()} (bf16 matmuls ")
    assert lines[2].startswith("GPU: ") and "torch " in lines[2]
    assert "backend ray: " in done.stdout and "backend vllm: " in done.stdout
    cache = lines[lines.index(f"model cache: {tmp_path / 'cache'}") + 1:]
    assert cache == ["  cut: 0 MiB, damaged: model.safetensors has 10 bytes, the manifest says 2000",
                     "  flipped: 0 MiB, sizes match", "  old: 0 MiB, no manifest", "  whole: 0 MiB, sizes match",
                     "  (files checked by size; --verify hashes them, as loading a model does)"]
    verified = invoke_cli("doctor", "--verify", env=env).stdout
    assert "  flipped: 0 MiB, damaged: model.safetensors does not match its SHA-256 in the manifest" in verified
    assert "  whole: 0 MiB, verified" in verified and (models / "whole" / MANIFEST).is_file()


def test_doctor_says_an_empty_cache_and_a_bad_one_in_one_line(tmp_path: Path) -> None:
    assert "model cache: " in (out := invoke_cli("doctor", env={"PURPLERL_CACHE": str(tmp_path)}).stdout)
    assert out.rstrip().endswith("  (empty)")
    (tmp_path / "file").write_text("")
    bad = invoke_cli("doctor", env={"PURPLERL_CACHE": str(tmp_path / "file")})
    assert bad.returncode == 2 and bad.stderr.startswith("error: PURPLERL_CACHE ") and bad.stderr.count("\n") == 1


def test_version() -> None:
    done = invoke_cli("--version")
    assert (done.returncode, done.stdout) == (0, f"purplerl {__version__}\n")


@pytest.mark.process
def test_doctor_imports_no_torch_or_backend() -> None:
    """A fresh interpreter: doctor answers without loading torch, transformers or any engine's backend."""
    child = ("import sys\nfrom typer.testing import CliRunner\nfrom purplerl.cli import app\n"
             "r = CliRunner().invoke(app, ['doctor'])\nassert r.exit_code == 0, r.output\n"
             "heavy = ('torch', 'transformers', 'peft', 'vllm', 'ray', 'datasets')\n"
             "print(sorted(m for m in heavy if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_doctor_shows_what_the_sampler_measured_for_packed_weights(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import purplerl.engines.packed_linear as packed_linear

    monkeypatch.setenv("PURPLERL_CACHE", str(tmp_path))
    timings = {32: packed_linear.PackTiming(0.0321, 0.0236, 0.07), 8: packed_linear.PackTiming(0.0200, 0.0195, 0.07)}
    monkeypatch.setattr(packed_linear, "measure", lambda linears, rows: timings[rows])
    layers = [torch.nn.Linear(8, 8).to(torch.bfloat16)]
    for rows in (32, 8):  # written as the engine writes them
        packed_linear.machine_timing(layers, rows)
    lines = invoke_cli("doctor", env={"PURPLERL_CACHE": str(tmp_path)}).stdout.splitlines()
    shown = [line for line in lines if line.startswith("packed decode")]
    assert shown == [f"packed decode at 8 rows: 20.0 -> 19.5 ms per token, not used (torch {torch.__version__})",
                     f"packed decode at 32 rows: 32.1 -> 23.6 ms per token, used (torch {torch.__version__})"]
    (tmp_path / "machine" / "packed-linear.json").write_text("[1, 2")  # damaged: nothing shown, no traceback
    assert "packed decode" not in invoke_cli("doctor", env={"PURPLERL_CACHE": str(tmp_path)}).stdout
