"""Reading the text, JSON and JSONL files users and runs hand to purplerl, writing files durably, and naming
files after data.

Every reader here fails with one `UserError` that names the file and the line: bytes that are not UTF-8,
text that is not JSON, a JSONL line that is not an object. Lines are split on b"\\n" only, so a JSON
string holding U+2028 or U+0085 (valid JSON, and what other tools write) stays one row.

File names built from data (metric keys, target labels) go through `safe_file_stem`, so no key can name a
path outside the directory it is written to; a name the user chooses for a directory is checked by
`plain_name_problem` and refused, never changed.

YAML is parsed by `parse_yaml`: aliases may share a value, but a document whose aliases expand past
MAX_YAML_NODES values ("billion laughs": 1 KB that grows to gigabytes when copied) or past MAX_YAML_CHARS
characters of text (a "string bomb": one 100 KB string aliased 100,000 times) or refer to themselves is refused
from its composed node graph, before any value is built, and so is a text longer than MAX_YAML_CHARS, a document
of more than MAX_YAML_NODES values, and nesting deeper than the parser's recursion allows.

Every file purplerl replaces (a run's config.yaml, summary.json, a cut log, a cached model's config) goes
through `write_durably`, and every directory it builds aside and moves into place (a checkpoint, a merged or
cached model) through `replace_dir_durably`: a kill or a power loss at any moment leaves the old version or the
new one, never a mix, and a full disk is an OSError at the write, not a silently empty file later.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from purplerl.errors import UserError, first_line

# Plain names: what a directory name may be without quoting in a shell or escaping its parent.
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=,@-]*")
MAX_NAME_CHARS = 128  # well under every file system's 255-byte limit on one path component
_STEM_CHAR = re.compile(r"[^A-Za-z0-9_.-]")
_BOM = "\ufeff"
_BLANK = object()


def fsync_path(path: str | Path) -> None:
    """Flush a file's data, or a directory's entries, to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: str | Path, data: bytes | str) -> None:
    """Write `data` to `path` in place and fsync it, so errors (ENOSPC included) surface here as OSError.
    For a file inside a directory that is moved into place afterwards; any other file: `write_durably`."""
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())


def write_durably(path: str | Path, data: bytes | str) -> None:
    """Replace `path` by `data` (str: UTF-8) atomically and durably: a temporary file in the same directory is
    written and fsynced, renamed onto `path`, and the directory fsynced, so that a reader or a restart after a
    kill or power loss sees the old content or the new, never part of it. The temporary name is unique, so two
    processes writing the same file never write into one temporary."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    # O_EXCL with mode 0o666: a fresh file with the umask's permissions, as open(path, "w") would create
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def replace_dir_durably(tmp_dir: str | Path, target: str | Path) -> None:
    """Move the finished directory `tmp_dir` onto `target` (absent, or an empty dir) in one rename, after every
    file and directory under it is fsynced; the parent is fsynced after the rename. `tmp_dir` must sit in
    `target`'s parent directory (one file system). OSError when `target` holds something: the caller decides."""
    tmp_dir, target = Path(tmp_dir), Path(target)
    dirs = [tmp_dir]
    for path in sorted(tmp_dir.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            dirs.append(path)
        elif path.is_file() and not path.is_symlink():
            fsync_path(path)
    for directory in sorted(dirs, key=lambda d: len(d.parts), reverse=True):
        fsync_path(directory)
    os.rename(tmp_dir, target)  # for directories the same call as os.replace on POSIX
    fsync_path(target.parent)


def plain_name_problem(name: str) -> str | None:
    """Why `name` is not a plain directory name (one path component, no surprises), or None when it is."""
    if name in (".", ".."):
        return f"must be a plain name, not '{name}'"
    if "/" in name or "\\" in name:
        return "must be a plain name without path separators (choose the parent directory with run.output_dir)"
    if len(name) > MAX_NAME_CHARS or not PLAIN_NAME.fullmatch(name):
        return (f"must be 1-{MAX_NAME_CHARS} letters, digits and _ . + = , @ - "
                "starting with a letter, digit or _")
    return None


def looks_local(name: str) -> bool:
    """Whether a model or dataset name means a path on this machine rather than a hub id (ORG/NAME).

    Path syntax (`/`, `.`, `~` first, or more than the one slash of ORG/NAME) always means a path, so a
    missing directory is reported as missing instead of being looked up on the hub; a bare name is a path
    when it exists, as transformers and datasets read it too."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or Path(name).expanduser().exists()


DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")  # the data files purplerl.data.sources reads


def absolute_source(source: str) -> str:
    """A data source that names a path on this machine (`hf:PATH` too), made absolute: a run records where its data
    is, so its resume, or a sweep's run, started from another working directory reads the same file, not one of the
    same name there (issue 34). Built-in sets, hub ids, URLs and bare words that name no path (refused by the
    reader as they are) are kept as given."""
    if source.startswith("builtin:") or "://" in source or not source.strip():
        return source
    if not source.startswith("hf:") and not looks_local(source) and Path(source).suffix not in DATA_FILE_SUFFIXES:
        return source
    if source.startswith("hf:"):
        name = source.removeprefix("hf:")
        return f"hf:{Path(name).expanduser().absolute()}" if looks_local(name) else source
    return str(Path(source).expanduser().absolute())  # '..' kept: past a symlink it is not the lexical parent


def unicode_problem(text: str) -> str | None:
    """Why `text` cannot be encoded as UTF-8, or None. JSON's "\\ud800" escape and non-UTF-8 bytes on a
    command line (which Python keeps as surrogates) give strings that tokenizers and file writes reject."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return (f"holds {text[err.start]!r} at character {err.start + 1}, a lone surrogate that is no character "
                "(bytes that are not UTF-8, or a broken \\u escape)")
    return None


def safe_file_stem(text: str) -> str:
    """A file name stem for `text` that stays inside its directory: `text` itself when it is already safe,
    else its safe characters plus a short hash of `text`, so two different texts never share a file."""
    if text and len(text) <= 100 and not _STEM_CHAR.search(text) and not text.startswith("."):
        return text
    cleaned = _STEM_CHAR.sub("_", text)[:80].lstrip(".") or "_"
    return f"{cleaned}-{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:10]}"


def _not_utf8(path: Path, lineno: int, byte: int, column: int) -> UserError:
    return UserError(f"{path}:{lineno}: line {lineno} is not UTF-8 text (byte 0x{byte:02x} at column {column}); "
                     "save the file as UTF-8")


def _decode(raw: bytes, path: Path, lineno: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _not_utf8(path, lineno, raw[err.start], err.start + 1) from None


def read_text(path: str | Path) -> str:
    """The whole file as text; bytes that are not UTF-8 give a UserError naming the file and line."""
    path = Path(path)
    data = _read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        lineno, line_start = data.count(b"\n", 0, err.start) + 1, data.rfind(b"\n", 0, err.start) + 1
        raise _not_utf8(path, lineno, data[err.start], err.start - line_start + 1) from None


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"file not found: {path}") from None
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror}") from None


def read_json(path: str | Path) -> Any:
    """One JSON document; bad UTF-8 or bad JSON give a UserError naming the file and line."""
    path = Path(path)
    text = read_text(path).removeprefix(_BOM)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from None
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deeply") from None


# far above any config, rewards, sweep or pipeline file (a full attack config is ~130 values and ~5,000
# characters), far below what exhausts memory when the loaded tree is copied (the config loader copies it through
# JSON; a run's config.yaml writes it out)
MAX_YAML_NODES = 200_000
MAX_YAML_CHARS = 4 * 1024 * 1024


def parse_yaml(text: str, source: str | Path) -> Any:
    """The YAML document in `text` (from `source`, named in errors); a UserError for bad YAML, nesting past the
    parser's recursion, or a document past the bounds (`load_yaml`)."""
    return _parsed(lambda t: load_yaml(t, source), yaml.YAMLError, text, f"YAML {source}")


def load_yaml(text: str, source: str | Path) -> Any:
    """The YAML document in `text`, as yaml.safe_load builds it, once it is known to fit: a UserError for a text
    past MAX_YAML_CHARS, more than MAX_YAML_NODES values, or aliases that expand past either bound or into
    themselves. Text that is no YAML raises yaml.YAMLError (a command-line value is then kept as text)."""
    if len(text) > MAX_YAML_CHARS:
        raise UserError(f"YAML {source}: {len(text)} characters, past the {MAX_YAML_CHARS} a settings file may hold")
    loader = _CountingLoader(text, source)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded_size(node, source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


class _CountingLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader that stops composing past MAX_YAML_NODES values: a large alias-free file is refused
    after that many (seconds), not after it was built in full (minutes and gigabytes)."""

    def __init__(self, text: str, source: str | Path) -> None:
        super().__init__(text)
        self.source, self.nodes = source, 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if not self.check_event(yaml.AliasEvent):  # an alias is counted where its copies are: expanded_size
            self.nodes += 1
            if self.nodes > MAX_YAML_NODES:
                raise UserError(f"YAML {self.source}: holds more than {MAX_YAML_NODES} values, more than a settings "
                                "file needs; give large data as a data file")
        return super().compose_node(parent, index)


def parse_json(text: str, source: str | Path, what: str = "JSON") -> Any:
    """The JSON document in `text` (from `source`, named in errors after `what`); a UserError for bad JSON or
    nesting past the parser's recursion. A file that is only ever JSON: `read_json`, whose errors name the line."""
    return _parsed(json.loads, json.JSONDecodeError, text, f"{what} {source}")


def _parsed(load: Callable[[str], Any], errors: type[Exception], text: str, named: str) -> Any:
    try:
        return load(text)
    except errors as err:
        raise UserError(f"cannot parse {named}: {first_line(err)}") from None
    except RecursionError:
        raise UserError(f"cannot parse {named}: nested too deeply") from None


def expanded_size(node: yaml.Node, source: str | Path) -> tuple[int, int]:
    """(values, characters of scalar text) the composed YAML document `node` holds once every alias is copied out;
    counted over the shared node graph, each distinct collection once, so a bomb is measured without being
    expanded. A UserError past MAX_YAML_NODES or MAX_YAML_CHARS, or for an alias inside itself."""
    sizes: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()

    def size(node: yaml.Node) -> tuple[int, int]:
        if isinstance(node, yaml.ScalarNode):
            return 1, len(node.value)
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise UserError(f"YAML {source}: an alias refers to the value that holds it (a cycle)")
        open_.add(key)
        children = [child for pair in node.value for child in pair] if isinstance(node, yaml.MappingNode) \
            else node.value
        values, chars = 1, 0
        for child in children:
            more_values, more_chars = size(child)
            values, chars = values + more_values, chars + more_chars
            if values > MAX_YAML_NODES or chars > MAX_YAML_CHARS:
                bound = f"{MAX_YAML_NODES} values" if values > MAX_YAML_NODES else \
                    f"{MAX_YAML_CHARS} characters of text"
                raise UserError(f"YAML {source}: its aliases expand past {bound}; write the values out or use "
                                "fewer aliases")
        open_.discard(key)
        sizes[key] = (values, chars)
        return values, chars

    try:
        return size(node)
    except RecursionError:
        raise UserError(f"YAML {source}: nested too deeply") from None


def read_json_object(path: str | Path) -> dict[str, Any]:
    """A JSON file that must hold one object (a config, a state file)."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object, got {_kind(data)}")
    return data


def read_jsonl(path: str | Path, *, cut_tail: bool = False) -> list[dict[str, Any]]:
    """The objects of a JSONL file, one per non-blank line.

    `cut_tail=True` is for files this project appends objects to, one whole line per write: a last line
    without its newline that does not parse is a write cut short by a kill, and is dropped instead of
    refused. A bad line that did get its newline was written whole, so it is refused either way.
    """
    return [row for _, row in read_jsonl_numbered(path, cut_tail=cut_tail)]


def read_jsonl_numbered(path: str | Path, *, cut_tail: bool = False) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of each non-blank line of a JSONL file, as `read_jsonl` reads them: for checks
    of the objects' fields that name `path:line` in their errors."""
    path = Path(path)
    lines = _read_bytes(path).split(b"\n")
    rows: list[tuple[int, dict[str, Any]]] = []
    for lineno, raw in enumerate(lines, start=1):
        try:
            row = _parse_line(raw, path, lineno)
        except UserError:
            if cut_tail and lineno == len(lines):  # after a final newline, the last "line" is b"": blank
                break
            raise
        if row is _BLANK:
            continue
        if not isinstance(row, dict):
            raise UserError(f"{path}:{lineno}: expected a JSON object, got {_kind(row)}")
        rows.append((lineno, row))
    return rows


def iter_jsonl_numbered(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """`read_jsonl_numbered` one line at a time: a file larger than memory is read in constant memory, and a bad
    line stops the reading where it is reached, with the same message."""
    path = Path(path)
    try:
        f = open(path, "rb")  # closed by the `with` below; opening is where a missing file fails
    except FileNotFoundError:
        raise UserError(f"file not found: {path}") from None
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror}") from None
    with f:
        for lineno, raw in enumerate(f, start=1):
            row = _parse_line(raw.removesuffix(b"\n"), path, lineno)
            if row is _BLANK:
                continue
            if not isinstance(row, dict):
                raise UserError(f"{path}:{lineno}: expected a JSON object, got {_kind(row)}")
            yield lineno, row


def _parse_line(raw: bytes, path: Path, lineno: int) -> Any:
    text = _decode(raw, path, lineno)
    if lineno == 1:
        text = text.removeprefix(_BOM)
    if not text.strip():
        return _BLANK
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{path}:{lineno}: invalid JSON ({err.msg})") from None
    except RecursionError:
        raise UserError(f"{path}:{lineno}: JSON nested too deeply") from None


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
