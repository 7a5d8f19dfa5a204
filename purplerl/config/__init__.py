"""The one config system: sections by concern (config.sections), the trees of the commands that are not recipes
(config.commands; eval's, with the sections that judge a model, in config.evaluation), older names moved to today's
(config.migrate), and one way to read any of them (config.loader): command defaults <- YAML or JSON file <-
`--section.field VALUE` or flat-name overrides. Unknown keys, out-of-range values and settings nothing would read
raise `UserError` naming the field; the resolved config is written into each run directory. Each recipe's tree is
its own (purplerl.train.recipe).
"""

from purplerl.config.base import API_KEY_ENV, EMBEDDED_MODEL, METADATA, Registry, Section, Template
from purplerl.config.commands import (
    ALIGN,
    EVAL,
    EXPORT,
    PREPARE,
    REPORT,
    SAMPLE,
    Command,
    PrepareCommandConfig,
    PrepareConfig,
    SampleCommandConfig,
    SampleConfig,
    SFTConfig,
    TamperConfig,
    VerlConfig,
)
from purplerl.config.evaluation import EvalCommandConfig, EvalConfig, EvalUtilityConfig, JudgesConfig, UtilityConfig
from purplerl.config.loader import (
    apply_overrides,
    build,
    build_server_config,
    commented_yaml,
    deep_merge,
    field_help,
    load_command_config,
    parse_overrides,
    read_config_file,
    save_config,
    section_descriptions,
    specs_in_force,
)
from purplerl.config.sections import (
    ENGINE_KINDS,
    TRACKER_NAMES,
    ClassifierConfig,
    DataConfig,
    DialogueConfig,
    EngineConfig,
    EvalDataConfig,
    GenerationConfig,
    LoggingConfig,
    ModelConfig,
    ModelLoadConfig,
    PreferenceDataConfig,
    PrefsDataConfig,
    PromptFormatConfig,
    PromptSourceConfig,
    RewardBase,
    RewardServerConfig,
    RLSettings,
    RLTrainingConfig,
    RowSourceConfig,
    RunConfig,
    RunSettings,
    SamplingConfig,
    SFTDataConfig,
    ToxicityConfig,
    TrainingConfig,
)

__all__ = [
    "ALIGN", "API_KEY_ENV", "EMBEDDED_MODEL", "ENGINE_KINDS", "EVAL", "EXPORT", "METADATA", "PREPARE", "REPORT",
    "SAMPLE",
    "TRACKER_NAMES", "ClassifierConfig", "Command", "DataConfig", "EngineConfig", "EvalCommandConfig", "EvalConfig",
    "EvalDataConfig", "EvalUtilityConfig", "GenerationConfig", "JudgesConfig", "LoggingConfig", "ModelConfig",
    "ModelLoadConfig", "PrepareCommandConfig", "PrepareConfig", "PreferenceDataConfig", "PrefsDataConfig",
    "PromptFormatConfig", "PromptSourceConfig",
    "RLSettings", "RLTrainingConfig", "Registry", "RewardBase", "RewardServerConfig", "RowSourceConfig", "RunConfig",
    "RunSettings", "SFTConfig", "SFTDataConfig", "SampleCommandConfig", "SampleConfig", "SamplingConfig", "Section",
    "DialogueConfig",
    "TamperConfig", "Template", "ToxicityConfig", "TrainingConfig", "UtilityConfig", "VerlConfig", "apply_overrides",
    "build", "deep_merge",
    "build_server_config", "commented_yaml", "field_help", "load_command_config", "parse_overrides",
    "read_config_file", "save_config", "section_descriptions", "specs_in_force",
]
