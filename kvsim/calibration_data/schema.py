"""The calibration directory format, shared by the writer (runner) and the readers (timing model,
report, peer check). Pure Python: no torch.

A calibration directory holds::

    meta.json          what was measured where (see META_REQUIRED)
    measurements.csv   one row per measurement (see COLUMNS)

Units: seconds (``*_s``), bytes (``*_bytes``), bytes/s, FLOP/s. Every attention and GEMM row is
ONE layer of the model at tensor-parallel degree 1; the timing model multiplies by the layer count.
"""

from __future__ import annotations

SCHEMA_VERSION = 1
META_FILE = "meta.json"
CSV_FILE = "measurements.csv"

# -- ops -------------------------------------------------------------------------------------------
DECODE_PAGED = "decode_paged"  # decode attention over the paged cache (our Triton kernel, or torch on CPU)
DECODE_CONTIGUOUS = "decode_contiguous"  # baseline: SDPA over a dense, unpaged cache
PREFILL_PAGED = "prefill_paged"  # one prefill chunk: gather blocks + SDPA with offset causal mask
GEMM_QKV = "gemm_qkv"
GEMM_OUT = "gemm_out"
GEMM_MLP_UP = "gemm_mlp_up"  # gate+up fused for gated MLPs
GEMM_MLP_DOWN = "gemm_mlp_down"
GEMM_LM_HEAD = "gemm_lm_head"  # once per step (not per layer), at tokens = sequences sampled
ELEMENTWISE = "elementwise"  # per layer: 2x RMSNorm, RoPE on q/k, SiLU*mul, 2x residual add
COPY = "copy"  # device-to-device copy: achievable bandwidth

LAYER_GEMMS = (GEMM_QKV, GEMM_OUT, GEMM_MLP_UP, GEMM_MLP_DOWN)
TOKEN_OPS = (*LAYER_GEMMS, GEMM_LM_HEAD, ELEMENTWISE)  # tables over one variable: tokens
ALL_OPS = (DECODE_PAGED, DECODE_CONTIGUOUS, PREFILL_PAGED, *TOKEN_OPS, COPY)
REQUIRED_OPS = (DECODE_PAGED, PREFILL_PAGED, *LAYER_GEMMS)
PER_KV_DTYPE_OPS = (DECODE_PAGED, PREFILL_PAGED)  # required once per KV dtype; the others once
# used by the calibrated timing model's defaults (include_lm_head, include_elementwise) when present:
# `kvsim calibrate` treats them as required too, so its directories are complete for the defaults
DEFAULT_OPTIONAL_OPS = (GEMM_LM_HEAD, ELEMENTWISE)


def missing_ops(df, kv_dtypes, optional=()) -> list[str]:
    """What ``measurements.csv`` rows ``df`` lack for the calibrated timing model (kvsim.timing.calibrated):
    ``"op"`` or ``"op dtype"`` for each of REQUIRED_OPS (decode/prefill per KV dtype in ``kv_dtypes``) and
    each op in ``optional`` with no row. The one definition the loader and ``kvsim calibrate`` share."""
    missing = []
    for op in (*REQUIRED_OPS, *optional):
        sel = df[df["op"] == op]
        if op in PER_KV_DTYPE_OPS:
            missing += [f"{op} {dt}" for dt in kv_dtypes if not (sel["dtype"] == dt).any()]
        elif sel.empty:
            missing.append(op)
    return missing

# decode_paged implementations; the timing model takes, per point, the fastest one measured
# (an engine would launch split-K exactly where it wins).
IMPL_TRITON = "triton"
IMPL_TRITON_SPLITK = "triton_splitk"
IMPL_TORCH_REFERENCE = "torch_reference"  # fp32 gather + softmax (CPU runs)
IMPL_TRITON_INTERPRETER = "triton_interpreter"  # the Triton kernel on the CPU interpreter

# -- measurements.csv --------------------------------------------------------------------------------
COLUMNS = (
    "op",  # one of ALL_OPS
    "impl",  # implementation (IMPL_* for decode; torch op names otherwise)
    "device",  # "cuda" | "cpu"
    "dtype",  # KV dtype for attention ops; weight/activation dtype for GEMMs; "u8" for copy
    "compute_dtype",  # dtype the arithmetic ran in
    "block_size",  # KV block size in tokens (0 = not paged / not applicable)
    "batch",  # sequences in the launch
    "context_len",  # KV tokens each sequence attends to (decode: c+1; prefill: cached + new)
    "new_tokens",  # query tokens per sequence (decode 1; prefill chunk length)
    "cached_tokens",  # context_len - new_tokens
    "heads", "kv_heads", "head_dim",  # attention geometry (0 for GEMMs)
    "tokens",  # rows of the activations (GEMM M; batch * new_tokens for attention)
    "gemm_n", "gemm_k",  # GEMM output features / reduction dim (0 otherwise)
    "splits",  # split-K partitions (decode), else 1
    "rotations",  # distinct input buffers cycled through while timing (defeats L2 reuse)
    "repeats",  # timed calls
    "median_s", "p10_s", "p90_s", "mean_s",
    "kv_bytes",  # KV cache bytes the op reads (attention ops), else 0
    "bytes_moved",  # minimum bytes moved through device memory (inputs once + outputs once)
    "flops",
    "achieved_bandwidth_bytes_per_s",  # attention: kv_bytes / median; others: bytes_moved / median
    "achieved_flops_per_s",
)
REQUIRED_COLUMNS = ("op", "impl", "device", "dtype", "block_size", "batch", "context_len", "new_tokens",
                    "cached_tokens", "tokens", "median_s", "kv_bytes")

# -- meta.json ---------------------------------------------------------------------------------------
META_REQUIRED = (
    "schema_version",
    "device",  # "cuda" | "cpu" -- CPU directories are plumbing data, never GPU timings
    "gpu_name",  # label (a kvsim GPU preset name where known, e.g. "H200-141GB"; "cpu" on CPU)
    "model",  # dict: name + geometry (MODEL_GEOMETRY_KEYS)
    "copy_bandwidth_bytes_per_s",  # measured device-to-device copy, bytes read + written per second
    "kv_dtypes",  # KV dtypes measured
    "decode_impl",  # IMPL_* used for decode_paged
)
MODEL_GEOMETRY_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                       "intermediate_size", "vocab_size", "gated_mlp")
CPU_LABEL = "CPU plumbing run: NOT GPU timings; valid only for testing the calibration pipeline"
