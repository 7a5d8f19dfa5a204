"""The helpers every layer shares, each with one home: errors.first_line, files.looks_local,
devices.resolve_device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from purplerl.devices import resolve_device
from purplerl.errors import UserError, first_line
from purplerl.files import looks_local


def test_first_line_of_an_error_or_a_text() -> None:
    assert first_line(ValueError("  bad shape\n  at layer 3\n")) == "bad shape"
    assert first_line(KeyError()) == "KeyError"  # an empty message names the error instead
    assert first_line(OSError("")) == "OSError"
    assert first_line("server said no\ndetails") == "server said no"
    assert first_line("   \n ") == ""  # a blank text stays blank: the caller picks its fallback


@pytest.mark.parametrize(("name", "local"), [
    ("/abs/model", True), ("./model", True), ("../model", True), ("~/model", True), (".hidden", True),
    ("org/name/sub", True),  # a hub id has one slash: more is a path
    ("org/name", False), ("gpt2", False), ("hf-internal-testing/tiny-random-gpt2", False),
])
def test_looks_local_by_syntax(name: str, local: bool) -> None:
    assert looks_local(name) is local


def test_an_existing_bare_name_is_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert not looks_local("org/name")
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert looks_local("org/name")


def test_resolve_device_returns_a_torch_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        for name in ("cuda", "cuda:1"):
            with pytest.raises(UserError, match=f"device '{name}' requested but no CUDA device is available"):
                resolve_device(name)
    with pytest.raises(UserError, match="unknown device 'tpu'"):
        resolve_device("tpu")
