"""The bad-input corpus: one row per defect, run through the CLI by ``test_corpus.py``.

A :class:`Case` is ``(name, files, argv, expect)``: the files written into an empty working
directory, the ``kvsim`` arguments, and substrings the one-line error must contain. Every case
expects exit status 2, exactly one stderr line starting with ``kvsim: error:``, no traceback,
nothing on stdout and no result directory. ``expect`` always names the file (the scenario, the
trace, or ``--set`` for a bad override) and the field, line or row.

Scenario files are copies of ``corpus/tiny.yaml`` with one defect. Config defects go through the
fast ``kvsim validate``; trace and calibration defects need ``kvsim run`` (``--no-plots -q``).

A case whose current message falls short carries ``xfail``: the reason says what is wrong and the
fix proposed in ``docs/reliability.md`` ("Known gaps").
"""

from __future__ import annotations

import copy
import gzip
import json
import random
from dataclasses import dataclass, field

import yaml

import kvsim.config  # noqa: F401  (registers every allocator and timing kind, as the CLI does)
from kvsim.hw import MODELS
from kvsim.registry import TIMING_MODELS

from ._cli import CORPUS

BASE: dict = yaml.safe_load((CORPUS / "tiny.yaml").read_text())

VALIDATE = ("validate", "s.yaml")
RUN = ("run", "s.yaml", "--out", "out", "--no-plots", "-q")


@dataclass(frozen=True)
class Case:
    name: str
    files: dict[str, str | bytes]
    argv: tuple[str, ...]
    expect: tuple[str, ...]
    xfail: str | None = None
    tags: tuple[str, ...] = field(default=())

    @property
    def runs(self) -> bool:
        return self.argv[0] == "run"


_DELETE = object()  # scenario({"key": _DELETE}) removes the key


def _set(tree: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    if value is _DELETE:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value


def scenario(changes: dict | None = None, base: dict | None = None) -> str:
    """YAML text of the tiny scenario with ``changes`` ({"a.b": value}, or _DELETE) applied."""
    tree = copy.deepcopy(BASE if base is None else base)
    for k, v in (changes or {}).items():
        _set(tree, k, v)
    return yaml.safe_dump(tree, sort_keys=False)


def trace_scenario(trace_file: str, **trace_opts) -> str:
    tree = copy.deepcopy(BASE)
    tree["trace"] = {"file": trace_file, **trace_opts}
    return yaml.safe_dump(tree, sort_keys=False)


def config_case(name: str, text: str, expect, argv=VALIDATE, xfail=None, extra_files=None,
                where: str = "s.yaml") -> Case:
    """``where``: what the message must name as the source of the problem (the scenario file, or
    the command-line option at fault: ``--set EXPR``, ``--out DIR``)."""
    files = {"s.yaml": text, **(extra_files or {})}
    return Case(name, files, tuple(argv), (where, *expect), xfail, ("config",))


def trace_case(name: str, trace_file: str, content: str | bytes, expect, xfail=None, **trace_opts) -> Case:
    """A defect in a trace file: the message must name the scenario, the trace file and the line."""
    files = {"s.yaml": trace_scenario(trace_file, **trace_opts), trace_file: content}
    return Case(name, files, RUN, ("s.yaml", trace_file, *expect), xfail, ("trace",))


# --------------------------------------------------------------------------------------------------
# Trace file builders (deterministic)

AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def az_rows(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        sec = 46 + i * 0.731
        rows.append(f"2023-11-16 18:{15 + int(sec // 60):02d}:{sec % 60:09.6f},{rng.randint(1, 1500)},"
                    f"{rng.randint(1, 400)}\n")
    return rows


def azure(*rows: str) -> str:
    return AZ_HEADER + "".join(rows)


def mc_line(ts_ms: int, prompt, output, hash_ids=None, **extra) -> str:
    rec = {"timestamp": ts_ms, "input_length": prompt, "output_length": output}
    if hash_ids is None and isinstance(prompt, int) and prompt > 0:
        hash_ids = list(range(ts_ms, ts_ms + -(-prompt // 512)))
    if hash_ids is not None:
        rec["hash_ids"] = hash_ids
    rec.update(extra)
    return json.dumps(rec) + "\n"


def mc_rows(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [mc_line(i * 250, rng.randint(1, 3000), rng.randint(1, 400)) for i in range(n)]


def truncated_gzip(text: str) -> bytes:
    """The first half of the gzip of ``text``: the stream ends before its end marker."""
    data = gzip.compress(text.encode(), mtime=0)
    assert len(data) > 4000, "make the text bigger: the cut must fall inside the data"
    return data[: len(data) // 2]


AZ_OK = az_rows(3)
MC_OK = [mc_line(0, 600, 10), mc_line(3000, 100, 5)]

# --------------------------------------------------------------------------------------------------
# Calibration directories (`timing: {kind: calibrated, file: DIR}`; format in kvsim/calibration_data/schema.py:
# meta.json + measurements.csv). The kind is being written in kvsim/timing/calibrated.py; until it is
# registered every calibration case fails with "unknown timing kind" and is xfailed.

CALIBRATED = "calibrated" in TIMING_MODELS.kinds
CALIBRATED_MISSING = None if CALIBRATED else (
    "timing kind 'calibrated' is not registered yet (kvsim/timing/__init__.py does not import "
    "kvsim/timing/calibrated.py); the run fails with 'unknown timing kind' instead of checking the directory")

GEOMETRY_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                 "intermediate_size", "vocab_size", "gated_mlp")


def calib_meta(model: str = "OPT-13B", drop: tuple[str, ...] = (), **over) -> str:
    """meta.json as ``kvsim calibrate`` writes it (the fields the reader checks), for a kvsim preset."""
    spec = MODELS[model]
    meta = {"schema_version": 1, "device": "cuda", "gpu_name": "A100-40GB",
            "model": {"name": model, **{k: getattr(spec, k) for k in GEOMETRY_KEYS}},
            "copy_bandwidth_bytes_per_s": 1.2e12, "kv_dtypes": ["fp16"], "decode_impl": "triton",
            "torch": "2.13.0", "triton": "3.7.1"}
    meta.update(over)
    for key in drop:
        meta.pop(key)
    return json.dumps(meta, indent=2)


CALIB_CSV = ("op,impl,device,dtype,block_size,batch,context_len,new_tokens,cached_tokens,tokens,median_s,kv_bytes\n"
             "decode_paged,triton,cuda,fp16,16,1,128,1,127,1,0.00001,104857600\n"
             "decode_paged,triton,cuda,fp16,16,8,1024,1,1023,8,0.00004,838860800\n")


def calib_case(name: str, calib_files: dict[str, str], expect, where: str, calib_dir: str = "calib",
               xfail: str | None = None) -> Case:
    files = {
        "s.yaml": scenario({"timing": {"kind": "calibrated", "file": calib_dir}}),
        **{f"{calib_dir}/{k}": v for k, v in calib_files.items()},
    }
    return Case(name, files, RUN, (where, *expect), CALIBRATED_MISSING or xfail, ("calibration",))


# --------------------------------------------------------------------------------------------------
# The corpus

XFAIL_SET_STRING_SCALAR = (
    "--set into a string scalar (kv_dtype.x=3) is silently turned into {preset: fp16, x: 3} by "
    "kvsim.config._set_dotted; the error then blames kv_dtype's value and never mentions --set")
XFAIL_CALIB_WHERE = (
    "a missing calibration directory is reported as 'timing.file: ...' without the scenario file: "
    "kvsim/build.py build_timing() builds the timing model without prefixing CalibrationError with `where`")
XFAIL_CALIB_NUMPY = (
    "the bad value is shown as a numpy repr, 'got np.float64(-1.0)' "
    "(kvsim/timing/calibrated.py load_calibration_dir formats df['median_s'].iloc[i] with !r)")
XFAIL_DUPLICATE_KEY = (
    "a key given twice is accepted silently (PyYAML keeps the last value), so a second 'allocator:' "
    "section overrides the first without a word")
XFAIL_HUGE_BUDGET = (
    "an explicit KV budget of 10^12 tokens (763 million GiB, far beyond the GPU) is accepted; the paged "
    "allocator that names blocks then allocates per-block lists: MemoryError under the corpus' 4 GiB cap "
    "('kvsim: internal error', exit 1), swapping or an OOM kill without one")
XFAIL_VALIDATE_TRACE = (
    "kvsim validate says 'ok' for a scenario whose trace file does not exist; only kvsim run notices")

# A "billion laughs" document: 9 levels of 9 aliases, ~3.9e8 nodes once expanded, ~600 bytes of text.
BILLION_LAUGHS_DEFS = "lol:\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"  {n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))
BILLION_LAUGHS = BILLION_LAUGHS_DEFS
BILLION_LAUGHS_FLOW = "[&a [1,1,1,1,1,1,1,1,1], " + ", ".join(
    f"&{n} [{','.join(['*' + p] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi")) + "]"

CASES: list[Case] = [
    # -- malformed YAML -------------------------------------------------------------------------
    config_case("yaml-syntax-error", "name: tiny\ntrace: {file: a.csv\nmodel: OPT-13B\n",
                ["s.yaml:3:", "YAML syntax error"]),
    config_case("yaml-tab-indent", "name: tiny\ntrace:\n\tfile: a.csv\nmodel: OPT-13B\n",
                ["s.yaml:3:1", "YAML syntax error", "\\t"]),
    config_case("yaml-empty-file", "", ["empty"]),
    config_case("yaml-only-comments", "# nothing here yet\n", ["empty"]),
    config_case("yaml-top-level-list", "- trace\n- model\n", ["mapping", "list"]),
    config_case("yaml-top-level-scalar", "just a sentence\n", ["mapping", "str"]),
    config_case("yaml-non-string-top-key", scenario() + "1: one\n", ["key 1", "not a string"]),
    config_case("yaml-non-string-nested-key", scenario({"allocator": {1: 16}}), ["allocator", "string"]),
    config_case("yaml-duplicate-key", scenario() + "allocator: {kind: contiguous}\n",
                ["s.yaml:", "duplicate key 'allocator'"]),
    config_case("yaml-not-utf8", b"name: \xff\xfe tiny\n", ["cannot read", "utf-8"]),
    # -- hostile YAML: refused in well under a second (the corpus' 60 s timeout and 4 GiB cap catch a hang)
    config_case("yaml-alias-bomb", scenario() + BILLION_LAUGHS, ["s.yaml", "refused", "expands to more than"]),
    config_case("yaml-alias-bomb-run", scenario() + BILLION_LAUGHS, ["s.yaml", "refused", "expands to more than"],
                argv=RUN),
    config_case("yaml-alias-bomb-in-variant", BILLION_LAUGHS_DEFS + scenario() + "variants:\n  v: {seed: *i}\n",
                ["s.yaml", "refused", "expands to more than"]),
    config_case("yaml-recursive-alias", scenario() + "loop: &loop [*loop]\n", ["s.yaml", "refused", "recursive"]),
    config_case("yaml-nested-too-deeply", scenario() + "deep: " + "[" * 20000 + "]" * 20000 + "\n",
                ["s.yaml", "refused", "nested too deeply"]),
    Case("yaml-alias-bomb-sweep", {"t.yaml": scenario(), "sw.yaml": BILLION_LAUGHS_DEFS + "base_file: t.yaml\n"
                                   "grid: {seed: *i}\n"}, ("sweep", "sw.yaml", "--out", "out"),
         ("sw.yaml", "refused", "expands to more than"), tags=("config",)),
    Case("yaml-alias-bomb-generator-spec", {"g.yaml": "num_requests: 5\n" + BILLION_LAUGHS},
         ("trace", "generate", "g.yaml", "o.jsonl"), ("g.yaml", "refused", "expands to more than"), tags=("config",)),
    config_case("yaml-alias-bomb-set", scenario(), ["--set", "refused", "expands to more than"],
                argv=("validate", "s.yaml", "--set", "seed=" + BILLION_LAUGHS_FLOW), where="--set seed="),
    # -- unknown keys at several depths ("did you mean") ---------------------------------------------
    config_case("unknown-key-top", scenario({"sed": 1}), ["sed", "did you mean 'seed'", "valid keys"]),
    config_case("unknown-key-allocator", scenario({"allocator.blocksize": 8}),
                ["allocator.blocksize", "did you mean 'block_size'", "valid keys"]),
    config_case("unknown-key-kv-budget", scenario({"kv_budget.token": 100}),
                ["kv_budget.token", "did you mean 'tokens'"]),
    config_case("unknown-key-scheduler", scenario({"scheduler.max_num_seq": 8}),
                ["scheduler.max_num_seq", "did you mean 'max_num_seqs'"]),
    config_case("unknown-attention-backend", scenario({"timing": {"kind": "analytical",
                                                                 "attention_backend": "auto-2024"}}),
                ["timing.attention_backend", "did you mean 'auto-2023'", "valid: auto, auto-2023"]),
    config_case("unknown-key-timing", scenario({"timing.step": 0.1}),
                ["timing.step", "did you mean 'step_s'"]),
    config_case("unknown-key-limits", scenario({"limits.max_sim_time": 5}),
                ["limits.max_sim_time", "did you mean 'max_sim_time_s'"]),
    config_case("unknown-key-model-override", scenario({"model": {"preset": "OPT-13B", "num_layer": 4}}),
                ["model.num_layer", "did you mean 'num_layers'"]),
    config_case("unknown-key-trace", scenario({"trace.end": 5}), ["trace.end", "did you mean 'end_s'"]),
    config_case("unknown-key-trace-synthetic", scenario({"trace.synthetic.num_request": 5}),
                ["trace.synthetic.num_request", "did you mean 'num_requests'", "valid keys"]),
    config_case("unknown-key-trace-synthetic-arrival", scenario({"trace.synthetic.arrival.rate_per_sec": 5}),
                ["trace.synthetic.arrival.rate_per_sec", "did you mean 'rate_per_s'", "valid keys"]),
    # -- wrong types -----------------------------------------------------------------------------
    config_case("type-seed-string", scenario({"seed": "abc"}), ["seed", "integer", "'abc'"]),
    config_case("type-block-size-string", scenario({"allocator.block_size": "sixteen"}),
                ["allocator.block_size", "integer", "'sixteen'"]),
    config_case("type-section-scalar", scenario({"scheduler": 5}), ["scheduler", "dictionary"]),
    config_case("type-section-list", scenario({"kv_budget": [1, 2]}), ["kv_budget", "dictionary"]),
    config_case("type-rate-scale-string", scenario({"trace.rate_scale": "fast"}),
                ["trace.rate_scale", "number", "'fast'"]),
    # -- out-of-range values -----------------------------------------------------------------------
    config_case("block-size-0", scenario({"allocator.block_size": 0}),
                ["allocator.block_size", "greater than or equal to 1", "got 0"]),
    config_case("block-size-513", scenario({"allocator.block_size": 513}),
                ["allocator.block_size", "less than or equal to 512", "got 513"]),
    config_case("negative-hbm-bandwidth", scenario({"gpu": {"preset": "A100-40GB", "hbm_bandwidth_bytes_per_s": -1}}),
                ["gpu.hbm_bandwidth_bytes_per_s", "greater than 0", "got -1"]),
    config_case("negative-host-link-bandwidth",
                scenario({"timing": {"kind": "analytical", "host_link_bandwidth_bytes_per_s": -5e9}}),
                ["timing.host_link_bandwidth_bytes_per_s", "greater than 0"]),
    config_case("negative-step-overhead", scenario({"timing": {"kind": "analytical", "step_overhead_s": -0.001}}),
                ["timing.step_overhead_s", "greater than or equal to 0", "-0.001"]),
    config_case("kv-budget-below-one-block", scenario({"kv_budget.tokens": 8}),
                ["kv_budget", "8 tokens", "less than one 16-token block"]),
    config_case("kv-budget-bytes-below-one-token", scenario({"kv_budget": {"bytes": 1000}}),
                ["kv_budget", "0 tokens", "less than one 16-token block"]),
    config_case("gpu-memory-utilization-above-1", scenario({"kv_budget": {"gpu_memory_utilization": 1.5}}),
                ["kv_budget.gpu_memory_utilization", "less than or equal to 1", "1.5"]),
    config_case("gpu-memory-utilization-0", scenario({"kv_budget": {"gpu_memory_utilization": 0}}),
                ["kv_budget.gpu_memory_utilization", "greater than 0"]),
    config_case("kv-budget-larger-than-gpu",
                scenario({"kv_budget.tokens": 10**12, "allocator.prefix_caching": True}),
                ["kv_budget", "GPU", "memory"]),
    config_case("kv-budget-bytes-and-tokens", scenario({"kv_budget": {"bytes": 10**9, "tokens": 1000}}),
                ["kv_budget", "bytes", "tokens", "at most one"]),
    config_case("negative-activation-reserve", scenario({"kv_budget": {"activation_reserve_bytes": -1}}),
                ["kv_budget.activation_reserve_bytes", "greater than or equal to 0"]),
    config_case("max-num-seqs-0", scenario({"scheduler.max_num_seqs": 0}), ["scheduler.max_num_seqs", "got 0"]),
    config_case("limit-negative", scenario({"limits.max_sim_time_s": -1}), ["limits.max_sim_time_s", "greater than 0"]),
    config_case("trace-end-before-start", scenario({"trace.start_s": 10, "trace.end_s": 5}),
                ["trace", "end_s", "start_s"]),
    config_case("trace-file-and-synthetic", scenario({"trace.file": "a.csv"}), ["trace", "exactly one of 'file'"]),
    config_case("model-missing", scenario({"model": _DELETE}), ["model", "required"]),
    # -- unknown kinds and presets ---------------------------------------------------------------------
    config_case("unknown-allocator-kind", scenario({"allocator": {"kind": "pagd"}}),
                ["allocator", "'pagd'", "did you mean 'paged'", "valid kinds"]),
    config_case("unknown-timing-kind", scenario({"timing": {"kind": "analytcal"}}),
                ["timing", "'analytcal'", "did you mean 'analytical'", "valid kinds"]),
    config_case("unknown-kv-dtype", scenario({"kv_dtype": "fp9"}), ["kv_dtype", "'fp9'", "fp8"]),
    config_case("model-preset-typo", scenario({"model": "OPT-13"}),
                ["model", "'OPT-13'", "did you mean 'OPT-13B'", "valid presets"]),
    config_case("gpu-preset-typo", scenario({"gpu": "A100-40G"}),
                ["gpu", "'A100-40G'", "did you mean 'A100-40GB'", "valid presets"]),
    config_case("custom-model-heads-not-multiple",
                scenario({"model": {"name": "odd", "num_layers": 2, "hidden_size": 96, "num_attention_heads": 6,
                                    "num_kv_heads": 4, "head_dim": 16, "intermediate_size": 256,
                                    "vocab_size": 1000, "num_params": 1e6, "max_model_len_tokens": 2048}}),
                ["model", "num_attention_heads (6)", "multiple of num_kv_heads (4)"]),
    config_case("weights-bigger-than-gpu", scenario({"model": "Llama-3-70B", "kv_budget": _DELETE}),
                ["kv_budget", "weights", "Llama-3-70B", "GPU memory"]),
    # -- command line ---------------------------------------------------------------------------------
    config_case("scenario-file-missing", scenario(), ["not found"], argv=("validate", "nope.yaml"),
                where="nope.yaml"),
    config_case("set-without-equals", scenario(), ["allocator.block_size", "path.to.key=value"], where="--set",
                argv=(*VALIDATE, "--set", "allocator.block_size")),
    config_case("set-empty-path-segment", scenario(), ["allocator..block_size", "bad key path"], where="--set",
                argv=(*VALIDATE, "--set", "allocator..block_size=8")),
    config_case("set-path-into-int-scalar", scenario(), ["'seed' is not a mapping"], where="--set seed.x=3",
                argv=(*VALIDATE, "--set", "seed.x=3")),
    config_case("set-path-into-string-scalar", scenario({"kv_dtype": "fp16"}),
                ["'kv_dtype' is not a mapping"], where="--set kv_dtype.x=3",
                argv=(*VALIDATE, "--set", "kv_dtype.x=3")),
    # A bad --set key or value is blamed on the --set argument (issue 25), the file named beside it.
    config_case("set-unknown-key", scenario(), ["allocator.blok_size", "did you mean 'block_size'", "s.yaml"],
                where="--set allocator.blok_size=8", argv=(*VALIDATE, "--set", "allocator.blok_size=8")),
    config_case("set-bad-value", scenario(), ["allocator.block_size", "integer", "'abc'", "s.yaml"],
                where="--set allocator.block_size=abc", argv=(*VALIDATE, "--set", "allocator.block_size=abc")),
    config_case("set-bad-byte-count", scenario(), ["kv_budget.bytes", "not a whole number of bytes", "16 GiB"],
                where="--set kv_budget.bytes=16.5B", argv=(*VALIDATE, "--set", "kv_budget.bytes=16.5B")),
    config_case("bad-unit", scenario({"kv_budget.tokens": _DELETE, "kv_budget.bytes": "16 GX"}),
                ["kv_budget.bytes", "unknown unit 'GX'"]),
    config_case("fractional-token-count", scenario({"kv_budget.tokens": 1.5}),
                ["kv_budget.tokens", "not a whole number of tokens", "128K"]),
    config_case("out-is-a-file", scenario(), ["not a directory"], argv=RUN, where="--out out",
                extra_files={"out": "not a directory\n"}),
    config_case("trace-file-missing-run", trace_scenario("nope.csv"), ["trace", "nope.csv", "does not exist"],
                argv=RUN),
    config_case("trace-file-missing-validate", trace_scenario("nope.csv"), ["trace", "nope.csv", "does not exist"],
                ),
    # -- variants ------------------------------------------------------------------------------------
    config_case("variant-typo-key", scenario({"variants": {"small": {"allocator": {"kind": "paged", "blok_size": 8}}}}),
                ["variants.small.allocator.blok_size", "did you mean 'block_size'"]),
    config_case("variant-typo-dotted-key", scenario({"variants": {"small": {"allocator.blok_size": 8}}}),
                ["variants.small.allocator.blok_size", "did you mean 'block_size'"]),
    config_case("variant-typo-top-key", scenario({"variants": {"small": {"sed": 3}}}),
                ["variants.small.sed", "did you mean 'seed'"]),
    config_case("variant-bad-value", scenario({"variants": {"small": {"allocator.block_size": 0}}}),
                ["variants.small.allocator.block_size", "got 0"]),
    config_case("variant-not-a-mapping", scenario({"variants": {"small": 3}}), ["variants.small", "dictionary"]),
    config_case("variant-bad-name", scenario({"variants": {"a b": {"seed": 1}}}), ["variants", "'a b'"]),
    config_case("variant-nested-variants", scenario({"variants": {"small": {"variants": {"x": {}}}}}),
                ["variants.small", "cannot nest"]),
    # -- Azure CSV trace defects -----------------------------------------------------------------------
    trace_case("azure-missing-column", "az.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,374\n",
               ["line 1", "cannot detect the trace format", "GeneratedTokens"]),
    trace_case("azure-missing-column-forced-format", "az.csv",
               "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,374\n",
               ["line 1", "missing column", "'GeneratedTokens'"], format="azure"),
    trace_case("azure-non-numeric-length", "az.csv", azure(*AZ_OK, "2023-11-16 18:15:59.0,abc,10\n"),
               ["line 5", "'ContextTokens'", "number", "'abc'"]),
    trace_case("azure-fractional-length", "az.csv", azure(*AZ_OK, "2023-11-16 18:15:59.0,374.5,10\n"),
               ["line 5", "'ContextTokens'", "whole number", "got 374.5"]),
    trace_case("azure-negative-length", "az.csv", azure(*AZ_OK, "2023-11-16 18:15:59.0,-3,10\n"),
               ["line 5", "'ContextTokens'", "negative (-3)"]),
    trace_case("azure-missing-value", "az.csv", azure(*AZ_OK, "2023-11-16 18:15:59.0,,10\n"),
               ["line 5", "missing value", "'ContextTokens'"]),
    trace_case("azure-zero-output", "az.csv", azure(*AZ_OK, "2023-11-16 18:15:59.0,30,0\n"),
               ["line 5", "'GeneratedTokens' is 0", "on_zero_output"]),
    trace_case("azure-unsorted", "az.csv", azure(*AZ_OK, "2023-11-16 18:15:00.0,30,5\n"),
               ["line 5", "earlier than the previous", "on_unsorted"]),
    trace_case("azure-bad-timestamp", "az.csv", azure(*AZ_OK, "yesterday,30,5\n"),
               ["line 5", "'TIMESTAMP'", "'yesterday'"]),
    trace_case("azure-extra-field", "az.csv", azure(*AZ_OK, "2023-11-16 18:15:59.0,30,5,7\n"),
               ["line 5", "expected 3", "found 4"]),
    trace_case("azure-extra-field-first-row", "az.csv", azure("2023-11-16 18:15:45.0,30,5,7\n", *AZ_OK),
               ["line 2", "expected 3", "found 4"]),
    trace_case("azure-token-count-overflows-int64", "az.csv",
               azure(*AZ_OK, "2023-11-16 18:15:59.0,9223372036854775807,44\n"),
               ["line 5", "'ContextTokens'", "too large", "4294967296"], length_policy="cap"),
    trace_case("azure-empty-file", "az.csv", "", ["line 1", "empty"]),
    trace_case("azure-header-only", "az.csv", AZ_HEADER, ["line 2", "no requests"]),
    trace_case("azure-truncated-gzip", "az.csv.gz", truncated_gzip(azure(*az_rows(4000))),
               ["line ", "truncated"]),
    trace_case("azure-corrupt-gzip", "az.csv.gz", b"\x1f\x8b\x08\x00" + bytes(range(60)),
               ["line 1", "decompress"]),
    # -- Mooncake JSONL trace defects ---------------------------------------------------------------
    trace_case("mooncake-missing-column", "mc.jsonl", '{"timestamp": 0, "input_length": 600}\n',
               ["line 1", "cannot detect the trace format", "output_length"]),
    trace_case("mooncake-missing-key-later-line", "mc.jsonl",
               "".join(MC_OK) + '{"timestamp": 6000, "input_length": 100, "hash_ids": [1]}\n',
               ["line 3", "missing value", "'output_length'"]),
    trace_case("mooncake-bad-json-line", "mc.jsonl", "".join(MC_OK) + '{"timestamp": 6000, "input_length": 100,\n',
               ["line 3", "JSON"]),
    trace_case("mooncake-line-not-an-object", "mc.jsonl", "".join(MC_OK) + "42\n", ["line 3", "JSON object"]),
    trace_case("mooncake-non-numeric-length", "mc.jsonl", "".join(MC_OK) + mc_line(6000, "lots", 5, [1]),
               ["line 3", "'input_length'", "number", "'lots'"]),
    trace_case("mooncake-boolean-length", "mc.jsonl", "".join(MC_OK) + mc_line(6000, True, 5, [1]),
               ["line 3", "'input_length'", "number"]),
    trace_case("mooncake-negative-length", "mc.jsonl", "".join(MC_OK) + mc_line(6000, 100, -5),
               ["line 3", "'output_length'", "negative (-5)"]),
    trace_case("mooncake-zero-output", "mc.jsonl", "".join(MC_OK) + mc_line(6000, 100, 0),
               ["line 3", "'output_length' is 0"]),
    trace_case("mooncake-unsorted", "mc.jsonl", "".join(MC_OK) + mc_line(1000, 100, 5),
               ["line 3", "earlier than the previous", "on_unsorted"]),
    trace_case("mooncake-negative-timestamp", "mc.jsonl", mc_line(-5, 100, 5),
               ["line 1", "'timestamp'", "negative (-5.0)"]),
    trace_case("mooncake-hash-ids-count", "mc.jsonl", "".join(MC_OK) + mc_line(6000, 100, 5, [1, 2]),
               ["line 3", "'hash_ids'", "2 keys"]),
    trace_case("mooncake-hash-ids-first-on-later-line", "mc.jsonl",
               '{"timestamp": 0, "input_length": 600, "output_length": 10}\n' + mc_line(3000, 100, 5, [1]),
               ["line 2", "'hash_ids'", "not on line 1"]),
    trace_case("mooncake-empty-file", "mc.jsonl", "", ["line 1", "empty"]),
    Case("trace-not-a-text-file", {"s.yaml": trace_scenario("/dev/zero")}, RUN,
         ("s.yaml", "/dev/zero", "line 1", "without a line break", "not a text trace"), None, ("trace",)),
    trace_case("mooncake-truncated-gzip", "mc.jsonl.gz", truncated_gzip("".join(mc_rows(1500))),
               ["line ", "truncated"]),
    # -- calibration directories (timing kind 'calibrated') --------------------------------------------
    calib_case("calibration-dir-missing", {}, ["timing.file", "'no-such-calib'", "not found"], where="s.yaml",
               calib_dir="no-such-calib"),
    calib_case("calibration-meta-missing", {"measurements.csv": CALIB_CSV}, ["missing"], where="calib/meta.json"),
    calib_case("calibration-meta-not-json", {"measurements.csv": CALIB_CSV, "meta.json": '{"schema_version": 1,'},
               ["JSON"], where="calib/meta.json"),
    calib_case("calibration-meta-not-an-object", {"measurements.csv": CALIB_CSV, "meta.json": "[1, 2, 3]\n"},
               ["JSON object", "list"], where="calib/meta.json"),
    calib_case("calibration-meta-field-missing",
               {"measurements.csv": CALIB_CSV, "meta.json": calib_meta(drop=("kv_dtypes",))},
               ["'kv_dtypes'", "missing"], where="calib/meta.json"),
    calib_case("calibration-meta-bad-value",
               {"measurements.csv": CALIB_CSV, "meta.json": calib_meta(copy_bandwidth_bytes_per_s=-1)},
               ["'copy_bandwidth_bytes_per_s'", "positive"], where="calib/meta.json"),
    calib_case("calibration-csv-missing", {"meta.json": calib_meta()}, ["missing"], where="calib/measurements.csv"),
    calib_case("calibration-csv-bad-row",
               {"meta.json": calib_meta(), "measurements.csv": CALIB_CSV.replace("0.00004", "-1")},
               ["row 3", "'median_s'", "got -1.0"], where="calib/measurements.csv"),
    calib_case("calibration-for-another-model",
               {"meta.json": calib_meta("Llama-3-8B"), "measurements.csv": CALIB_CSV},
               ["'model.name'", "Llama-3-8B", "OPT-13B"], where="calib/meta.json"),
    calib_case("calibration-for-another-gpu",
               {"meta.json": calib_meta(gpu_name="H100-SXM-80GB"), "measurements.csv": CALIB_CSV},
               ["'gpu_name'", "H100-SXM-80GB", "A100-40GB"], where="calib/meta.json"),
    calib_case("calibration-kv-dtype-not-measured",
               {"meta.json": calib_meta(kv_dtypes=["fp8"]), "measurements.csv": CALIB_CSV},
               ["'kv_dtypes'", "'fp16'"], where="calib/meta.json"),
]

# The table must stay unambiguous: test ids are the case names.
assert len({c.name for c in CASES}) == len(CASES)
