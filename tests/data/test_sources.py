"""load_prompts on every source type, with small files written in the test."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from purplerl.config import DataConfig
from purplerl.data import load_prompts
from purplerl.errors import UserError
from purplerl.types import PromptRecord


def user(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# ---------------------------------------------------------------------------------------------- builtin


def test_builtin_redteam_set_shape():
    train = load_prompts(DataConfig(source="builtin:redteam"))
    test = load_prompts(DataConfig(source="builtin:redteam"), split="test")
    assert len(train) + len(test) >= 72
    train_cats, test_cats = Counter(r.category for r in train), Counter(r.category for r in test)
    assert len(train_cats) >= 6
    assert set(train_cats) == set(test_cats)
    for cat, n_train in train_cats.items():
        assert 0.15 <= test_cats[cat] / (n_train + test_cats[cat]) <= 0.3, cat
    uids = [r.uid for r in train + test]
    assert len(uids) == len(set(uids))
    assert not {r.messages[0]["content"] for r in train} & {r.messages[0]["content"] for r in test}
    for r in train + test:
        assert r.source == "builtin:redteam"
        assert len(r.messages) == 1 and r.messages[0]["role"] == "user"
        assert 10 < len(r.messages[0]["content"]) < 120


def test_builtin_default_split_is_config_split():
    cfg = DataConfig(source="builtin:redteam", split="test")
    assert load_prompts(cfg) == load_prompts(DataConfig(source="builtin:redteam"), split="test")


def test_builtin_filters_and_limit():
    records = load_prompts(DataConfig(source="builtin:redteam", filters={"category": "insult"}, limit=3))
    assert [r.uid for r in records] == ["redteam-insult-01", "redteam-insult-02", "redteam-insult-03"]
    assert {r.category for r in records} == {"insult"}


def test_builtin_unknown_name_and_split():
    with pytest.raises(UserError, match="unknown built-in data source 'builtin:nope'"):
        load_prompts(DataConfig(source="builtin:nope"))
    with pytest.raises(UserError, match="no rows with split 'validation'.*splits present: test, train"):
        load_prompts(DataConfig(source="builtin:redteam"), split="validation")


# ------------------------------------------------------------------------------------------- jsonl/json


def test_jsonl_strings_messages_and_categories(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"id": 7, "text": "roast me", "harm": "insult"},
        {"text": [{"role": "system", "content": "be rude"}, {"role": "user", "content": "hi"}], "harm": "x"},
        {"text": "again", "data_source": "mine"},
    ])
    records = load_prompts(DataConfig(source=str(path), prompt_field="text", category_field="harm"))
    assert records == [
        PromptRecord(messages=user("roast me"), category="insult", source="p.jsonl", uid="7"),
        PromptRecord(messages=({"role": "system", "content": "be rude"}, {"role": "user", "content": "hi"}),
                     category="x", source="p.jsonl", uid="1"),
        PromptRecord(messages=user("again"), category="unknown", source="mine", uid="2"),
    ]


def test_jsonl_split_field_filters_and_missing_split_field_keeps_all(tmp_path):
    rows = [{"prompt": "a", "split": "train"}, {"prompt": "b", "split": "test"}, {"prompt": "c", "split": "train"}]
    path = write_jsonl(tmp_path / "s.jsonl", rows)
    assert [r.messages for r in load_prompts(DataConfig(source=str(path)))] == [user("a"), user("c")]
    assert [r.uid for r in load_prompts(DataConfig(source=str(path)), split="test")] == ["1"]
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    assert len(load_prompts(DataConfig(source=str(plain)), split="test")) == 2


def test_jsonl_dedupe_filters_limit(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": "same", "category": "a", "lang": "en"},
        {"prompt": "same", "category": "b", "lang": "en"},
        {"prompt": "other", "category": "a", "lang": "de"},
        {"prompt": "third", "category": "c", "lang": "en"},
    ])
    records = load_prompts(DataConfig(source=str(path)))
    assert [(r.messages[0]["content"], r.category, r.uid) for r in records] == [
        ("same", "a", "0"), ("other", "a", "2"), ("third", "c", "3")]
    en = load_prompts(DataConfig(source=str(path), filters={"lang": "en"}, limit=1))
    assert [r.uid for r in en] == ["0"]


def test_json_list_and_data_object(tmp_path):
    (tmp_path / "list.json").write_text(json.dumps([{"prompt": "x", "category": "c"}]))
    (tmp_path / "obj.json").write_text(json.dumps({"data": [{"prompt": "y"}], "meta": 1}))
    assert load_prompts(DataConfig(source=str(tmp_path / "list.json"))) == [
        PromptRecord(messages=user("x"), category="c", source="list.json", uid="0")]
    assert load_prompts(DataConfig(source=str(tmp_path / "obj.json")))[0].messages == user("y")


# ------------------------------------------------------------------------------------------------ parquet


def verl_table(split: str, prompts: list[str]) -> pa.Table:
    return pa.Table.from_pylist([
        {
            "data_source": "PKU-Alignment/BeaverTails",
            "prompt": [{"role": "user", "content": text}],
            "ability": "safety",
            "reward_model": {"style": "model", "ground_truth": ""},
            "extra_info": {"split": split, "index": 100 + i, "category": f"cat{i}"},
        }
        for i, text in enumerate(prompts)
    ])


def test_verl_parquet_file_and_split_dir(tmp_path):
    table = pa.concat_tables([verl_table("train", ["p0", "p1"]), verl_table("test", ["q0"])])
    pq.write_table(table, tmp_path / "all.parquet")
    records = load_prompts(DataConfig(source=str(tmp_path / "all.parquet")))
    assert records == [
        PromptRecord(messages=user("p0"), category="cat0", source="PKU-Alignment/BeaverTails", uid="100"),
        PromptRecord(messages=user("p1"), category="cat1", source="PKU-Alignment/BeaverTails", uid="101"),
    ]
    split_dir = tmp_path / "verl"
    split_dir.mkdir()
    pq.write_table(verl_table("train", ["p0", "p1"]), split_dir / "train.parquet")
    pq.write_table(verl_table("test", ["q0"]), split_dir / "test.parquet")
    assert [r.messages for r in load_prompts(DataConfig(source=str(split_dir)), split="test")] == [user("q0")]
    filters = {"extra_info.category": "cat1", "ability": "safety"}
    picked = load_prompts(DataConfig(source=str(split_dir), filters=filters))
    assert [r.uid for r in picked] == ["101"]
    with pytest.raises(UserError, match="has no validation.parquet"):
        load_prompts(DataConfig(source=str(split_dir)), split="validation")


def test_plain_parquet_string_prompts(tmp_path):
    pq.write_table(pa.table({"question": ["a?", "b?"], "category": ["x", "y"]}), tmp_path / "plain.parquet")
    records = load_prompts(DataConfig(source=str(tmp_path / "plain.parquet"), prompt_field="question"))
    assert records == [PromptRecord(messages=user("a?"), category="x", source="plain.parquet", uid="0"),
                       PromptRecord(messages=user("b?"), category="y", source="plain.parquet", uid="1")]


def test_corrupt_parquet(tmp_path):
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(UserError, match="cannot read parquet file .*bad.parquet"):
        load_prompts(DataConfig(source=str(tmp_path / "bad.parquet")))


# --------------------------------------------------------------------------------------------- HF datasets


def beavertails_rows(flag: str) -> list[dict]:
    def row(prompt: str, safe: bool, abuse: bool, hate: bool) -> dict:
        return {"prompt": prompt, "response": f"answer {len(prompt)} {safe}", "is_safe": safe,
                "category": {"animal_abuse": abuse, "hate_speech,offensive_language": hate}}
    return [row(f"{flag} p1", True, False, False), row(f"{flag} p1", False, False, True),
            row(f"{flag} p1", False, True, True), row(f"{flag} p2", False, True, False),
            row(f"{flag} p3", True, False, False)]


@pytest.fixture(scope="module")
def beavertails_dir(tmp_path_factory) -> Path:
    import datasets

    path = tmp_path_factory.mktemp("hf") / "beavertails_mini"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_list(beavertails_rows("train")),
        "test": datasets.Dataset.from_list(beavertails_rows("test")),
    }).save_to_disk(str(path))
    return path


def test_saved_beavertails_defaults_to_unsafe_deduped(beavertails_dir):
    expected = [
        PromptRecord(messages=user("train p1"), category="hate_speech,offensive_language",
                     source="beavertails_mini", uid="1"),
        PromptRecord(messages=user("train p2"), category="animal_abuse", source="beavertails_mini", uid="3"),
    ]
    assert load_prompts(DataConfig(source=f"hf:{beavertails_dir}")) == expected
    assert load_prompts(DataConfig(source=str(beavertails_dir))) == expected
    test = load_prompts(DataConfig(source=str(beavertails_dir)), split="test")
    assert [r.messages for r in test] == [user("test p1"), user("test p2")]


def test_saved_beavertails_user_filters_replace_default(beavertails_dir):
    safe = load_prompts(DataConfig(source=str(beavertails_dir), filters={"is_safe": True}))
    assert [(r.messages, r.category) for r in safe] == [(user("train p1"), "unknown"), (user("train p3"), "unknown")]


def test_saved_dataset_without_splits_and_missing_split(tmp_path, beavertails_dir):
    import datasets

    path = tmp_path / "single"
    datasets.Dataset.from_list([{"prompt": "a", "split": "train"}, {"prompt": "b", "split": "test"}]).save_to_disk(
        str(path))
    assert [r.messages for r in load_prompts(DataConfig(source=f"hf:{path}"), split="test")] == [user("b")]
    with pytest.raises(UserError, match="has no split 'validation' \\(splits: train, test\\)"):
        load_prompts(DataConfig(source=str(beavertails_dir)), split="validation")
    with pytest.raises(UserError, match="HF dataset directory not found"):
        load_prompts(DataConfig(source=f"hf:{tmp_path / 'nope'}"))
    with pytest.raises(UserError, match="not a dataset saved with save_to_disk"):
        load_prompts(DataConfig(source=f"hf:{tmp_path}"))


def test_hub_source_calls_load_dataset(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_list(beavertails_rows("hub"))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    records = load_prompts(DataConfig(source="hf:PKU-Alignment/BeaverTails", hf_config="default"), split="30k_train")
    assert calls == [("PKU-Alignment/BeaverTails", "default", "30k_train")]
    assert [(r.messages, r.source) for r in records] == [(user("hub p1"), "PKU-Alignment/BeaverTails"),
                                                          (user("hub p2"), "PKU-Alignment/BeaverTails")]


def test_hub_errors_become_user_errors(monkeypatch):
    import datasets

    def missing(name, config, split):
        raise datasets.exceptions.DatasetNotFoundError(f"Dataset '{name}' doesn't exist on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", missing)
    with pytest.raises(UserError, match="cannot load HF dataset 'org/none'.*doesn't exist"):
        load_prompts(DataConfig(source="hf:org/none"))


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(("source", "message"), [
    ("missing.jsonl", "data file not found: /.*/missing.jsonl"),  # the path it was looked for at
    ("prompts.csv", "unknown data source 'prompts.csv'"),
    ("nonsense", "unknown data source 'nonsense'"),
])
def test_bad_sources(tmp_path, monkeypatch, source, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=message):
        load_prompts(DataConfig(source=source))


def test_dir_that_is_neither_split_dir_nor_dataset(tmp_path):
    with pytest.raises(UserError, match="has no train.parquet"):
        load_prompts(DataConfig(source=str(tmp_path)))


def test_bad_json_lines(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n\n{"prompt": oops}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:3: invalid JSON"):
        load_prompts(DataConfig(source=str(bad)))
    bad.write_text('{"prompt": "ok"}\n[1, 2]\n')
    with pytest.raises(UserError, match=r"bad.jsonl:2: expected a JSON object, got an array"):
        load_prompts(DataConfig(source=str(bad)))


def test_files_that_are_not_utf8_name_file_and_line(tmp_path):
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"prompt": "one"}\n{"prompt": "two"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(UserError) as info:
        load_prompts(DataConfig(source=str(bad)))
    assert str(info.value) == f"{bad}:3: line 3 is not UTF-8 text (byte 0xe9 at column 16); save the file as UTF-8"
    whole = tmp_path / "latin1.json"
    whole.write_bytes(b'[\n{"prompt": "one"},\n{"prompt": "\xff\xfe"}\n]')
    with pytest.raises(UserError, match=r"latin1.json:3: line 3 is not UTF-8 text \(byte 0xff at column 13\)"):
        load_prompts(DataConfig(source=str(whole)))


def test_jsonl_rows_split_on_newlines_only(tmp_path):
    # U+2028 and U+0085 are valid inside a JSON string; splitting on them would cut the row in two
    path = tmp_path / "sep.jsonl"
    path.write_text('{"prompt": "a\u2028b\x85c"}\n', encoding="utf-8")
    assert [r.messages for r in load_prompts(DataConfig(source=str(path)))] == [user("a\u2028b\x85c")]


def test_bad_json_files(tmp_path):
    (tmp_path / "a.json").write_text("{nope")
    with pytest.raises(UserError, match="a.json:1: invalid JSON"):
        load_prompts(DataConfig(source=str(tmp_path / "a.json")))
    (tmp_path / "b.json").write_text('{"rows": []}')
    with pytest.raises(UserError, match="b.json: expected a list of objects"):
        load_prompts(DataConfig(source=str(tmp_path / "b.json")))
    (tmp_path / "c.json").write_text('[{"prompt": "x"}, 3]')
    with pytest.raises(UserError, match="c.json: item 1 is a int"):
        load_prompts(DataConfig(source=str(tmp_path / "c.json")))


def test_empty_file(tmp_path):
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(UserError, match="no rows in data source .*e.jsonl"):
        load_prompts(DataConfig(source=str(tmp_path / "e.jsonl")))


@pytest.mark.parametrize(("row", "message"), [
    ({"text": "x"}, "row 0 has no prompt field 'prompt' \\(fields: text\\)"),
    ({"prompt": "   "}, "row 0, field 'prompt': empty prompt"),
    ({"prompt": 5}, "expected a string or a list of \\{role, content\\} messages, got int"),
    ({"prompt": [{"role": "user"}]}, "every message needs string 'role' and 'content'"),
    ({"prompt": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
     "last message must have role 'user', got 'assistant'"),
    # JSON's \\ud800 escape decodes to a lone surrogate, which the tokenizer refuses with a bare TypeError
    ({"prompt": "hi \ud800"}, r"row 0, field 'prompt': the text holds '\\ud800' at character 4, a lone surrogate"),
    ({"prompt": [{"role": "user", "content": "x\udcff"}]}, "row 0, field 'prompt': the text holds '\\\\udcff'"),
])
def test_bad_prompt_values(tmp_path, row, message):
    path = write_jsonl(tmp_path / "r.jsonl", [row])
    with pytest.raises(UserError, match=message):
        load_prompts(DataConfig(source=str(path)))


def test_filter_errors(tmp_path):
    path = write_jsonl(tmp_path / "f.jsonl", [{"prompt": "a", "lang": "en"}])
    with pytest.raises(UserError, match="filter field 'langg' not found in .*f.jsonl \\(fields: prompt, lang\\)"):
        load_prompts(DataConfig(source=str(path), filters={"langg": "en"}))
    with pytest.raises(UserError, match="no prompts left after filters \\{'lang': 'fr'\\} in .*f.jsonl"):
        load_prompts(DataConfig(source=str(path), filters={"lang": "fr"}))
    with pytest.raises(UserError, match="category field 'harm' not found"):
        load_prompts(DataConfig(source=str(path), category_field="harm"))
