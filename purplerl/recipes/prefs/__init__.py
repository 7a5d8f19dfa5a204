"""`purplerl prefs`: preference training of a LoRA adapter (or every weight) on pairs or labelled answers:
DPO (sigmoid, cDPO's label smoothing, hinge, IPO), SimPO, KTO and ORPO (step.py, the losses in
purplerl.algorithms.preference), with the RL runs' run dir, atomic checkpoints, resume, metrics and report."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from purplerl.config import PrefsDataConfig
from purplerl.config.base import Section, read_when
from purplerl.config.sections import RunSettings
from purplerl.engines.capabilities import PACKED_ROWS
from purplerl.train.recipe import FIXED_ON_RESUME, FLAT, Recipe, RunNamePart, lazy, recipe_field


def _loss(*names: str):
    return lambda p: p.loss in names, f"prefs.loss is {' or '.join(names)}"


class PrefsConfig(Section):
    """The preference loss and its held-out evaluation."""

    loss: Literal["dpo", "simpo", "kto", "orpo"] = Field("dpo", description=(
        "dpo (Rafailov et al. 2023; dpo_form sigmoid/hinge/ipo), simpo (no reference, length-normalized, margin "
        "gamma), kto (unpaired desirable/undesirable answers), orpo (SFT plus an odds-ratio term, no reference)"))
    beta: float | None = Field(None, gt=0, description=(
        "the loss's beta (orpo: its lambda); null: the loss's default (0.1; simpo 2.0)"))
    dpo_form: read_when(Literal["sigmoid", "hinge", "ipo"], *_loss("dpo")) = Field("sigmoid", description=(
        "sigmoid (DPO), hinge (SLiC), ipo (IPO, length-averaged log-ratios)"))
    label_smoothing: read_when(float, *_loss("dpo", "simpo")) = Field(0.0, ge=0.0, lt=0.5, description=(
        "probability that a pair's label is flipped (conservative DPO); sigmoid forms only"))
    sft_weight: read_when(float, *_loss("dpo")) = Field(0.0, ge=0.0, description=(
        "weight of the chosen answers' NLL added to DPO's loss (RPO, Pang et al. 2024; TRL's loss_type sft); 0: plain "
        "DPO"))
    gamma: read_when(float, *_loss("simpo")) = Field(1.0, ge=0.0, description="SimPO's target reward margin")
    desirable_weight: read_when(float, *_loss("kto")) = Field(1.0, gt=0, description=(
        "KTO's weight of desirable answers"))
    undesirable_weight: read_when(float, *_loss("kto")) = Field(1.0, gt=0, description=(
        "KTO's weight of undesirable answers"))
    unpaired: read_when(bool, *_loss("kto")) = Field(False, description=(
        "the data holds KTO rows (prompt/completion/label); false: pairs, each a desirable and an undesirable answer"))
    one_label: read_when(bool, *_loss("kto")) = Field(False, description=(
        "accept KTO rows that all carry one label (only desirable, or only undesirable answers): the loss then trains "
        "that side alone, and the other side's rewards/logps read 0; false: such data is refused"))
    eval_split: str | None = Field(None, description=(
        "held-out split of the data source (null: hold out eval_fraction of the prompts)"))
    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0, description=(
        "share of the prompts held out when eval_split is null (0: no eval)"))
    eval_every: int = Field(10, ge=0, description=(
        "score the held-out examples every N steps and at the last step (0: never)"))
    eval_limit: int = Field(256, ge=1, description="at most this many held-out examples")


class PrefsSettings(RunSettings):
    """`purplerl prefs`: the shared training sections, the preference data and the loss."""

    recipe: str = recipe_field("prefs")
    data: PrefsDataConfig = Field(default_factory=PrefsDataConfig, description="the preference data")
    prefs: PrefsConfig = Field(default_factory=PrefsConfig, description="the preference loss (purplerl prefs)")


PREFS = Recipe(
    name="prefs",
    settings=PrefsSettings,
    help="""Preference training on pairs (DPO, IPO, SimPO, ORPO) or labelled answers (KTO): the loss covers the
    answers' tokens, the reference is the frozen base. --data names the data, --prefs.loss the loss.""",
    prepare=lazy("purplerl.recipes.prefs.step:prefs_prepare"),
    defaults={"training": {"steps": 100, "batch_size": 8, "lr": 5e-5}},
    run_name=(RunNamePart("", lambda c: c.prefs.loss), RunNamePart("beta", lambda c: c.prefs.beta or "default"),
              RunNamePart("lr", lambda c: c.training.lr), RunNamePart("B", lambda c: c.training.batch_size)),
    summary_metrics={"train/loss": "training loss", "eval/loss": "held-out loss",
                     "eval/rewards/accuracies": "held-out pair accuracy"},
    flat=FLAT,
    # which examples train and which are held out: a resume with others would train on held-out ones
    fixed_on_resume=FIXED_ON_RESUME | {"prefs.eval_split", "prefs.eval_fraction"},
    needs=lambda c: frozenset({PACKED_ROWS}) if c.data.packing else frozenset(),
)

__all__ = ["PREFS", "PrefsConfig", "PrefsSettings"]
