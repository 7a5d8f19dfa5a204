"""The paths a command writes, checked before it does any work.

Every command that writes a directory (eval --out, export --out, tamper-test --out, data prepare --out, verl
export --out, align --out, a run dir, a report into a run dir) checks it with `check_output_dir` before a model
loads or a file is written. Otherwise a path that can never be written fails as an OSError traceback raised by the
first write, after minutes of work (`eval --out FILE` failed once the model had loaded and sampled). Refused: an
existing file, a symlink that leads nowhere (dangling, or a loop), a parent that is a file or leads nowhere, a
directory this user cannot write into, an entry inside the directory that the command writes as a file but is a
directory (or the reverse), and a directory inside an input the command reads (writing there changes that input).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

from purplerl.errors import UserError

_ADVICE = "choose another path"


def _leads_nowhere(path: Path) -> str | None:
    """Why the symlink `path` cannot be followed, or None when it is no symlink or leads somewhere."""
    if not path.is_symlink():
        return None
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symlink loop"
        return f"is a symlink to {os.readlink(path)}, which does not exist"
    return None


def _writable(directory: Path) -> bool:
    # access(2) also answers EROFS for a read-only file system, which a mode bit would not show
    return os.access(directory, os.W_OK | os.X_OK)


def _existing_dir_problem(path: Path, fresh: bool) -> str | None:
    if not path.is_dir():
        return f"is a file, not a directory: {_ADVICE}"
    if fresh and any(path.iterdir()):
        return "already exists and is not an empty dir: choose a new one"
    if not _writable(path):
        return f"is a directory this user cannot write into: {_ADVICE}"
    return None


def _creatable_problem(path: Path) -> str | None:
    """Why the missing dir `path` cannot be created: the nearest ancestor that exists must be a writable dir."""
    for parent in path.absolute().parents:
        if not os.path.lexists(parent):
            continue
        nowhere = _leads_nowhere(parent)
        if nowhere:
            return f"cannot be created: {parent} {nowhere}"
        if not parent.is_dir():
            return f"cannot be created: {parent} is a file, not a directory"
        if not _writable(parent):
            return f"cannot be created: this user cannot write into {parent}"
        return None
    return None


def _entry_problem(path: Path, is_dir: bool) -> str | None:
    """Why an entry the command writes inside its output dir is in the way, or None (absent entries are fine)."""
    nowhere = _leads_nowhere(path)
    if nowhere:
        return f"holds {path.name}, which {nowhere}"
    if not path.exists():
        return None
    if is_dir and not path.is_dir():
        return f"holds {path.name}, a file where this command writes a directory: {_ADVICE}"
    if not is_dir and path.is_dir():
        return f"holds {path.name}, a directory where this command writes a file: {_ADVICE}"
    if is_dir and not _writable(path):
        return f"holds {path.name}, a directory this user cannot write into: {_ADVICE}"
    return None


def output_dir_problem(path: str | Path, *, fresh: bool = False, files: Iterable[str] = (),
                       dirs: Iterable[str] = ()) -> str | None:
    """Why a command cannot write the directory `path`, or None when it can. `fresh`: the command builds the dir
    anew, so an existing one must be empty. `files` and `dirs` name the entries it writes inside."""
    path = Path(path).expanduser()
    try:
        nowhere = _leads_nowhere(path)
        if nowhere:
            return f"{nowhere}: {_ADVICE}"
        if not path.exists():
            return _creatable_problem(path)
        problem = _existing_dir_problem(path, fresh)
        if problem:
            return problem
        entries = [(name, False) for name in files] + [(name, True) for name in dirs]
        return next((p for name, is_dir in entries if (p := _entry_problem(path / name, is_dir))), None)
    except OSError as err:  # a parent this user may not even look into
        return f"cannot be checked ({err.strerror}): {_ADVICE}"


def inside(path: str | Path, other: str | Path) -> bool:
    """Whether `path` is `other` or lies under it, symlinks followed."""
    path, other = Path(path).expanduser().resolve(), Path(other).expanduser().resolve()
    return path == other or other in path.parents


def check_output_dir(path: str | Path, what: str, *, fresh: bool = False, files: Iterable[str] = (),
                     dirs: Iterable[str] = (), inputs: Iterable[str | Path | None] = ()) -> Path:
    """`path`, user-expanded, when a command can write its output dir there; else a one-line UserError naming
    `what` (the option or setting the path came from). `inputs` are the dirs and files the command reads: the
    output must not lie inside one of them."""
    out = Path(path).expanduser()
    problem = output_dir_problem(out, fresh=fresh, files=files, dirs=dirs)
    if problem:
        raise UserError(f"{what} {out} {problem}")
    for source in inputs:
        if source is not None and inside(out, source):
            raise UserError(f"{what} {out} is inside {source}, which this command reads: {_ADVICE}")
    return out


def make_output_dir(path: Path) -> None:
    """Create the output dir `path` (and its parents) once its contents are ready to write; a one-line UserError
    where the file system refuses."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot create output directory {path}: {err.strerror}") from err
