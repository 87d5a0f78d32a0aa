"""The scenario file: one pydantic-validated YAML document.

``load_scenario(path, overrides)`` reads the YAML, applies ``--set path.to.key=value`` overrides,
validates it and expands ``variants:`` (named override sets run against the same trace). It does no
other I/O. Every problem becomes a one-line :class:`ConfigError` naming the file, the dotted key path
and, where there is a closed set, the valid choices.

The package's modules, one concept each: ``sections`` (the plain sections: model, GPU, KV budget,
...), ``profiles`` (``engine_profile:``, the defaults of one engine version), ``scenario`` (the
:class:`Scenario` model and its checks across sections), ``messages`` (validation errors as one
line), ``load`` (files, ``--set``, variants) and ``resolved`` (the resolved form and the config hash).
This module re-exports what callers use.
"""

from __future__ import annotations

from kvsim.config_base import reject_non_finite  # noqa: F401  (re-exported for kvsim.sweep)
from kvsim.config.load import (LoadedScenario, _kind_default, _kind_of, _set_dotted, _undot, deep_merge,  # noqa: F401
                               expand_model, load_mapping, load_scenario, parse_set, read_yaml_mapping, validate_scenario)
from kvsim.config.messages import format_validation_error  # noqa: F401
from kvsim.config.profiles import ENGINE_PROFILES, apply_engine_profile  # noqa: F401
from kvsim.config.scenario import (DEPRECATED_KEYS, PLUGIN_SECTIONS, POLICY_KEYS, AllocatorConfig,  # noqa: F401
                                   Scenario, TimingConfig)
from kvsim.config.sections import (BeamSearchConfig, EngineConfig, GPUConfig, HostLinkConfig,  # noqa: F401
                                   KVBudgetConfig, KVDTypeName, LimitsConfig, MetricsConfig, ModelConfig,
                                   ParallelConfig, ReplicasConfig, SharedStoreConfig, SLOConfig,
                                   WeightDTypeName)
