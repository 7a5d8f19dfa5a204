"""The `purplerl` command end to end, in a subprocess, on the tiny random model (no downloads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.process

STEPS, BATCH, GROUP = 2, 2, 2
SAMPLE_KEYS = {"prompt", "completion", "toxicity", "repetition", "kl", "reward", "advantage"}
CHECKPOINT_FILES = {"adapter_config.json", "adapter_model.safetensors", "optimizer.pt", "loop_state.json"}


def cli_env(cache: Path) -> dict[str, str]:
    # one torch thread: the tiny model gains nothing from more, and the commands here run side by side
    return {**os.environ, "PURPLERL_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1"}


def command(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "purplerl.cli", *map(str, args)]


def purplerl(*args: str | Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(command(*args), env=env, capture_output=True, text=True, timeout=timeout)


class Launched:
    """Commands started together and collected on demand: most of a CLI call is imports, so running the
    independent ones side by side keeps this file fast."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: dict[str, subprocess.Popen] = {}
        self.done: dict[str, subprocess.CompletedProcess] = {}

    def start(self, name: str, *args: str | Path) -> None:
        self.procs[name] = subprocess.Popen(command(*args), env=self.env, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)

    def result(self, name: str, timeout: float = 180) -> subprocess.CompletedProcess:
        if name not in self.done:
            proc = self.procs[name]
            out, err = proc.communicate(timeout=timeout)
            self.done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        return self.done[name]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def attack_args(model_dir: Path, output_dir: Path, name: str) -> list[str]:
    return ["attack", "--model", str(model_dir), "--steps", str(STEPS), "--batch_size", str(BATCH),
            "--group_size", str(GROUP), "--max_new_tokens", "8", "--output_dir", str(output_dir), "--name", name,
            "--save_every", "1", "--logging.progress", "false"]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    return lines[0]


MISTAKES = {
    "config-path": (["attack", "--config", "/nonexistent/config.yaml"], "/nonexistent/config.yaml"),
    "lr": (["attack", "--lr", "-1"], "training.lr"),
    "bogus": (["attack", "--bogus", "1"], "--bogus"),
    "resume": (["attack", "--resume", "/nonexistent"], "/nonexistent"),
    "sample-checkpoint": (["sample", "--checkpoint", "/nonexistent", "--prompt", "hi"], "/nonexistent"),
    "sample-device": (["sample", "--prompt", "hi", "--device", "gpu"], "model.device"),
    # YAML reads `yes` as True, which pydantic would take as the integer 1
    "steps-yes": (["attack", "--steps", "yes"], "config field 'training.steps': expected an integer, got a boolean"),
    # the old name still works; the field is the attack's own now
    "nan-early-stop": (["attack", "--training.early_stop_toxicity", ".nan"], "attack.early_stop_toxicity"),
    "inf-timeout": (["attack", "--reward.terms.toxicity.params.timeout_s", ".inf"],
                    "reward.terms.toxicity.params.timeout_s"),
    "sample-inf": (["sample", "--prompt", "hi", "--temperature", "inf"],
                   "config field 'sampling.temperature': Input should be a finite number"),
    "sample-no-prompt": (["sample", "--n", "2"], "give at least one --prompt"),
    "sample-attack-field": (["sample", "--prompt", "hi", "--lr", "0.1"], "unknown option --lr"),
    "eval-n": (["eval", "--n", "0"], "config field 'eval.n'"),
    "tamper-no-adapter": (["tamper-test", "--steps", "1"], "--adapter DIR (tamper.adapter)"),
    # a byte that is not UTF-8 on the command line reaches Python as a lone surrogate
    "sample-not-utf8": (["sample", "--prompt", "fine", "--prompt", os.fsdecode(b"caf\xe9")],
                        "config field 'sample.prompts': item 2: the text holds"),
}
# adapter_config.json files that PEFT would fail on with a TypeError or KeyError deep in its loader
BAD_ADAPTER_CONFIGS = {
    "invalid-json": (b'{"peft_type": "LORA", "r": 8', "adapter_config.json:1: invalid JSON"),
    "not-an-object": (b'["LORA", 8]', "adapter_config.json: expected a JSON object, got an array"),
    "wrong-type": (b'{"peft_type": "LORA", "r": "eight"}', "field 'r' must be a positive integer"),
    "no-peft-type": (b'{"r": 8, "lora_alpha": 16}', "no peft_type"),
}
INIT_ADAPTER_CASES = ("invalid-json", "wrong-type")  # the other two go to `sample --checkpoint`
NOT_UTF8_JSONL = b'{"prompt": "one"}\n{"prompt": "two"}\n\xff\xfe{"prompt": "three"}\n'


def write_bad_adapters(root: Path) -> dict[str, Path]:
    """One adapter dir per BAD_ADAPTER_CONFIGS entry (with a weights file, so only the config is wrong)."""
    dirs = {}
    for name, (config, _) in BAD_ADAPTER_CONFIGS.items():
        path = root / f"adapter-{name}"
        path.mkdir()
        (path / "adapter_config.json").write_bytes(config)
        (path / "adapter_model.safetensors").write_bytes(b"")
        dirs[name] = path
    return dirs
# overrides that pass config validation but name a model or data file that is not there
BAD_INPUTS = {
    "model": (["--model", "/nonexistent/model"], "/nonexistent/model"),
    "data": (["--data", "/nonexistent.jsonl"], "/nonexistent.jsonl"),
}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return cli_env(tmp_path_factory.mktemp("purplerl_cache"))


@pytest.fixture(scope="module")
def cli(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]):
    """Every command of this file: one attack run (blocking), and the rest started side by side with it."""
    runs = tmp_path_factory.mktemp("runs")
    launched = Launched(env)
    for name, (args, _) in MISTAKES.items():
        launched.start(name, *args)
    for name, (override, _) in BAD_INPUTS.items():
        launched.start(f"bad-{name}", *attack_args(tiny_model_dir, runs, f"bad-{name}"), *override)
    launched.start("sample-base", "sample", "--model", tiny_model_dir, "--prompt", "hello", "--prompt", "bye",
                   "--n", "2", "--max-new-tokens", "5")
    launched.start("attack", *attack_args(tiny_model_dir, runs, "r1"))
    run_dir = runs / "r1"
    if launched.result("attack").returncode == 0:
        checkpoint = run_dir / "checkpoints" / f"step_{STEPS:06d}"
        launched.start("attack-again", *attack_args(tiny_model_dir, runs, "r1"))
        (runs / "c.yaml").write_text("training:\n  steps: 3\n")
        launched.start("resume-with-config", "attack", "--resume", run_dir, "--config", runs / "c.yaml")
        launched.start("sample-checkpoint-ok", "sample", "--checkpoint", checkpoint, "--prompt", "hello",
                       "--max-new-tokens", "5")
    # started once the attack is done, so that it is not slowed past its timeout on a busy machine
    for name, adapter in write_bad_adapters(runs).items():
        command = "init-adapter" if name in INIT_ADAPTER_CASES else "sample-adapter"
        args = ([*attack_args(tiny_model_dir, runs, f"init-{name}"), "--init_adapter", adapter]
                if command == "init-adapter" else ["sample", "--checkpoint", adapter, "--prompt", "hi"])
        launched.start(f"{command}-{name}", *args)
    (runs / "latin1.jsonl").write_bytes(NOT_UTF8_JSONL)
    launched.start("data-not-utf8", *attack_args(tiny_model_dir, runs, "latin1"), "--data", runs / "latin1.jsonl")
    (runs / "sub").mkdir()
    launched.start("name-parent", *attack_args(tiny_model_dir, runs / "sub", "../x"))
    launched.start("name-absolute", *attack_args(tiny_model_dir, runs / "sub", str(runs / "abs")))
    launched.run_dir = run_dir
    launched.runs = runs
    yield launched
    launched.close()


@pytest.fixture(scope="module")
def trained(cli: Launched) -> Path:
    proc = cli.result("attack")
    assert proc.returncode == 0, proc.stderr
    return cli.run_dir


# --------------------------------------------------------------------------------------------- attack


def test_attack_exits_zero_and_reports(cli: Launched, trained: Path):
    proc = cli.result("attack")
    assert "mean toxicity" in proc.stdout
    assert str(trained) in proc.stdout
    assert "Traceback" not in proc.stderr


def test_attack_saves_resolved_config(trained: Path, tiny_model_dir: Path):
    saved = yaml.safe_load((trained / "config.yaml").read_text())
    assert saved["model"]["name"] == str(tiny_model_dir)
    assert saved["training"]["steps"] == STEPS
    assert saved["sampling"]["group_size"] == GROUP
    assert saved["run"]["name"] == "r1"
    assert saved["reward"]["kl_beta"] == 0.1  # defaults are written out too
    assert saved["logging"]["progress"] is False


def test_attack_writes_metrics_and_samples(trained: Path):
    metrics = read_jsonl(trained / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("toxicity/mean" in m and "reward/mean" in m for m in metrics)
    samples = read_jsonl(trained / "samples.jsonl")
    assert len(samples) == STEPS * BATCH * GROUP
    for row in samples:
        assert SAMPLE_KEYS <= row.keys(), row.keys()
        assert isinstance(row["completion"], str)
    assert [row["step"] for row in samples] == [1] * (BATCH * GROUP) + [2] * (BATCH * GROUP)


def test_attack_writes_checkpoint_and_summary(trained: Path):
    final = trained / "checkpoints" / f"step_{STEPS:06d}"
    assert CHECKPOINT_FILES <= {p.name for p in final.iterdir()}
    assert json.loads((final / "loop_state.json").read_text())["step"] == STEPS
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["last_step"] == STEPS
    assert not list((trained / "checkpoints").glob("*.tmp"))


def test_attack_refuses_existing_run_dir(cli: Launched, trained: Path):
    again = cli.result("attack-again")
    assert again.returncode == 2
    line = assert_one_line_error(again)
    assert "--resume" in line and str(trained) in line
    assert len(read_jsonl(trained / "metrics.jsonl")) == STEPS  # the finished run is left alone


def test_resume_with_config_is_refused(cli: Launched, trained: Path):
    proc = cli.result("resume-with-config")
    assert proc.returncode == 2
    assert "--resume" in assert_one_line_error(proc)


# --------------------------------------------------------------------------------------------- sample


def test_sample_from_checkpoint(cli: Launched, trained: Path):
    proc = cli.result("sample-checkpoint-ok")
    assert proc.returncode == 0, proc.stderr
    assert "### hello" in proc.stdout
    assert len(proc.stdout.strip().splitlines()) >= 3  # header, completion, separator


def test_sample_from_base_model(cli: Launched):
    proc = cli.result("sample-base")
    assert proc.returncode == 0, proc.stderr
    assert "### hello" in proc.stdout and "### bye" in proc.stdout
    assert proc.stdout.count("---") == 4  # 2 prompts x n=2


# --------------------------------------------------------------------------------------- user mistakes


@pytest.mark.parametrize("name", MISTAKES)
def test_user_mistake_is_one_line(name: str, cli: Launched):
    proc = cli.result(name)
    assert proc.returncode == 2
    assert MISTAKES[name][1] in assert_one_line_error(proc)


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_bad_run_input_is_one_line_and_leaves_no_run(name: str, cli: Launched):
    proc = cli.result(f"bad-{name}")
    assert proc.returncode == 2
    assert BAD_INPUTS[name][1] in assert_one_line_error(proc)
    # a run that never started must not claim its name: fixing the mistake and rerunning just works
    assert not (cli.runs / f"bad-{name}" / "config.yaml").exists()


@pytest.mark.parametrize("name", BAD_ADAPTER_CONFIGS)
def test_malformed_adapter_config_is_one_line(name: str, cli: Launched):
    command = "init-adapter" if name in INIT_ADAPTER_CASES else "sample-adapter"
    proc = cli.result(f"{command}-{name}")
    assert proc.returncode == 2
    line = assert_one_line_error(proc)
    assert str(cli.runs / f"adapter-{name}") in line and BAD_ADAPTER_CONFIGS[name][1] in line, line
    if command == "init-adapter":
        assert not (cli.runs / f"init-{name}").exists()


def test_data_that_is_not_utf8_names_file_and_line(cli: Launched):
    proc = cli.result("data-not-utf8")
    assert proc.returncode == 2
    line = assert_one_line_error(proc)
    assert f"{cli.runs / 'latin1.jsonl'}:3:" in line and "line 3" in line and "not UTF-8" in line, line
    assert not (cli.runs / "latin1").exists()


@pytest.mark.parametrize("name", ["name-parent", "name-absolute"])
def test_run_name_that_is_a_path_is_refused_and_writes_nothing(name: str, cli: Launched):
    proc = cli.result(name)
    assert proc.returncode == 2
    assert "config field 'run.name': must be a plain name" in assert_one_line_error(proc)
    # `--name ../x` under runs/sub would land in runs/x, an absolute name anywhere at all
    assert not (cli.runs / "x").exists() and not (cli.runs / "abs").exists()
    assert not list((cli.runs / "sub").iterdir())


# ---------------------------------------------------------------------------------------------- help


def test_top_level_help(env: dict[str, str]):
    proc = purplerl("--help", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "attack" in proc.stdout and "sample" in proc.stdout


def settings_of(help_text: str) -> dict[str, list[str]]:
    """The settings table of a --help: {section header: its field options} (dotted settings; an option that
    expands into settings, such as `--reward NAME`, is not one). The fields listed under their setting (a term's
    parameters, the optimizer's fields) are `    KEY ...` rows: their option is --HEADER.KEY."""
    table: dict[str, list[str]] = {}
    header = ""
    for line in help_text.split("Settings:", 1)[1].splitlines()[1:]:
        if line.startswith("    "):
            table[header].append(f"--{header}.{line.split()[0]}")
        elif line.startswith("  --"):
            if "." in line.split()[0]:
                table[header].append(line.split()[0])
        elif line.strip():
            header = line.split(":")[0]
            table[header] = []
    return table


def test_attack_help_lists_config_fields_by_section(env: dict[str, str]):
    proc = purplerl("attack", "--help", env=env)
    assert proc.returncode == 0, proc.stderr
    # the toxicity term's label is read only with an HF classifier, so the defaults' --help leaves it out
    for text in ("--config", "--resume", "--reward.kl_beta (--kl_beta)", "--training.lr (--lr)",
                 "    model (--toxicity_model) [default", "--sampling.group_size (--group_size)",
                 "--run.save_every", "--reward NAME writes a named reward"):
        assert text in proc.stdout, text
    assert "--reward.terms.toxicity.params.label" not in proc.stdout
    table = settings_of(proc.stdout)
    # in the order a run uses them: the parameters of the terms in use, then the attack's own, then the bookkeeping
    assert list(table) == ["engine", "model", "sampling", "training", "training.optimizer", "data", "reward",
                           "reward.terms.toxicity.params", "reward.terms.repetition.params", "attack", "logging", "run"]
    assert "--reward.kl_beta" in table["reward"]
    assert "--reward.terms.toxicity.params.url" in table["reward.terms.toxicity.params"]
    from purplerl.config import field_help, load_command_config
    from purplerl.recipes import RECIPES

    attack = RECIPES["attack"].command()
    shown = field_help(attack.schema, attack.defaults, settings=load_command_config(attack))
    # a term's parameters are listed, but they are the term's settings, not the recipe's (test_recipe_table.py)
    recipes = sum(len(rows) for where, rows in table.items()
                  if not where.startswith("reward.terms.") and where != "training.optimizer")
    assert recipes == len(shown)


@pytest.mark.parametrize(("command", "sections"), [
    ("sample", ["model", "sampling", "data", "sample"]),
    ("eval", ["model", "sampling", "data", "eval", "judges", "utility"]),
    ("data prepare", ["prepare"]),
])
def test_each_command_lists_only_its_own_sections(env: dict[str, str], command: str, sections: list[str]):
    proc = purplerl(*command.split(), "--help", env=env)
    assert proc.returncode == 0, proc.stderr
    table = settings_of(proc.stdout)
    assert list(table) == sections
    options = [option for rows in table.values() for option in rows]
    assert "--training.lr" not in options and "--reward.kl_beta" not in options
    assert "--sampling.max_new_tokens" in options or command == "data prepare"


def test_sample_help(env: dict[str, str]):
    proc = purplerl("sample", "--help", env=env)
    assert proc.returncode == 0, proc.stderr
    for text in ("--sample.checkpoint (--checkpoint)", "--model.name (--model)", "--sample.prompts (--prompt)",
                 "--sampling.max_new_tokens (--max_new_tokens) [default 48]", "--data.system_prompt (--system_prompt)"):
        assert text in proc.stdout, text


def test_tamper_help_adds_its_sections_to_the_attacks(env: dict[str, str]):
    proc = purplerl("tamper-test", "--help", env=env)
    assert proc.returncode == 0, proc.stderr
    table = settings_of(proc.stdout)
    assert {"training", "reward", "tamper", "utility"} <= set(table)
    assert "--utility.limit (--utility_limit) [default 40]" in proc.stdout  # tamper-test's own default


def test_console_script(env: dict[str, str]):
    script = Path(sys.executable).parent / "purplerl"
    if not script.is_file():
        pytest.skip("the purplerl console script is not installed next to this python")
    proc = subprocess.run([str(script), "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "attack" in proc.stdout
