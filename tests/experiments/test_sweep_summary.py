"""The sweep's numbers (intervals over seeds, final values, the template-collapse flag), its written summary, and
what a run's task does around its command: thread budget, environment, error line, and dying with its worker."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from purplerl.experiments.sweep.report import csv_text, html_report, text_table
from purplerl.experiments.sweep.summary import (
    configurations,
    final_value,
    flag_collapse,
    low_diversity,
    t_interval,
)
from purplerl.experiments.sweep.task import RunSpec, error_line, run_env, thread_budget, train_command

T_975 = {2: 12.706204736174707, 3: 4.302652729911275}  # Student-t 0.975 quantiles, 1 and 2 degrees of freedom


def test_t_interval_by_hand() -> None:
    # [1, 2, 3]: mean 2, s = 1, n = 3 -> 2 +- 4.3027 / sqrt(3) = 2 +- 2.4841
    ci = t_interval([1.0, 2.0, 3.0])
    assert ci["mean"] == 2.0 and ci["n"] == 3 and not ci["clipped"]
    assert ci["low"] == pytest.approx(2 - T_975[3] / 3 ** 0.5) and ci["high"] == pytest.approx(4.48413, abs=1e-5)
    # two seeds, 0.2 and 0.4: s = 0.1414, half = 12.706 x 0.1414 / sqrt(2) = 1.2706
    two = t_interval([0.2, 0.4])
    assert (two["low"], two["high"]) == (pytest.approx(0.3 - T_975[2] * 0.1), pytest.approx(0.3 + T_975[2] * 0.1))


def test_a_bounded_metric_keeps_its_interval_inside_its_range() -> None:
    # 0, 0.5, 1: mean 0.5, s = 0.5 -> 0.5 +- 1.2421 = [-0.742, 1.742], clipped to [0, 1]
    ci = t_interval([0.0, 0.5, 1.0], bounds=(0.0, 1.0))
    assert (ci["mean"], ci["low"], ci["high"], ci["clipped"]) == (0.5, 0.0, 1.0, True)
    assert t_interval([0.4, 0.5, 0.6], bounds=(0.0, 1.0))["clipped"] is False
    assert t_interval([0.7]) == {"mean": 0.7, "low": None, "high": None, "n": 1, "clipped": False}
    assert t_interval([])["mean"] is None


def test_the_final_value_is_the_mean_of_the_last_logged_steps() -> None:
    rows = [{"step": 1, "r": 1.0}, {"step": 2}, {"step": 3, "r": 3.0}, {"step": 4, "r": 5.0}, {"step": 5, "r": "nan"}]
    assert final_value(rows, "r", window=2) == 4.0  # steps 3 and 4; step 2 has no value, step 5 is not a number
    assert final_value(rows, "r", window=10) == 3.0 and final_value(rows, "missing", 5) is None


DIVERSE = {"unique_fraction": 1.0, "mean_jaccard": 0.2, "distinct_2": 0.8, "self_bleu": 0.1, "degenerate": False}


def _record(name: str, config: str, reward: float | None, distinct_2: float | None, degenerate: bool = False,
            status: str = "finished") -> dict:
    diversity = None if distinct_2 is None else {**DIVERSE, "distinct_2": distinct_2, "degenerate": degenerate}
    return {"name": name, "configuration": config, "seed": int(name[-1]), "point": {"training.lr": config},
            "status": status, "error": None if status == "finished" else "boom",
            "final": {} if status != "finished" else {"reward/mean": reward},
            "diversity": diversity, "base_diversity": DIVERSE}


def test_template_collapse_is_high_reward_with_low_diversity() -> None:
    assert low_diversity({**DIVERSE, "distinct_2": 0.39}, DIVERSE, 0.5)  # below half the base's 0.8
    assert not low_diversity({**DIVERSE, "distinct_2": 0.4}, DIVERSE, 0.5)
    assert low_diversity({**DIVERSE, "degenerate": True}, DIVERSE, 0.5)
    records = [_record("a_s0", "a", 0.9, 0.1), _record("a_s1", "a", 0.2, 0.1),  # low diversity, high / low reward
               _record("b_s0", "b", 0.8, 0.8), _record("b_s1", "b", 0.7, 0.7, degenerate=True),
               _record("c_s0", "c", None, 0.1), _record("c_s1", "c", 0.1, None)]
    flag_collapse(records, "reward/mean", 0.5)
    # median of the 5 rewards (0.9, 0.2, 0.8, 0.7, 0.1) is 0.7: a_s0 and b_s1 (degenerate) reach it
    assert [r["collapse"] for r in records] == [True, False, False, True, None, None]


def _summary() -> dict:
    records = [_record("a_s0", "a", 0.9, 0.1), _record("a_s1", "a", 0.5, 0.5),
               _record("b_s0", "b", 0.3, 0.8), _record("b_s1", "b", None, None, status="failed")]
    flag_collapse([r for r in records if r["status"] == "finished"], "reward/mean", 0.5)
    return {"recipe": "attack", "grid": ["training.lr"], "seeds": [0, 1], "metrics": ["reward/mean"],
            "method": "t", "collapse_rule": "rule <b>",
            "configurations": configurations(records, ["reward/mean"], {"reward/mean": (0.0, 1.0)}, True),
            "runs": records}


def test_each_configuration_sums_its_seeds_and_names_its_failures() -> None:
    a, b = _summary()["configurations"]
    assert (a["configuration"], a["finished"], a["failed"], b["finished"], b["failed"]) == ("a", 2, [], 1, ["b_s1"])
    assert a["metrics"]["reward/mean"]["mean"] == pytest.approx(0.7)
    # 0.9, 0.5: half-width 12.706 x 0.2828 / sqrt(2) = 2.54, clipped to the declared range [0, 1]
    assert (a["metrics"]["reward/mean"]["low"], a["metrics"]["reward/mean"]["high"]) == (0.0, 1.0)
    assert a["metrics"]["diversity/distinct_2"]["mean"] == pytest.approx(0.3)
    # the median reward is 0.5: a_s0 (0.9, distinct-2 0.1 < 0.5 x 0.8) collapsed; a_s1 (0.5, distinct-2 0.5) did not
    assert a["collapse"] == {"runs": 1, "judged": 2} and b["collapse"] == {"runs": 0, "judged": 1}


def test_the_summary_as_text_csv_and_html() -> None:
    summary = _summary()
    text = text_table(summary)
    assert "TEMPLATE COLLAPSE 1/2" in text and "b_s1: failed: boom" in text
    assert "0.700 [0.000, 1.000]" in text and "0.300 (1 seed)" in text
    rows = list(csv.DictReader(io.StringIO(csv_text(summary))))
    assert rows[0]["configuration"] == "a" and rows[0]["training.lr"] == "a"
    assert float(rows[0]["reward/mean_mean"]) == pytest.approx(0.7) and rows[1]["reward/mean_low"] == ""
    assert (rows[0]["collapse_runs"], rows[1]["failed"]) == ("1", "1")
    page = html_report(summary)
    assert "rule &lt;b&gt;" in page and "<b>" not in page


def test_a_run_gets_its_whole_cores_as_threads_over_any_inherited_budget_and_only_its_gpus() -> None:
    assert [thread_budget(c) for c in (None, 0.25, 1.0, 2.0, 2.9)] == [1, 1, 1, 2, 2]
    env = run_env({"OMP_NUM_THREADS": "16", "PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0"}, {"PURPLERL_CACHE": "/c"},
                  2, 0.5)
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["PURPLERL_CACHE"], env["PATH"]) == ("2", "2", "/c",
                                                                                                   "/bin")
    assert env["TOKENIZERS_PARALLELISM"] == "false" and env["CUDA_VISIBLE_DEVICES"] == "0"  # Ray's choice, kept
    assert run_env({"CUDA_VISIBLE_DEVICES": "0,1"}, {}, 1, 0.0)["CUDA_VISIBLE_DEVICES"] == ""  # no share, no GPU


def test_a_failed_commands_error_line_and_a_new_or_resumed_run(tmp_path: Path) -> None:
    assert error_line("loading...\nerror: data file not found: x.jsonl\n", 2) == "data file not found: x.jsonl"
    assert error_line("Traceback\nKeyError: 'x'\n", 1) == "KeyError: 'x'"
    assert error_line("", -9) == "exited with code -9"
    spec = RunSpec("r", "attack", str(tmp_path / "r.yaml"), str(tmp_path / "runs" / "r"), str(tmp_path / "r.log"),
                   None)
    assert train_command(spec)[-4:] == ["purplerl", "attack", "--config", spec.config_file]
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r" / "config.yaml").write_text("recipe: attack\n")
    assert train_command(spec)[-4:] == ["purplerl", "attack", "--resume", spec.run_dir]


PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-m", "purplerl.experiments.sweep.child", sys.executable, "-c",
                          "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.process
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_runs_process_dies_with_the_worker_that_started_it() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    time.sleep(0.5)  # the wrapper has exec'd the sleeper
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by init, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
