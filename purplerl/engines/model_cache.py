"""The models purplerl builds once and caches under $PURPLERL_CACHE/models (the GGUF conversion, `purplerl align`,
any model registered with `register_derived_model`): sealed with a manifest, checked when loaded, built under a lock.

A cache entry is built in a temporary sibling dir; `seal_entry` writes `purplerl_manifest.json` (the size and
SHA-256 of every file) into it and only then moves it into place, so a half-built entry never has a valid
manifest. `verify_entry` compares the files with their manifest once per process (hashing the 270 MB SmolLM2 takes
about a second): a truncated or overwritten weights file would otherwise load as garbage, or fail with a page of
safetensors traceback. A damaged entry is moved out of place and removed, and the error says the next use rebuilds
it: a model known to be corrupt is never loaded, and a disk that damaged one file is worth a look before building
on it again.

An entry built before manifests existed cannot be checked against anything: its safetensors files are checked for
being whole (their header says how many bytes follow), and its files as they are now are recorded with a one-line
notice. Those builds were already atomic, so only damage after the build can hide there, and the notice says how
to rebuild.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from purplerl.errors import ExperimentError, UserError
from purplerl.files import replace_dir_durably, write_durably, write_synced
from purplerl.locks import hold

MANIFEST = "purplerl_manifest.json"
# Entries checked by this process (resolved paths): a second load of the same model does not hash it again.
_VERIFIED: set[str] = set()


def to_stderr(line: str) -> None:
    """Where a build's progress goes by default: stdout belongs to the command's results."""
    print(line, file=sys.stderr, flush=True)


# the sampler's packed-weight measurements (engines/packed_linear.py), which `purplerl doctor` reads without torch
PACKED_CACHE = "machine/packed-linear.json"


def cache_dir() -> Path:
    """$PURPLERL_CACHE (default ~/.cache/purplerl): where models are built and cached. One UserError when it, or
    the nearest of its parents that exists, is no directory (a file, a symlink that leads nowhere): the first
    mkdir under it failed with a 70-line traceback."""
    path = Path(os.environ.get("PURPLERL_CACHE", Path.home() / ".cache" / "purplerl")).expanduser()
    for part in (path, *path.parents):
        if not os.path.lexists(part):
            continue
        if not part.is_dir():  # follows a symlink: a dangling one is no dir either
            what = "a file" if part.exists() else f"a symlink to {os.readlink(part)}, which leads nowhere"
            whose = "it is" if part == path else f"{part} is"
            raise UserError(f"PURPLERL_CACHE {path} cannot hold the model cache ({whose} {what}): name a directory")
        break
    return path


@contextmanager
def build_lock(path: Path, what: str, notify: Callable[[str], None] = to_stderr) -> Iterator[None]:
    """Hold an exclusive lock on `path` while building `what`: a second process waits for the first build instead
    of racing it, and says once that it waits (a build can take minutes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with hold(path, f"the build of {what}", waiting=f"waiting for another process that is building {what}",
              notify=notify):
        yield


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def manifest_of(entry: Path) -> dict[str, dict[str, int | str]]:
    """{relative path: {"size", "sha256"}} for every file under `entry` but the manifest itself."""
    files = sorted(p for p in entry.rglob("*") if p.is_file() and p.name != MANIFEST)
    return {p.relative_to(entry).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p)} for p in files}


def _manifest_text(entry: Path) -> str:
    return json.dumps({"version": 1, "files": manifest_of(entry)}, indent=1)


def seal_entry(tmp: Path, target: Path) -> None:
    """Write the manifest into the finished build dir `tmp`, then move `tmp` onto `target` (replace_dir_durably)."""
    write_synced(tmp / MANIFEST, _manifest_text(tmp))
    replace_dir_durably(tmp, target)
    _VERIFIED.add(str(target.resolve()))


def has_manifest(entry: Path) -> bool:
    return (entry / MANIFEST).is_file()


def _recorded(entry: Path) -> dict[str, dict] | None:
    """The manifest's files, or None when the manifest itself is unreadable or malformed."""
    try:
        files = json.loads((entry / MANIFEST).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    ok = isinstance(files, dict) and all(isinstance(v, dict) and {"size", "sha256"} <= v.keys() for v in files.values())
    return files if ok else None


def manifest_problem(entry: Path, hashes: bool = True) -> str | None:
    """How the files of `entry` differ from its manifest (the first difference), or None when they all match.
    Sizes are compared before anything is hashed, so a truncated file is found at once; `hashes` False stops
    there (what `purplerl doctor` checks without --verify: hashing the cache takes seconds)."""
    recorded = _recorded(entry)
    if recorded is None:
        return f"{MANIFEST} is unreadable"
    for name, want in recorded.items():
        path = entry / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != want["size"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {want['size']}"
    for name, want in recorded.items() if hashes else ():
        if file_sha256(entry / name) != want["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest"
    return None


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is not whole (its header is cut or promises another length), or None. The check
    that an entry without a manifest can have: it finds truncation, not overwritten bytes."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else size
        if length > size - 8:
            return f"{path.name} is cut short ({size} bytes)"
        try:
            header = json.loads(f.read(length))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return f"{path.name} has an unreadable header"
    if 8 + length + end != size:
        return f"{path.name} has {size} bytes, its header says {8 + length + end}"
    return None


def _remove_damaged(entry: Path) -> None:
    """Move the entry out of place in one rename, then delete it: a kill during the delete never leaves a
    config.json that would pass for a built entry."""
    aside = entry.with_name(f"{entry.name}.{os.getpid()}-{secrets.token_hex(4)}.damaged.tmp")
    try:
        os.rename(entry, aside)
    except FileNotFoundError:  # another process found the damage first and removed it
        return
    shutil.rmtree(aside, ignore_errors=True)


def _damaged(entry: Path, name: str, problem: str) -> ExperimentError:
    _VERIFIED.discard(str(entry.resolve()))
    _remove_damaged(entry)
    return ExperimentError(f"cached model '{name}' at {entry} was damaged ({problem}): removed it; the next use "
                           "rebuilds it")


def _adopt(entry: Path, name: str, notify: Callable[[str], None]) -> None:
    """Record the manifest of an entry built before manifests existed, after checking what can be checked."""
    problem = next(filter(None, map(safetensors_problem, sorted(entry.rglob("*.safetensors")))), None)
    if problem:
        raise _damaged(entry, name, problem)
    try:
        write_durably(entry / MANIFEST, _manifest_text(entry))
    except OSError as err:
        raise UserError(f"cannot write {entry / MANIFEST}: {err.strerror}") from None
    notify(f"cached model '{name}' at {entry} had no manifest (built by an older purplerl): recorded its files "
           "now; delete that dir to rebuild it if it may have been damaged before")


def verify_entry(entry: Path, name: str, notify: Callable[[str], None] = to_stderr) -> None:
    """Check the cache entry `entry` of model `name` against its manifest, once per process. A mismatch removes the
    entry and is one ExperimentError; an entry without a manifest is adopted (see the module docstring)."""
    key = str(entry.resolve())
    if key in _VERIFIED:
        return
    if not has_manifest(entry):
        _adopt(entry, name, notify)
    else:
        try:
            problem = manifest_problem(entry)
        except OSError as err:  # e.g. another process removed the damaged entry while this one was reading it
            problem = f"cannot read it: {err.strerror}"
        if problem:
            raise _damaged(entry, name, problem)
    _VERIFIED.add(key)


def cache_entries(hashes: bool = False) -> list[tuple[str, int, str]]:
    """(name, bytes, state) of each built model under the cache's models/ dir: 'verified' (its files match the
    manifest: sizes, and SHA-256 too with `hashes`), 'sizes match' (not hashed), 'damaged: ...', or 'no manifest'
    (built before manifests; checked for truncation when loaded). Lock files and unfinished builds are skipped."""
    models = cache_dir() / "models"
    out = []
    for entry in sorted(models.iterdir()) if models.is_dir() else ():
        if not entry.is_dir() or entry.name.endswith(".tmp"):
            continue
        size = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
        if not has_manifest(entry):
            state = "no manifest"
        else:
            problem = manifest_problem(entry, hashes)
            state = f"damaged: {problem}" if problem else ("verified" if hashes else "sizes match")
        out.append((entry.name, size, state))
    return out
