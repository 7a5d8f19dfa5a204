"""`purplerl sweep`'s settings and plan: the command line, the grid x seeds, run names, and the checks that stop a
mistake before any run starts (no Ray here)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from pathlib import Path

import pytest
from conftest import invoke_cli

from purplerl.errors import UserError
from purplerl.experiments.sweep.plan import describe, plan_sweep, render
from purplerl.experiments.sweep.settings import load_sweep, split_args, split_values
from purplerl.experiments.sweep.state import first_difference, record_outcome, to_run, write_configs
from purplerl.recipes import RECIPES
from purplerl.rewards.named import weights


def test_grid_and_fixed_come_repeated_or_listed_after_one_option() -> None:
    path, grid, fixed, rest = split_args(["sweep.yaml", "--grid", "lr=1e-5,3e-5", "kl_beta=0.01", "--fixed",
                                          "steps=5", "--seeds", "0,1", "--grid=seed_like=[a,b],[c]"])
    assert path == Path("sweep.yaml")
    assert grid == {"lr": ["1e-5", "3e-5"], "kl_beta": ["0.01"], "seed_like": ["[a,b]", "[c]"]}
    assert fixed == {"steps": "5"} and rest == ["--seeds", "0,1"]
    assert split_values("[q_proj,v_proj],[q_proj],{a: 1, b: 2}") == ["[q_proj,v_proj]", "[q_proj]", "{a: 1, b: 2}"]


@pytest.mark.parametrize(("args", "message"), [
    (["--grid", "lr"], "--grid takes KEY=VALUE, got 'lr'"),
    (["--grid", "lr=1", "--grid", "lr=2"], "--grid lr is given twice"),
    (["a.yaml", "b.yaml"], "unexpected argument 'b.yaml'"),
    (["--fixed"], "--fixed needs KEY=VALUE after it"),
])
def test_command_line_mistakes_are_one_line(args: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message.replace("[", r"\[")):
        split_args(args)


def test_the_command_line_adds_to_the_sweep_file(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text("recipe: attack\ngrid: {lr: [1.0e-5, 3.0e-5], kl_beta: [0.1]}\nfixed: {steps: 3}\nseeds: [4]\n")
    settings = load_sweep(None, [str(path), "--grid", "kl_beta=0.2,0.3", "--fixed", "batch_size=2",
                                 "--seeds", "0,1,2", "--cpus_per_run", "2"])
    assert settings.grid == {"lr": [1e-5, 3e-5], "kl_beta": ["0.2", "0.3"]}  # the command line's value wins
    assert settings.fixed == {"steps": 3, "batch_size": "2"}
    assert settings.seeds == [0, 1, 2] and settings.resources.cpus_per_run == 2
    with pytest.raises(UserError, match="unknown option --steps .*; a recipe setting goes in --fixed KEY=VALUE"):
        load_sweep(None, ["--recipe", "attack", "--steps", "3"])


def test_the_example_sweep_file_plans_its_runs(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "sweeps" / "attack.yaml"
    runs = plan_sweep(load_sweep(None, [str(example), "--out", str(tmp_path / "out")]))
    assert len(runs) == 2 * 2 * 3 and runs[-1].name == "attack_lr0.0005_kl_beta0.1_s2"
    assert runs[-1].config.training.steps == 40 and runs[-1].config.reward.terms["refusal"].weight == -1.0


def _plan(tmp_path: Path, *args: str) -> list:
    return plan_sweep(load_sweep(None, ["--out", str(tmp_path / "sweep"), *args]))


def test_the_grid_times_the_seeds_each_run_named_after_its_swept_values(tmp_path: Path) -> None:
    runs = _plan(tmp_path, "--recipe", "attack", "--grid", "lr=1e-5,3e-5", "reward.kl_beta=0.01,0.02",
                 "--fixed", "steps=3", "sampling.max-new-tokens=8", "--seeds", "0,1")
    assert len(runs) == 2 * 2 * 2
    assert [run.name for run in runs[:3]] == ["attack_lr1e-05_kl_beta0.01_s0", "attack_lr1e-05_kl_beta0.01_s1",
                                              "attack_lr1e-05_kl_beta0.02_s0"]
    last = runs[-1]
    assert last.label == "attack_lr3e-05_kl_beta0.02" and last.seed == 1
    # the command line's text is read as the recipe reads it: '3e-5' is the float 3e-05
    assert last.point == {"training.lr": 3e-05, "reward.kl_beta": 0.02}
    config = last.config
    assert (config.training.lr, config.reward.kl_beta, config.training.seed, config.training.steps,
            config.sampling.max_new_tokens) == (3e-05, 0.02, 1, 3, 8)
    assert Path(config.run.output_dir) == (tmp_path / "sweep" / "runs").resolve() and config.run.name == last.name
    listing = describe(runs)
    assert listing.splitlines()[0] == "8 runs (4 configurations x 2 seeds):"
    assert "  attack_lr3e-05_kl_beta0.02_s1  (training.lr=3e-05, reward.kl_beta=0.02)" in listing


def test_text_values_and_keys_into_a_mapping_name_runs_readably(tmp_path: Path) -> None:
    runs = _plan(tmp_path, "--recipe", "attack", "--grid", "data=builtin:redteam,/some/dir/prompts.jsonl",
                 "reward.terms.repetition=-0.1,-0.3")
    assert [run.name for run in runs] == [
        "attack_data-redteam_reward.terms.repetition-0.1_s0", "attack_data-redteam_reward.terms.repetition-0.3_s0",
        "attack_data-prompts.jsonl_reward.terms.repetition-0.1_s0",
        "attack_data-prompts.jsonl_reward.terms.repetition-0.3_s0"]
    assert weights(runs[1].config.reward.terms) == {"toxicity": 1.0, "repetition": -0.3, "refusal": 0.0}
    assert (render(True), render(None), render([1, "a b"]), render(2.5e-4)) == ("true", "none", "1,-a-b", "0.00025")


@pytest.mark.parametrize(("args", "message"), [
    (["--grid", "lrr=1,2"], "grid key 'lrr' is not a setting of recipe 'attack' (see purplerl attack --help)"),
    (["--grid", "training.lrr=1"], "grid key 'training.lrr' is not a setting of recipe 'attack'"),
    (["--fixed", "training=1"], "fixed key 'training' names the section training: sweep one of its settings"),
    (["--grid", "training.lr.x=1"], "grid key 'training.lr.x': training.lr is a single setting, not a section"),
    (["--grid", "seed=1,2"], "grid key 'seed': training.seed is set by seeds (--seeds 0,1,2)"),
    (["--fixed", "name=x"], "fixed key 'name': run.name is set by the sweep's run names"),
    (["--grid", "lr=1e-4,-1"], "the run with training.lr=-1, seed 0: config field 'training.lr': Input should be "
                               "greater than 0 (got -1)"),
    (["--grid", "lr=1e-4", "--fixed", "training.lr=1e-3"], "training.lr is both swept (grid) and fixed"),
    (["--grid", "lr=1e-4", "training.lr=1e-3"], "grid names training.lr twice"),
    (["--grid", "data=a/x.jsonl,b/x.jsonl"], "two runs would share the name attack_data-x.jsonl_s0"),
    (["--grid", "reward=happy_binary", "--fixed", "reward.terms={toxicity: 1}"],
     "the sweep names a reward and sets reward.terms: give one of them"),
    (["--grid", "rewards_file=a.yaml"], "grid: sweep named rewards with reward=NAME1,NAME2"),
    (["--grid", "reward=no_such_reward"], "unknown reward 'no_such_reward' (named: "),
])
def test_a_mistake_stops_the_sweep_before_any_run_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    with pytest.raises(UserError) as err:
        _plan(tmp_path, "--recipe", "attack", *args)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_named_rewards_are_swept_by_name_as_the_recipes_reward_option_takes_them(tmp_path: Path) -> None:
    from purplerl.rewards.named import catalogue, expand

    runs = _plan(tmp_path, "--recipe", "attack", "--grid", "reward=sentence_length_5,happy_binary")
    assert [run.name for run in runs] == ["attack_reward-sentence_length_5_s0", "attack_reward-happy_binary_s0"]
    assert runs[1].point == {"reward": "happy_binary"}
    built = _plan(tmp_path, "--recipe", "attack", "--fixed", "reward.terms=" + json.dumps(
        expand("happy_binary", catalogue())))[0].config
    assert runs[1].config.reward.terms == built.reward.terms  # what `--reward happy_binary` would have run
    with pytest.raises(UserError, match="grid key 'reward': recipe 'sft' has no reward.terms to name a reward for"):
        _plan(tmp_path, "--recipe", "sft", "--grid", "reward=happy_binary")


def test_a_recipe_must_be_named_and_known(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="name the recipe swept"):
        _plan(tmp_path)
    with pytest.raises(UserError, match="unknown recipe 'atack' \\(known: attack, "):
        _plan(tmp_path, "--recipe", "atack")


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_recipe_of_the_table_can_be_swept(tmp_path: Path, recipe: str) -> None:
    runs = _plan(tmp_path, "--recipe", recipe, "--grid", "lr=1e-4,2e-4", "--seeds", "0,1")
    assert [run.name for run in runs] == [f"{recipe}_lr0.0001_s0", f"{recipe}_lr0.0001_s1", f"{recipe}_lr0.0002_s0",
                                          f"{recipe}_lr0.0002_s1"]
    assert all(run.config.recipe == recipe for run in runs)


def test_runs_start_from_the_recipe_config_file(tmp_path: Path) -> None:
    base = tmp_path / "attack.yaml"
    base.write_text("training: {steps: 7, batch_size: 2}\nsampling: {group_size: 2}\n")
    (run,) = _plan(tmp_path, "--recipe", "attack", "--recipe_config", str(base), "--fixed", "steps=9")
    assert (run.name, run.config.training.steps, run.config.training.batch_size) == ("attack_s0", 9, 2)
    base.write_text("recipe: sft\n")
    with pytest.raises(UserError, match="is a config of recipe 'sft', not 'attack'"):
        _plan(tmp_path, "--recipe", "attack", "--recipe_config", str(base))


def test_a_rerun_with_other_settings_is_refused_and_outcomes_decide_what_runs(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    runs = _plan(tmp_path, "--recipe", "attack", "--grid", "lr=1e-4,2e-4,3e-4", "--fixed", "steps=3")
    write_configs(out, runs)
    write_configs(out, runs)  # the same plan again: nothing to refuse
    changed = _plan(tmp_path, "--recipe", "attack", "--grid", "lr=1e-4", "--fixed", "steps=4")
    with pytest.raises(UserError, match="run attack_lr0.0001_s0 in .* was planned with training.steps=3, now 4"):
        write_configs(out, changed)
    record_outcome(out, {"name": runs[0].name, "status": "finished"})
    record_outcome(out, {"name": runs[1].name, "status": "failed", "error": "boom"})
    start, kept = to_run(out, runs, retry_failed=False)
    assert [r.name for r in start] == [runs[2].name] and [r.name for r in kept] == [runs[0].name, runs[1].name]
    start, kept = to_run(out, runs, retry_failed=True)
    assert [r.name for r in start] == [runs[1].name, runs[2].name] and [r.name for r in kept] == [runs[0].name]
    assert first_difference({"a": {"b": 1, "c": [1]}}, {"a": {"b": 1, "c": [1]}}) is None
    assert first_difference({"a": {"b": 1}}, {"a": {"b": 1, "d": 2}}) == ("a.d", None, 2)


@pytest.mark.process
def test_the_command_lists_the_runs_and_stops_on_a_typo_with_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    def sweep(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "purplerl", "sweep", "--recipe", "attack", "--out",
                               str(tmp_path / "out"), *args], capture_output=True, text=True, timeout=120)

    listed = sweep("--grid", "lr=1e-5,3e-5", "--seeds", "0,1", "--dry-run")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == ["4 runs (2 configurations x 2 seeds):",
                                          "  attack_lr1e-05_s0  (training.lr=1e-05)",
                                          "  attack_lr1e-05_s1  (training.lr=1e-05)",
                                          "  attack_lr3e-05_s0  (training.lr=3e-05)",
                                          "  attack_lr3e-05_s1  (training.lr=3e-05)"]
    typo = sweep("--grid", "lrr=1e-5", "--dry-run")
    assert typo.returncode == 2 and typo.stderr.strip().splitlines() == [
        "error: grid key 'lrr' is not a setting of recipe 'attack' (see purplerl attack --help)"]
    assert not (tmp_path / "out").exists()


def test_an_address_that_answers_nothing_is_refused_at_once() -> None:
    from purplerl.experiments.sweep.execute import _check_reachable

    port = _closed_port()
    with pytest.raises(UserError, match=f"cannot reach the Ray cluster at --address 127.0.0.1:{port}: "):
        _check_reachable(f"127.0.0.1:{port}")
    _check_reachable("auto")  # Ray finds the cluster itself


def test_a_grid_past_max_runs_is_refused_before_any_run_is_planned(tmp_path: Path) -> None:
    """A 10^6-run grid was planned eagerly: no output after 300 s. It is counted first, against max_runs."""
    ten = ",".join(str(i) for i in range(1, 11))
    keys = ["steps", "batch_size", "group_size", "max_new_tokens", "save_every", "training.max_grad_norm"]
    start = time.perf_counter()
    with pytest.raises(UserError) as err:
        _plan(tmp_path, "--recipe", "attack", "--grid", *(f"{key}={ten}" for key in keys))
    assert str(err.value) == ("the sweep has 1000000 runs (10 x 10 x 10 x 10 x 10 x 10 x 1 seeds), more than "
                              "max_runs=1000: sweep fewer values, or raise --max_runs")
    assert time.perf_counter() - start < 5
    assert len(_plan(tmp_path, "--recipe", "attack", "--grid", f"steps={ten}", "--seeds", "0,1",
                     "--max_runs", "20")) == 20


class _QuietHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # the command's stderr is under test
        pass


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # free again once closed: nothing listens there


def test_a_refused_sweep_writes_nothing_and_a_wrong_address_is_one_line_at_once(tmp_path: Path) -> None:
    """A sweep refused by its cluster had already written sweep.json and configs/; an --address that answered as
    no Ray cluster (a proxy) took 23 s and 20 lines."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _QuietHandler)  # HTTP/1, as a proxy answers
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for address, says in [(f"127.0.0.1:{_closed_port()}", "cannot reach the Ray cluster at --address {}: "),
                              (f"127.0.0.1:{server.server_address[1]}",
                               "--address {} answers, but not as a Ray cluster: its answer to a Ray GCS call is ")]:
            out = tmp_path / address.replace(":", "_")
            start = time.perf_counter()
            result = invoke_cli("sweep", "--recipe", "attack", "--grid", "lr=1e-4,2e-4", "--address", address,
                                "--out", out)
            assert time.perf_counter() - start < 15
            assert result.returncode == 2
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: " + says.format(address)), result.stderr
            assert not (out / "sweep.json").exists() and not (out / "configs").exists()
    finally:
        server.shutdown()
        server.server_close()
