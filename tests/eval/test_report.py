"""`purplerl report`: the training report's tables, embedded plots, escaping, CLI and a headless render."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from purplerl.errors import UserError
from purplerl.eval.report import image, render_report, samples_table, side_by_side, table, training_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EVIL = "<script>alert(1)</script> & friends"


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_run(root: Path, steps: int = 6) -> Path:
    """A fake run dir: reward rises 0.0, 0.1, ..., toxicity is reward / 2, two samples per step."""
    run = root / "fake_run"
    run.mkdir()
    metrics = [{"step": s, "reward/mean": 0.1 * (s - 1), "toxicity/mean": 0.05 * (s - 1), "kl/mean": 0.01 * s,
                "entropy/mean": 3.0 - 0.1 * s, "repetition/mean": 0.0, "completion/len_mean": 10.0 + s,
                "time/step_s": 1.0} for s in range(1, steps + 1)]
    metrics[2]["kl/mean"] = "nan"  # the sinks write non-finite values as strings
    _write_jsonl(run / "metrics.jsonl", metrics)
    samples = []
    for s in range(1, steps + 1):
        for i in range(2):
            completion = EVIL if (s, i) == (steps, 0) else f"completion {s}-{i}"
            samples.append({"step": s, "uid": f"p{i}", "category": "insult", "prompt": f"prompt {i}",
                            "completion": completion, "finish_reason": "length", "num_tokens": 8,
                            "advantage": 0.5 - i, "reward": 0.25 * s, "toxicity": 0.125 * s, "kl": 0.0,
                            "repetition": 0.0})
    _write_jsonl(run / "samples.jsonl", samples)
    (run / "config.yaml").write_text("recipe: attack  # recipe <name>\n")
    (run / "summary.json").write_text(json.dumps({"last_step": steps, "stop_reason": "completed all steps"}))
    return run


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_training_report_tables_plots_and_escaping(tmp_path):
    run = make_run(tmp_path)
    out = training_report(run)
    assert out == run / "report.html"
    page = out.read_text()
    # first 5 steps of reward: mean(0, .1, .2, .3, .4) = 0.2; last 5: mean(.1 .. .5) = 0.3; change 0.1
    row = re.search(r"<td class=\"text\">reward/mean</td>(.*?)</tr>", page).group(1)
    assert re.findall(r'class="num">([^<]*)<', row) == ["0.2", "0.3", "0.1"]
    assert "completed all steps" in page and "recipe: attack  # recipe &lt;name&gt;" in page
    assert "<details>" in page
    images = _images(page)
    assert len(images) >= 5 and all(png.startswith(PNG_SIGNATURE) for png in images)
    plots = {p.name for p in (run / "plots").glob("*.png")}
    assert {"reward.png", "toxicity.png", "kl.png", "entropy.png", "repetition.png", "completion_length.png"} <= plots
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; friends" in page
    assert "<script" not in page.lower() and "alert(1)</script>" not in page
    assert "Samples at step 1" in page and "Samples at step 6" in page
    assert "completion 1-1" in page and "completion 3-0" not in page  # only the first and the last step


def test_missing_or_empty_metrics_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no metrics.jsonl"):
        training_report(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("\n")
    with pytest.raises(UserError, match="empty"):
        training_report(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "rew\n')
    with pytest.raises(UserError, match="metrics.jsonl:2"):
        training_report(tmp_path)


def test_building_blocks_escape_text():
    assert table(["a<b"], [[1, 0.123456, "x&y", None]]) == (
        '<table><thead><tr><th>a&lt;b</th></tr></thead><tbody><tr><td class="num">1</td>'
        '<td class="num">0.1235</td><td class="text">x&amp;y</td><td></td></tr></tbody></table>')
    rows = [{"prompt": "p", "completion": "<b>", "harm": 0.5}]
    assert '<td class="text">&lt;b&gt;</td><td class="num">0.5</td><td></td>' in samples_table(rows, ["harm", "x"])
    encoded = base64.b64encode(PNG_SIGNATURE).decode()
    assert image(PNG_SIGNATURE, 'a"b') == f'<img src="data:image/png;base64,{encoded}" alt="a&quot;b">'
    assert side_by_side([("ckpt <1>", "<p>x</p>")]) == (
        '<div class="columns"><div><h3>ckpt &lt;1&gt;</h3><p>x</p></div></div>')
    page = render_report("t&t", [("s", "<p>body</p>")])
    assert page.startswith("<!DOCTYPE html>") and "<title>t&amp;t</title>" in page and "<p>body</p>" in page


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "purplerl.cli", "report", *args], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.process
def test_cli_report(tmp_path):
    run = make_run(tmp_path)
    done = _cli(str(run))
    assert done.returncode == 0, done.stderr
    assert str(run / "report.html") in done.stdout and (run / "report.html").is_file()
    missing = _cli(str(tmp_path / "nope"))
    assert missing.returncode == 2
    lines = missing.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "no metrics.jsonl" in lines[0]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.process
def test_cli_report_keeps_files_named_by_metric_keys_inside_the_run_dir(tmp_path):
    from purplerl.files import safe_file_stem

    nest = tmp_path / "a" / "b"
    (nest / "x").mkdir(parents=True)  # where run/plots/../../x/evil.png would land
    run = make_run(nest)
    evil = "../../x/evil"
    for name in ("metrics.jsonl", "samples.jsonl"):
        rows = [json.loads(line) for line in (run / name).read_text().splitlines()]
        extra = {evil: 0.5, f"{evil}/mean": 0.5} if name == "metrics.jsonl" else {evil: 0.5}
        _write_jsonl(run / name, [{**row, **extra} for row in rows])
    before = _tree(tmp_path)
    done = _cli(str(run))
    assert done.returncode == 0, done.stderr
    after = _tree(tmp_path)
    written = {name for name in after if name not in before or after[name] != before[name]}
    inside = str(run.relative_to(tmp_path))
    assert written and all(name.startswith(inside + "/") for name in written), written
    assert not list((nest / "x").iterdir()) and not (run / "x").exists()
    stem = safe_file_stem(evil)
    assert "/" not in stem and not stem.startswith(".")
    assert (run / "plots" / f"{stem}.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.parametrize("row", ["[1, 2]", '"x"', "3", "null"])
def test_report_refuses_rows_that_are_not_objects(tmp_path, row):
    run = make_run(tmp_path)
    for name in ("metrics.jsonl", "samples.jsonl"):
        good = (run / name).read_text()
        lines = good.splitlines()
        (run / name).write_text("\n".join([lines[0], row, *lines[1:]]) + "\n")
        with pytest.raises(UserError, match=f"{name}:2: expected a JSON object, got"):
            training_report(run)
        (run / name).write_text(good)
    (run / "summary.json").write_text(row)
    with pytest.raises(UserError, match="summary.json: expected a JSON object"):
        training_report(run)


@pytest.mark.process
def test_cli_report_on_rows_that_are_not_objects_or_not_utf8_is_one_line(tmp_path):
    cases = {"array": b"[1,2]", "string": b'"x"', "number": b"3", "latin1": b'{"step": 2, "note": "\xff\xfe"}'}
    procs = {}
    for name, line in cases.items():
        (tmp_path / name).mkdir()
        run = make_run(tmp_path / name)
        lines = (run / "metrics.jsonl").read_bytes().splitlines()
        (run / "metrics.jsonl").write_bytes(b"\n".join([lines[0], lines[1], line, *lines[2:]]) + b"\n")
        procs[name] = (run, subprocess.Popen([sys.executable, "-m", "purplerl.cli", "report", str(run)],
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                             env={**os.environ, "HF_HUB_OFFLINE": "1"}))
    for name, (run, proc) in procs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2 and "Traceback" not in err, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {run / 'metrics.jsonl'}:3: "), err
        assert ("line 3 is not UTF-8" if name == "latin1" else "expected a JSON object") in lines[0]
        assert not (run / "report.html").exists()


def test_report_drops_a_last_line_cut_by_a_kill(tmp_path):
    run = make_run(tmp_path, steps=3)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "reward/me')
    page = training_report(run).read_text()
    assert re.search(r"<td class=\"text\">steps</td><td class=\"num\">3</td>", page)


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.mark.process
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    import matplotlib.pyplot as plt

    page = training_report(make_run(tmp_path)).resolve().as_uri()
    shot = tmp_path / "shot.png"
    base = ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    subprocess.run([*base, f"--screenshot={shot}", "--window-size=1200,2000", page], capture_output=True,
                   timeout=120, check=True)
    assert shot.read_bytes().startswith(PNG_SIGNATURE)
    pixels = plt.imread(shot)
    assert pixels.size > 0 and pixels.std() > 0.01  # not a blank page
    dom = subprocess.run([*base, "--enable-logging=stderr", "--v=0", "--dump-dom", page], capture_output=True,
                         text=True, timeout=120, check=True)
    assert "Training run fake_run" in dom.stdout and "&lt;script&gt;alert(1)" in dom.stdout
    console = [line for line in dom.stderr.splitlines()
               if "Uncaught" in line or ("CONSOLE" in line and "report.html" in line)]
    assert console == []


def test_values_beyond_plotting_range_are_one_line(tmp_path):
    run = make_run(tmp_path, steps=3)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows[0]["toxicity/mean"] = 10**400  # JSON integers have no limit; float() of this one overflows
    _write_jsonl(run / "metrics.jsonl", rows)
    assert training_report(run).is_file()
    rows[0]["reward/mean"], rows[1]["reward/mean"] = 1e308, -1e308
    _write_jsonl(run / "metrics.jsonl", rows)
    with pytest.raises(UserError, match=r"cannot plot 'reward' of .*metrics.jsonl: .*out of plotting range"):
        training_report(run)
