"""The exported overrides against veRL 0.9.1's own default config and sources, read from its wheel.

The wheel is fetched once with `pip download --no-deps` (seconds) and its config and the few sources named
here are unpacked into a cache dir reused by later runs (PURPLERL_VERL_CACHE, default
~/.cache/purplerl/verl-0.9.1). Hydra itself (veRL's config library) is installed there too, with `pip install
--target` (~20 s, once), to compose the overrides exactly as `verl.trainer.main_ppo` does. Where a package
cannot be obtained the tests that need it skip and say why.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from run_script import run_script

from purplerl.cli import _verl_command
from purplerl.config import load_command_config
from purplerl.verl.export import export_verl
from purplerl.verl.hydra import format_override, parse_override
from purplerl.verl.mapping import ADVANTAGES, KL_ESTIMATORS, LOSS_AGGREGATIONS
from purplerl.verl.validate import GENERATED_CONFIG, override_problems, read_defaults

VERSION = "0.9.1"
HYDRA = "hydra-core==1.3.8"  # veRL 0.9.1 requires hydra-core without a pin; the release its users get
SOURCES = ("verl/trainer/ppo/core_algos.py", "verl/workers/config/actor.py", "verl/trainer/ppo/reward.py")
# every test reads the wheel, which a fresh machine fetches with `pip download` (a process): the process tier
pytestmark = pytest.mark.process


def _unpack(cache: Path) -> None:
    wheel_dir = cache / "wheel"
    done = subprocess.run([sys.executable, "-m", "pip", "download", f"verl=={VERSION}", "--no-deps", "--quiet",
                           "--dest", str(wheel_dir)], capture_output=True, text=True, timeout=300)
    wheels = sorted(wheel_dir.glob(f"verl-{VERSION}-*.whl"))
    if done.returncode != 0 or not wheels:
        reason = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        pytest.skip(f"cannot obtain the verl {VERSION} wheel with pip download: {reason}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        for name in wheel.namelist():
            if name.startswith("verl/trainer/config/") or name in SOURCES:
                wheel.extract(name, cache)


@pytest.fixture(scope="module")
def verl_root() -> Path:
    cache = Path(os.environ.get("PURPLERL_VERL_CACHE", Path.home() / ".cache" / "purplerl" / f"verl-{VERSION}"))
    if not all((cache / name).is_file() for name in (GENERATED_CONFIG, *SOURCES)):
        _unpack(cache)
    return cache


@pytest.fixture(scope="module")
def hydra_path(verl_root) -> Path:
    target = verl_root / "hydra"
    if not (target / "hydra" / "__init__.py").is_file():
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), HYDRA],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            pytest.skip(f"cannot install {HYDRA}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return target


# Composes ppo_trainer.yaml from the wheel's config dir with the override lines, as main_ppo's @hydra.main does,
# and prints each overridden key's composed value.
COMPOSE = """
import json, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
config_dir, lines = sys.argv[1], open(sys.argv[2]).read().splitlines()
with initialize_config_dir(config_dir=config_dir, version_base=None):
    cfg = compose(config_name="ppo_trainer", overrides=lines)
values = {line.partition("=")[0]: OmegaConf.select(cfg, line.partition("=")[0]) for line in lines}
print(json.dumps(OmegaConf.to_container(OmegaConf.create({"v": values}))["v"]))
"""


def _compose(verl_root: Path, hydra_path: Path, lines: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    (tmp_path / "lines.txt").write_text("\n".join(lines) + "\n")
    return subprocess.run([sys.executable, "-c", COMPOSE, str(verl_root / "verl/trainer/config"),
                           str(tmp_path / "lines.txt")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(hydra_path)})


def _exported_overrides(tmp_path: Path, *args: str) -> dict:
    cfg = load_command_config(_verl_command(), None, ["--model", "HuggingFaceTB/SmolLM2-135M-Instruct",
                                                    "--out", str(tmp_path / "exp"), *args])
    export_verl(cfg)
    lines = (tmp_path / "exp" / "overrides.txt").read_text().splitlines()
    return dict(parse_override(line) for line in lines)


def test_the_generated_config_is_the_composed_trainer_config(verl_root):
    # ppo_trainer.yaml composes per-component files with Hydra; the wheel ships the composed result beside it
    trainer = yaml.safe_load((verl_root / "verl/trainer/config/ppo_trainer.yaml").read_text())
    assert "defaults" in trainer
    defaults = read_defaults(verl_root / GENERATED_CONFIG)
    assert defaults["reward"]["custom_reward_function"] == {"path": None, "name": "compute_score"}
    assert defaults["actor_rollout_ref"]["rollout"]["n"] == 1


@pytest.mark.parametrize("args", [
    [],
    ["--reward.kl_in", "loss", "--reward.kl_estimator", "k3", "--training.loss", "ppo_clip",
     "--training.ppo_epochs", "2"],
    ["--training.advantage", "reinforce_pp", "--training.old_logprobs", "sampler", "--top_k", "20"],
    ["--training.advantage", "rloo", "--model.lora_targets", "q_proj,v_proj", "--model.init_adapter", "/a",
     "--verl.rollout", "sglang", "--verl.extra", "trainer.val_before_train=false"],
    ["--model.finetune", "full", "--kl_beta", "0", "--training.advantage", "dr_grpo"],
])
def test_overrides_fit_verls_default_config(verl_root, tmp_path, args):
    overrides = _exported_overrides(tmp_path, *args)
    assert override_problems(overrides, read_defaults(verl_root / GENERATED_CONFIG)) == []


def test_the_check_finds_a_wrong_key_a_wrong_type_and_a_needless_plus(verl_root):
    defaults = read_defaults(verl_root / GENERATED_CONFIG)
    problems = override_problems({"actor_rollout_ref.rollout.nn": 4, "data.train_batch_size": "8",
                                  "actor_rollout_ref.actor.use_kl_loss": 1, "+trainer.nnodes": 2,
                                  "+trainer.purplerl_note": "x", "actor_rollout_ref.rollout.name": "vllm"}, defaults)
    assert problems == [
        "actor_rollout_ref.rollout.nn: no such key in veRL's config (a new key needs '+actor_rollout_ref.rollout.nn')",
        "data.train_batch_size: expects int like 1024, got '8'",
        "actor_rollout_ref.actor.use_kl_loss: expects bool like False, got 1",
        "+trainer.nnodes: the key exists already; '+' would make Hydra refuse it",
    ]


def test_exported_choices_are_names_verl_knows(verl_root):
    core = (verl_root / "verl/trainer/ppo/core_algos.py").read_text()
    actor = (verl_root / "verl/workers/config/actor.py").read_text()
    estimators = set(re.findall(r'^\s+[A-Z_]+ = "([a-z_]+)"$', core, flags=re.M))
    assert set(ADVANTAGES.values()) <= estimators
    for mode in LOSS_AGGREGATIONS.values():
        assert f'"{mode}"' in actor
    for name in KL_ESTIMATORS.values():
        assert f'"{name}"' in core
    # the reward hook: custom_reward_function.path/name, loaded from a file by name
    reward = (verl_root / "verl/trainer/ppo/reward.py").read_text()
    assert 'config.reward.get("custom_reward_function")' in reward


def test_hydra_composes_the_exported_overrides_to_the_values_written(verl_root, hydra_path, tmp_path):
    overrides = _exported_overrides(tmp_path, "--reward.kl_in", "loss", "--model.lora_targets", "q_proj,v_proj",
                                    "--system_prompt", "Be brief.")
    # run_verl.sh puts the export dir in place of the placeholder: a dir with a space must survive Hydra's parser
    lines = [line.replace("@EXPORT_DIR@", "/shared/my runs/exp")
             for line in (tmp_path / "exp" / "overrides.txt").read_text().splitlines()]
    done = _compose(verl_root, hydra_path, lines, tmp_path)
    assert done.returncode == 0, done.stderr
    composed = json.loads(done.stdout.splitlines()[-1])
    expected = {key: value.replace("@EXPORT_DIR@", "/shared/my runs/exp") if isinstance(value, str) else value
                for key, value in overrides.items()}
    assert composed == expected
    assert composed["data.train_files"] == "/shared/my runs/exp/train.parquet"


def test_hydra_composes_what_run_verl_sh_passes_from_a_dir_with_special_characters(verl_root, hydra_path, tmp_path):
    parent = tmp_path / "a|b&c'd e$f${g}"
    overrides, out = _exported_overrides(parent), parent / "exp"
    launch = run_script(out, work=tmp_path)
    assert launch.returncode == 0, launch.stderr
    done = _compose(verl_root, hydra_path, launch.argv[2:], tmp_path)
    assert done.returncode == 0, done.stderr
    composed = json.loads(done.stdout.splitlines()[-1])
    assert composed == {key: value.replace("@EXPORT_DIR@", str(out)) if isinstance(value, str) else value
                        for key, value in overrides.items()}
    assert composed["data.train_files"] == f"{out}/train.parquet"


# Reads each override as Hydra's command line does, then as OmegaConf resolves it in the composed config.
READ = """
import json, sys
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
parser = OverridesParser.create()
values = [parser.parse_override(line).value() for line in open(sys.argv[1]).read().splitlines()]
print(json.dumps(OmegaConf.to_container(OmegaConf.create({"v": values}), resolve=True)["v"]))
"""

TRICKY = ["it's", "a\\b", "a\\'b", "ends\\", "ends\\\\", "${x}", "a\\${x}", "a\\\\${x", "$HOME|&;`", "x\\'${",
          ["it's\\", "${y}", "a,b"]]


def test_hydra_and_omegaconf_read_each_written_value_as_itself(hydra_path, tmp_path):
    (tmp_path / "lines.txt").write_text("\n".join(format_override("k", value) for value in TRICKY) + "\n")
    done = subprocess.run([sys.executable, "-c", READ, str(tmp_path / "lines.txt")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(hydra_path)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == TRICKY


def test_hydra_refuses_a_key_verl_does_not_have(verl_root, hydra_path, tmp_path):
    done = _compose(verl_root, hydra_path, ["actor_rollout_ref.rollout.nn=4"], tmp_path)
    assert done.returncode != 0
    assert "Could not override 'actor_rollout_ref.rollout.nn'" in done.stderr
