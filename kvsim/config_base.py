"""Base class for every YAML-facing pydantic model: unknown keys are rejected, values are frozen."""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
