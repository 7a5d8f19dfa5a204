"""`purplerl.outputs`: which output dirs a command can write, decided before any work."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from purplerl.errors import UserError
from purplerl.outputs import check_output_dir, inside, output_dir_problem


def test_usable_dirs_have_no_problem(tmp_path: Path) -> None:
    assert output_dir_problem(tmp_path) is None  # an existing dir, written into again (a resumed eval)
    assert output_dir_problem(tmp_path / "a" / "b" / "c") is None  # created with its parents
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "real").mkdir()
    assert output_dir_problem(tmp_path / "link") is None  # a symlink to a dir is that dir
    assert output_dir_problem(tmp_path / "empty", fresh=True) is None


def test_a_file_or_a_symlink_that_leads_nowhere_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("mine")
    assert output_dir_problem(tmp_path / "file") == "is a file, not a directory: choose another path"
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    assert output_dir_problem(tmp_path / "dangling") == \
        f"is a symlink to {tmp_path / 'gone'}, which does not exist: choose another path"
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert output_dir_problem(tmp_path / "loop") == "is a symlink loop: choose another path"
    assert (tmp_path / "file").read_text() == "mine" and not (tmp_path / "gone").exists()


def test_a_parent_that_is_a_file_or_leads_nowhere_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert output_dir_problem(tmp_path / "file" / "sub" / "out") == \
        f"cannot be created: {tmp_path / 'file'} is a file, not a directory"
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    assert output_dir_problem(tmp_path / "dangling" / "out") == \
        f"cannot be created: {tmp_path / 'dangling'} is a symlink to {tmp_path / 'gone'}, which does not exist"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any directory")
def test_a_dir_this_user_cannot_write_into_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert output_dir_problem(locked) == "is a directory this user cannot write into: choose another path"
        assert output_dir_problem(locked / "out") == f"cannot be created: this user cannot write into {locked}"
    finally:
        locked.chmod(0o755)


def test_fresh_means_absent_or_empty(tmp_path: Path) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("")
    assert output_dir_problem(tmp_path / "used", fresh=True) == \
        "already exists and is not an empty dir: choose a new one"
    assert output_dir_problem(tmp_path / "used") is None


def test_entries_the_command_writes_must_be_of_their_kind(tmp_path: Path) -> None:
    (tmp_path / "eval.json").mkdir()
    (tmp_path / "generations").write_text("")
    (tmp_path / "report.html").symlink_to(tmp_path / "gone")
    assert output_dir_problem(tmp_path, files=["eval.json"]) == \
        "holds eval.json, a directory where this command writes a file: choose another path"
    assert output_dir_problem(tmp_path, dirs=["generations"]) == \
        "holds generations, a file where this command writes a directory: choose another path"
    assert output_dir_problem(tmp_path, files=["report.html"]) == \
        f"holds report.html, which is a symlink to {tmp_path / 'gone'}, which does not exist"
    assert output_dir_problem(tmp_path, files=["absent.json"], dirs=["absent"]) is None


def test_check_names_the_option_and_refuses_an_output_inside_an_input(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match=r"^--out .*file is a file, not a directory: choose another path$"):
        check_output_dir(tmp_path / "file", "--out")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    for out in (adapter, adapter / "merged"):
        with pytest.raises(UserError, match=rf"^--out {out} is inside {adapter}, which this command reads"):
            check_output_dir(out, "--out", inputs=[None, adapter])
    assert check_output_dir(tmp_path / "merged", "--out", inputs=[adapter]) == tmp_path / "merged"


def test_inside_follows_symlinks_and_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert inside(tmp_path / "alias" / "out", tmp_path / "real")
    assert not inside(tmp_path / "realistic", tmp_path / "real")  # a shared name prefix is not a parent
    monkeypatch.setenv("HOME", str(tmp_path))
    assert inside("~/real/x", tmp_path / "real")
    assert check_output_dir("~/new", "--out") == tmp_path / "new"
