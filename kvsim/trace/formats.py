"""Trace *formats*: which column of a file means what (Azure 2023, Mooncake FAST'25, kvsim generic).

A format is declarative -- one :class:`TraceSchema` row -- and independent of the container (CSV,
JSON lines or parquet, see :mod:`kvsim.trace.containers`), so any format may come in any container.

==========  ============================  ======================  ==============================
format      arrival                        prompt / output tokens  prefix keys
==========  ============================  ======================  ==============================
azure       ``TIMESTAMP`` date string;     ``ContextTokens`` /     none
            seconds since the earliest     ``GeneratedTokens``
            timestamp in the file
mooncake    ``timestamp`` milliseconds     ``input_length`` /      ``hash_ids`` (512-token
            from the trace start (kept,    ``output_length``       blocks, chained), optional
            not rebased)
generic     ``arrival_s`` seconds (kept)   ``prompt_tokens`` /     ``prefix_keys`` +
                                           ``output_tokens``       ``prefix_block_tokens``
==========  ============================  ======================  ==============================

The generic schema also has optional integer columns ``session_id``, ``priority`` and
``num_samples`` (see ``docs/traces.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvsim.errors import TraceError, format_choices

FORMATS = ("azure", "mooncake", "generic")
FORMAT_CHOICES = ("auto", *FORMATS)
MOONCAKE_BLOCK_TOKENS = 512
# Columns that must stay text when a CSV is parsed (dates, space-separated key lists).
TEXT_COLUMNS = ("TIMESTAMP", "hash_ids", "prefix_keys")


@dataclass(frozen=True)
class TraceSchema:
    """Which column of a source format means what."""

    name: str
    arrival: str
    prompt: str
    output: str
    time_unit: Literal["datetime", "ms", "s"]
    prefix: str | None = None
    fixed_block_tokens: int | None = None  # block size implied by the format (Mooncake: 512)
    block_tokens_column: str | None = None  # column holding the block size (generic)
    optional_ints: tuple[str, ...] = ()  # Trace fields read from columns of the same name

    @property
    def required(self) -> tuple[str, str, str]:
        return (self.arrival, self.prompt, self.output)

    @property
    def columns(self) -> frozenset[str]:
        """Every column this format reads (required and optional); other columns are ignored."""
        extra = (self.prefix, self.block_tokens_column, *self.optional_ints)
        return frozenset(self.required) | {c for c in extra if c is not None}


SCHEMAS: dict[str, TraceSchema] = {
    "azure": TraceSchema("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens", "datetime"),
    "mooncake": TraceSchema(
        "mooncake", "timestamp", "input_length", "output_length", "ms",
        prefix="hash_ids", fixed_block_tokens=MOONCAKE_BLOCK_TOKENS,
    ),
    "generic": TraceSchema(
        "generic", "arrival_s", "prompt_tokens", "output_tokens", "s",
        prefix="prefix_keys", block_tokens_column="prefix_block_tokens",
        optional_ints=("session_id", "priority", "num_samples", "beam"),
    ),
}


def detect_format(columns: list[str], where: str) -> str:
    """The format whose required columns are all in ``columns`` (generic wins ties)."""
    present = set(columns)
    for name in ("generic", "mooncake", "azure"):
        if set(SCHEMAS[name].required) <= present:
            return name
    expected = "; ".join(f"{n}: {', '.join(SCHEMAS[n].required)}" for n in FORMATS)
    shown = ", ".join(columns[:12]) + (", ..." if len(columns) > 12 else "")
    raise TraceError(
        f"{where}: line 1: cannot detect the trace format from the columns [{shown}]; "
        f"expected the columns of one of ({expected}), or set format to one of {format_choices(FORMATS)}"
    )
