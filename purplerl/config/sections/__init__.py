"""The sections of the config tree, one module per concern: the policy model (model), where it runs (engine),
the rows it reads and how a prompt becomes tokens (data), how completions are drawn (sampling), the optimizer and
the RL loss (training), what scores completions (reward), and a run's output with the trees every training recipe
starts from (run). Every default lives in them once, with a one-line description (the `--help` text and the comment
in a run's config.yaml); commands share a section where they share a concern (GenerationConfig for every sampler,
PromptFormatConfig for every prompt renderer). Import the sections from here: the modules are their layout."""

from purplerl.config.sections.data import (
    DataConfig,
    DialogueConfig,
    EvalDataConfig,
    PreferenceDataConfig,
    PrefsDataConfig,
    PromptFormatConfig,
    PromptSourceConfig,
    RowSourceConfig,
    SFTDataConfig,
)
from purplerl.config.sections.engine import ENGINE_KINDS, EngineConfig
from purplerl.config.sections.model import ModelConfig, ModelLoadConfig
from purplerl.config.sections.reward import ClassifierConfig, RewardBase, RewardServerConfig, ToxicityConfig
from purplerl.config.sections.run import TRACKER_NAMES, LoggingConfig, RLSettings, RunConfig, RunSettings
from purplerl.config.sections.sampling import GenerationConfig, SamplingConfig
from purplerl.config.sections.training import RLTrainingConfig, TrainingConfig

__all__ = [
    "ENGINE_KINDS", "TRACKER_NAMES", "ClassifierConfig", "DataConfig", "EngineConfig", "EvalDataConfig",
    "GenerationConfig", "LoggingConfig", "ModelConfig", "ModelLoadConfig", "PreferenceDataConfig", "PrefsDataConfig",
    "PromptFormatConfig", "PromptSourceConfig", "RLSettings", "RLTrainingConfig", "RewardBase", "RewardServerConfig",
    "RowSourceConfig", "RunConfig", "RunSettings", "SFTDataConfig", "SamplingConfig", "ToxicityConfig",
    "TrainingConfig", "DialogueConfig",
]
