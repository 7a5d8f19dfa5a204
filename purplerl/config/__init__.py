"""The one config system: sections by concern (config.sections), each command's tree of them
(config.commands), and one way to read any of them (config.loader): command defaults <- YAML or JSON file
<- `--section.field VALUE` or flat-name overrides. Unknown keys and out-of-range values raise `UserError`
naming the field; the resolved config is written into each run directory.
"""

from purplerl.config.base import API_KEY_ENV, EMBEDDED_MODEL, Registry, Section, Template
from purplerl.config.commands import (
    COMMANDS,
    Command,
    EvalCommandConfig,
    EvalConfig,
    EvalUtilityConfig,
    JudgesConfig,
    PrepareCommandConfig,
    PrepareConfig,
    SampleCommandConfig,
    SampleConfig,
    TamperConfig,
    TamperTestConfig,
    UtilityConfig,
)
from purplerl.config.loader import (
    FLAT_NAMES,
    apply_overrides,
    build,
    build_config,
    build_server_config,
    commented_yaml,
    field_help,
    load_command_config,
    load_config,
    parse_overrides,
    read_config_file,
    save_config,
    section_descriptions,
)
from purplerl.config.sections import (
    ClassifierConfig,
    Config,
    DataConfig,
    EngineConfig,
    EvalDataConfig,
    GenerationConfig,
    LoggingConfig,
    ModelConfig,
    ModelLoadConfig,
    PromptFormatConfig,
    PromptSourceConfig,
    RewardConfig,
    RewardServerConfig,
    RunConfig,
    SamplingConfig,
    SFTConfig,
    SFTRunConfig,
    ToxicityConfig,
    TrainingConfig,
)

__all__ = [
    "API_KEY_ENV", "COMMANDS", "EMBEDDED_MODEL", "FLAT_NAMES", "ClassifierConfig", "Command", "Config", "DataConfig",
    "EngineConfig", "EvalCommandConfig", "EvalConfig", "EvalDataConfig", "EvalUtilityConfig", "GenerationConfig",
    "JudgesConfig", "LoggingConfig", "ModelConfig", "ModelLoadConfig", "PrepareCommandConfig", "PrepareConfig",
    "PromptFormatConfig", "PromptSourceConfig", "Registry", "RewardConfig", "RewardServerConfig", "RunConfig",
    "SampleCommandConfig", "SampleConfig", "SamplingConfig", "SFTConfig", "SFTRunConfig", "Section", "TamperConfig",
    "TamperTestConfig",
    "Template", "ToxicityConfig", "TrainingConfig", "UtilityConfig", "apply_overrides", "build", "build_config",
    "build_server_config", "commented_yaml", "field_help", "load_command_config", "load_config",
    "parse_overrides", "read_config_file", "save_config", "section_descriptions",
]
