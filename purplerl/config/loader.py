"""Reading a command's config: defaults <- YAML/JSON file <- CLI overrides, validated once, errors naming the field.

Overrides are `--section.field VALUE` or a command's flat name (`--kl_beta 0.2`, `--max-new-tokens 8`);
values are YAML scalars, except that a text field keeps its text as typed. A list field takes one item per
occurrence (`--checkpoint a --checkpoint b`) or a YAML list (`--eval.checkpoints [a, b]`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from purplerl.config.base import METADATA, EntrySettings, Section, Spec, item_type, registry_of
from purplerl.config.commands import Command
from purplerl.config.migrate import REMOVED, get_path
from purplerl.config.sections import RewardServerConfig
from purplerl.errors import UserError
from purplerl.files import load_yaml, parse_json, parse_yaml, read_text
from purplerl.scalars import admitted_types


def _format_validation_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = f"removed: {REMOVED[where]}" if where in REMOVED else "unknown field"
    quoted = first["type"] != "extra_forbidden" and not isinstance(first["input"], dict)
    shown = f" (got {first['input']!r})" if quoted else ""
    return (f"config field '{where}': " if where else "config: ") + msg + shown


def build(schema: type[Section], data: dict[str, Any]) -> Any:
    """Validate a nested dict into `schema`, raising UserError that names the bad field."""
    try:
        return schema.model_validate(data)
    except ValidationError as err:
        raise UserError(_format_validation_error(err)) from None


def build_server_config(values: dict[str, Any], name_of: Callable[[str], str] = lambda f: "--" + f.replace("_", "-"),
                        ) -> RewardServerConfig:
    """Validate reward server settings; UserError names the bad one as the user spelled it (`name_of(field)`)."""
    try:
        return RewardServerConfig.model_validate(values)
    except ValidationError as err:
        first = err.errors()[0]
        unread = re.match(r"(?:Value error, )?(\w+) is read only when", first["msg"])
        field = str(first["loc"][0]) if first["loc"] else unread.group(1) if unread else None
        where = name_of(field) if field else "reward server settings"
        shown = f" (got {first['input']!r})" if first["loc"] and first["loc"][0] != "api_key" else ""
        raise UserError(f"{where}: {first['msg'].removeprefix('Value error, ')}{shown}") from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON config file into a nested dict."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    text = read_text(path)
    data = parse_json(text, path, "config") if path.suffix == ".json" else parse_yaml(text, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config {path} must hold a mapping at the top level")
    return data


def _leaf_annotation(schema: type[BaseModel], dotted: str) -> Any:
    """The type annotation of a dotted config field (or of a setting inside an entry of a mapping-valued field that
    says how to type them: `EntrySettings`), or None where the path names no field."""
    model = schema
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        info = model.model_fields.get(part)
        if info is None:
            return None
        if i == len(parts) - 1:
            return info.annotation
        if not _is_section(info.annotation):
            entries = _entry_settings(info.annotation)
            inside = ".".join(parts[i + 2:])
            return entries.annotation(parts[i + 1], inside) if entries is not None and inside else None
        model = info.annotation
    return None


def _entry_settings(annotation: Any) -> EntrySettings | None:
    """The `EntrySettings` of a `dict[str, Annotated[..., EntrySettings(...)]]` field, else None."""
    if get_origin(annotation) is not dict:
        return None
    value = get_args(annotation)[1]
    return next((m for m in getattr(value, "__metadata__", ()) if isinstance(m, EntrySettings)), None)


def _parse_value(text: str, annotation: Any) -> Any:
    """CLI values are YAML scalars: 0.1 -> float, true -> bool, null -> None, [a, b] -> list.

    A text field keeps the text as typed (only `null` still means None, where the field takes it): YAML
    would turn `--name 007` into the int 7 and `--system_prompt yes` into True, which a str field rejects.
    """
    if annotation is str:
        return text  # not even `null`: the field cannot hold None
    try:
        value = load_yaml(text, "value on the command line")
    except yaml.YAMLError:
        return text
    except RecursionError:
        raise UserError(f"the value {text[:40]!r}... is nested too deeply") from None
    if value is not None and annotation == str | None:
        return text
    admitted = admitted_types(annotation)
    if isinstance(value, bool) and str in admitted and bool not in admitted:
        return text  # `--reward.terms.toxicity.params.label yes` names a label; it is not the index True == 1
    return value


def _split_option(args: list[str], i: int) -> tuple[str, str, int]:
    """(name, value, index of the next argument) of the option at args[i]."""
    key, eq, value = args[i][2:].partition("=")
    if eq:
        return key, value, i + 1
    if i + 1 >= len(args) or args[i + 1].startswith("--"):
        raise UserError(f"option --{key} needs a value")
    return key, args[i + 1], i + 2


def parse_overrides(args: list[str], command: Command) -> dict[str, Any]:
    """Turn ['--kl_beta', '0.2', '--reward.zscore=true'] into {'reward.kl_beta': 0.2, ...}."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            if command.positional is None or command.positional in out:
                raise UserError(f"unexpected argument '{arg}': overrides look like --name value")
            out[command.positional], i = arg, i + 1
            continue
        key, value, i = _split_option(args, i)
        key = key.replace("-", "_")
        dotted = command.flat.get(key, key)
        if "." not in dotted and dotted not in command.schema.model_fields:
            raise UserError(f"unknown option --{key} (see --help for config fields)")
        if dotted == command.positional and dotted in out:
            raise UserError(f"{dotted} is given twice: '{out[dotted]}' and --{key} '{value}'")
        annotation = _leaf_annotation(command.schema, dotted)
        if item_type(annotation) is None:
            out[dotted] = _parse_value(value, annotation)
            continue
        if not value.strip():  # YAML reads '' as null: no item, and no list either
            raise UserError(f"option --{key} is empty: give its items ('a,b', or --{key} once per item), or [] for "
                            "none")
        parsed = _parse_value(value, annotation) if value.lstrip().startswith("[") else None
        # one item per occurrence, kept as typed: a prompt '[1, 2]' is text, a YAML list must be the whole value
        items = parsed if isinstance(parsed, list) else [_parse_value(value, item_type(annotation))]
        out[dotted] = [*out.get(dotted, []), *items]
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any],
                    schema: type[BaseModel] | None = None) -> dict[str, Any]:
    """Set dotted keys in a nested dict (copying the path), e.g. 'reward.terms.toxicity.params.model'. With the
    `schema` of the data, a bare value for an entry of a mapping-valued field that holds settings of its own sets
    the entry's shorthand field where the entry is written out (`EntrySettings`: reward.terms.toxicity 2 is its
    weight, and the term keeps its parameters)."""
    data = json.loads(json.dumps(data))
    for dotted, value in overrides.items():
        dotted = _shorthand(schema, data, dotted, value) if schema is not None else dotted
        node = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UserError(f"cannot set {dotted}: '{part}' is not a section")
            node = child
        node[parts[-1]] = value
    return data


def _shorthand(schema: type[BaseModel], data: dict[str, Any], dotted: str, value: Any) -> str:
    """`dotted`, or its entry's shorthand field (see `apply_overrides`)."""
    *sections, entry = dotted.split(".")
    model: Any = schema
    for i, part in enumerate(sections):
        info = model.model_fields.get(part)
        if info is None:
            return dotted
        if not _is_section(info.annotation):
            entries = _entry_settings(info.annotation)
            at_entry = i == len(sections) - 1 and entries is not None and entries.shorthand is not None
            written_out = isinstance(get_path(data, dotted), dict) and not isinstance(value, Mapping)
            return f"{dotted}.{entries.shorthand}" if at_entry and written_out else dotted
        model = info.annotation
    info = model.model_fields.get(entry)
    if info is not None and _is_spec(info.annotation) and not isinstance(value, Mapping):
        return f"{dotted}.{info.annotation.shorthand}"  # a Spec's bare value: its shorthand field
    return dotted


def deep_merge(a: Mapping[str, Any], b: Mapping[str, Any], schema: type[BaseModel] | None = None) -> dict[str, Any]:
    """`b` over `a`, mappings merged key by key. With `schema`, only its sections are merged and any other value is
    replaced whole: a mapping-valued setting (reward.terms, a judge's parameters) of a run's saved config is its
    whole value, not a union with the recipe's defaults (a key the schema does not name is merged, and validation
    judges it). A config file is merged without it: `terms: {refusal: -1.0}` there changes that one weight."""
    out = dict(a)
    for key, value in b.items():
        info = schema.model_fields.get(key) if schema is not None else None
        section = info.annotation if info is not None and _is_section(info.annotation) else None
        if isinstance(value, dict) and isinstance(out.get(key), dict) and (info is None or section is not None):
            out[key] = deep_merge(out[key], value, section)
        else:
            out[key] = value
    return out


def load_command_config(command: Command, path: str | Path | None = None, overrides: list[str] | None = None,
                        base: dict[str, Any] | None = None, saved: dict[str, Any] | None = None) -> Any:
    """A command's settings: its defaults (and a run's saved config, `base`) <- config file <- CLI overrides, older
    names migrated (`command.migrate`) before validation.

    Fields set anywhere along the way are in each section's `model_fields_set`, so a checkpoint's run
    config fills in only what the user left alone. `base` is merged key by key (a sweep's or a pipeline stage's
    settings); `saved`, a run's saved config, is complete: its mapping-valued settings replace the defaults' (a
    resumed run keeps exactly its reward terms)."""
    migrate = command.migrate or (lambda data: data)
    data = deep_merge(json.loads(json.dumps(command.defaults)), migrate(base or {}))
    if saved is not None:
        data = deep_merge(data, migrate(saved), command.schema)
    if path is not None:
        data = deep_merge(data, migrate(read_config_file(path)))
    # one at a time, each migrated: `--reward.terms {x: 1} --reward.terms.x.params.p V` sets p of the term written
    # out from its weight (a command's migration spells out reward.terms)
    for dotted, value in parse_overrides(overrides or [], command).items():
        data = migrate(apply_overrides(data, {dotted: value}, command.schema))
    return build(command.schema, migrate(data))


def commented_yaml(config: Section) -> str:
    """The config as YAML with each field's description as a trailing comment (for people, loadable as-is)."""
    descriptions = {name: desc for name, _, desc in field_help(type(config))}
    lines: list[str] = []

    def emit(node: dict[str, Any], prefix: str, indent: str) -> None:
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if isinstance(value, dict) and dotted not in descriptions:
                lines.append(f"{indent}{key}:")
                emit(value, dotted + ".", indent + "  ")
                continue
            if isinstance(value, dict) and value and all(isinstance(entry, dict) for entry in value.values()):
                # a setting of named entries (reward.terms): one entry a line, its fields in their own order
                lines.append(f"{indent}{key}:  # {descriptions.get(dotted, '')}")
                lines.extend(f"{indent}  {_flow({name: entry}, sort_keys=False)}" for name, entry in value.items())
                continue
            lines.append(f"{indent}{_flow({key: value})}  # {descriptions.get(dotted, '')}")

    emit(config.settings(), "", "")
    return "\n".join(lines) + "\n"


def _flow(mapping: dict[str, Any], sort_keys: bool = True) -> str:
    """One mapping's key and value as one line of YAML."""
    return yaml.safe_dump(mapping, default_flow_style=True, width=10**6, sort_keys=sort_keys).strip()[1:-1]


def save_config(config: Section, path: str | Path) -> None:
    Path(path).write_text(commented_yaml(config))


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _is_spec(annotation: Any) -> bool:
    """A setting of a few fields listed as one row (purplerl.config.base.Spec)."""
    return isinstance(annotation, type) and issubclass(annotation, Spec)


def specs_in_force(settings: Section, prefix: str = "") -> list[tuple[str, Spec]]:
    """(dotted name, value) of every Spec setting these settings read: --help lists each one's fields below it."""
    found: list[tuple[str, Spec]] = []
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if name in settings.unread_fields() or not isinstance(value, Section):
            continue
        found += [(f"{prefix}{name}", value)] if isinstance(value, Spec) else specs_in_force(value, f"{prefix}{name}.")
    return found


def section_descriptions(schema: type[BaseModel], prefix: str = "") -> dict[str, str]:
    """{dotted section name: its description} for every section under `schema`, depth first."""
    found: dict[str, str] = {}
    for name, info in schema.model_fields.items():
        if _is_section(info.annotation) and not _is_spec(info.annotation):
            found[f"{prefix}{name}"] = info.description or ""
            found.update(section_descriptions(info.annotation, f"{prefix}{name}."))
    return found


def literal_choices(annotation: Any) -> tuple[Any, ...]:
    """The values of a Literal field (or of a list of them, or an optional one), else ()."""
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    inner = item_type(annotation)
    if inner is not None:
        return literal_choices(inner)
    if get_origin(annotation) in (Union, UnionType):
        return next((c for arg in get_args(annotation) if (c := literal_choices(arg))), ())
    return ()


def field_help(schema: type[BaseModel], defaults: dict[str, Any] | None = None, with_choices: bool = False,
               settings: Section | None = None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default as JSON, description) for every leaf field of `schema`: the --help table.

    `defaults` are a command's own; `with_choices` adds a registry's names to the description, which imports the
    registry. With `settings` (the values in force), only the settings they make read are listed, without the
    recorded metadata, each with its value there. A field without a default shows as required. `prefix`: where
    `schema` sits (a reward term's parameters: reward.terms.NAME.params.)."""
    rows: list[tuple[str, str, str]] = []

    def walk(model: type[BaseModel], prefix: str, values: dict[str, Any], section: Any) -> None:
        unread = section.unread_fields() if isinstance(section, Section) else set()
        for name, info in model.model_fields.items():
            if name in unread or (section is not None and (info.description or "").startswith(METADATA)):
                continue
            if _is_section(info.annotation) and not _is_spec(info.annotation):
                walk(info.annotation, f"{prefix}{name}.", values.get(name, {}),
                     getattr(section, name) if section is not None else None)
                continue
            if _is_spec(info.annotation):  # one row, its shorthand field's value; its fields are listed below it
                spec = getattr(section, name) if section is not None else info.annotation.model_validate(
                    values.get(name, {}))
                default = json.dumps(spec.settings()[spec.shorthand])
            elif section is not None:
                default = json.dumps(type(section).__pydantic_serializer__.to_python(
                    section, mode="json", include={name})[name])
            elif name in values:
                default = json.dumps(values[name])
            else:
                default = "required" if info.is_required() else json.dumps(
                    info.get_default(call_default_factory=True))
            desc = info.description or ""
            registry = registry_of(info.annotation, tuple(info.metadata)) if with_choices else None
            choices = registry.names() if registry is not None else literal_choices(info.annotation)
            if with_choices and choices and "choices:" not in desc:
                desc += f" (choices: {', '.join(map(str, choices))})"
            rows.append((f"{prefix}{name}", default, desc))

    walk(schema, prefix, defaults or {}, settings)
    return rows
