"""Fit backend-profile constants to the ``fit`` rows of the public kernel corpus (never the ``holdout`` rows).

``python -m kvsim.calibration.kernel_corpus_fit [--write]`` prints, per backend family, the fitted
constants and the model's error on the fit and held-out rows; ``--write`` stores the constants in
the built-in profiles (kvsim/timing/backends/*.yaml keep their flags; only the fitted numbers change).

Objective: the mean relative error of the kernel time, each row weighted by 1 / sqrt(fit rows of its
source), so a source's weight grows as the square root of its rows. A row timed around an eager
library call (corpus column ``timing`` = ``eager-wrapper``) is compared with the model's kernel time
raised to its source's host floor (kvsim.timing.kernel_corpus.host_floors, read from that source's
smallest-batch fit rows): the floor is the measurement's, so it enters the comparison only and never
the profile's constants. ``ctas_per_sm`` (rounds of
resident work units) is not searched: each start holds a value, and the first start within TIE of the
best is kept (docs/kernel_model.md, "How the constants are fitted"). Search: coordinate descent in
multiplicative steps (numpy only; every step is a full re-evaluation, so it is slow but exact and
deterministic). A family's backends share its constants. vLLM's v1 and v2 kernels are one code base
(v2 = v1 + 512-token partitions + a reduction) but separate families: v1 (the profile the vLLM paper's
studies run) is fitted on vLLM's own benchmark threads, v2 on its own rows, which include FlashInfer's
launch post (vLLM 0.2.6 on H100 and A100 PCIe), and takes v1's per-page cost (its rows are all page 16).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

# Per family, the constants fitted (the others keep the profile's sourced values). PagedAttention v1
# borrows the saturation constants of the FlashAttention fit (its 12 rows are GQA launches on one GPU:
# fitting the bandwidth cap on them would move every MHA run); its GQA re-reads are fitted instead.
FITTED = {"vllm-paged-v1": ("launch_overhead_s", "unit_overhead_s", "page_overhead_s", "overlap", "query_head_reads"),
          # PagedAttention v2 has rows of its own on three GPUs, MHA and GQA (FlashInfer's launch post, vLLM's
          # threads), which fix its saturation; all at one page size, so they cannot fix a per-page cost,
          # which it takes from the v1 fit (BORROWERS)
          "vllm-paged-v2": ("launch_overhead_s", "unit_overhead_s", "overlap", "query_head_reads",
                            "max_bandwidth_utilisation", "bytes_in_flight_per_unit"),
          "flashattention-paged": ("launch_overhead_s", "unit_overhead_s", "page_overhead_s",
                                   "max_bandwidth_utilisation", "units_per_sm_to_saturate", "overlap",
                                   "bytes_in_flight_per_unit"),
          # FlashInfer's own rows (Vidur's A100 Llama-3-8B FlashInfer profile, flashinfer PR #2055): the
          # FlashAttention set without the per-page cost (FlashInfer's is carried by the DRAM-efficiency
          # term from its README, docs/kernel_model.md)
          "flashinfer-paged": ("launch_overhead_s", "unit_overhead_s", "max_bandwidth_utilisation",
                               "units_per_sm_to_saturate", "overlap", "bytes_in_flight_per_unit"),
          # FlashMLA's rows are one launch shape (batch 128 x 4,096 tokens) at three head counts: they fix
          # one level, the bytes its work units keep in flight; the rest comes from the FlashAttention fit
          "flashmla": ("bytes_in_flight_per_unit",)}
FAMILIES = {"flashattention-paged": ("flashattention-paged",), "flashinfer-paged": ("flashinfer-paged",),
            "vllm-paged-v1": ("vllm-paged-v1",), "vllm-paged-v2": ("vllm-paged-v2",), "flashmla": ("flashmla",)}
# Rows a family reads besides its own backends' (backend, sources): the v1 profile is fitted on vLLM's own
# benchmark_paged_attention.py threads, which time v1 and v2 on the same launches (6 fit rows each), as
# when the two were one family. Those rows are predicted with the family's own profile and constants,
# partitioned as the other backend partitions (PARTITIONING): its own fitted constants never enter there.
ALSO_READS = {"vllm-paged-v1": ("vllm-paged-v2", frozenset({"vllm-issue-1880", "vllm-pr-2744"}))}
PARTITIONING = ("split_kv", "split_rule", "min_split_tokens")
# Starts for the search: vLLM's per-page cost and GQA re-reads both grow with the pages read, and the
# corpus' vLLM rows (all page 16, GQA groups of 7-8) cannot separate them (weighted MAPE 0.1422 with
# re-reads vs 0.1419 with a 6x per-page cost and none). The re-read start is listed first and kept
# on a tie: a per-page cost would also slow every MHA launch, where the vLLM paper's kernel band
# (20-26 % over FasterTransformer, tests/timing/test_kernel_model.py) holds with the smaller one.
# ctas_per_sm (rounds of resident work units, docs/kernel_model.md) is never searched: each start holds
# one value, 0 (no rounds) first, so rounds are kept only where they fit the fit rows better by TIE; each
# is tried with both saturation forms (Little's law, and the sharp cap: bytes in flight held at 0).
ROUNDS = (1.0, 2.0, 3.0, 4.0)
_SHARP = {"bytes_in_flight_per_unit": 0.0, "units_per_sm_to_saturate": 1.0, "hold": ("bytes_in_flight_per_unit",)}
_ROUND_STARTS = (*({"overlap": 0.5, "ctas_per_sm": c} for c in ROUNDS),
                 *({"overlap": 0.5, "ctas_per_sm": c, **_SHARP} for c in ROUNDS))
_REREAD_STARTS = ({"query_head_reads": 0.25}, {"query_head_reads": 0.0})
STARTS = {"vllm-paged-v1": _REREAD_STARTS, "vllm-paged-v2": _REREAD_STARTS,
          "flashattention-paged": ({"overlap": 0.0, "hold": ("overlap",)}, {"overlap": 0.0}, {"overlap": 0.5},
                                   *_ROUND_STARTS),
          "flashinfer-paged": ({"overlap": 0.5}, *_ROUND_STARTS)}
# (a start's "hold": constants kept at the start value: the additive form, overlap 0, is a start of
# its own because the coordinate search from overlap 0 drifts into a worse local optimum)
# Every search starts from the constants kvsim had before the corpus (the Vidur A100 fit and the
# vLLM-paper page cost, docs/kernel_model.md), not from the files it writes: --write is repeatable.
START_BASE = {"vllm-paged-v1": dict(launch_overhead_s=4.6e-6, unit_overhead_s=3.5e-8, page_overhead_s=1.8e-9,
                                    units_per_sm_to_saturate=2.37, overlap=0.0, query_head_reads=0.0),
              "vllm-paged-v2": dict(launch_overhead_s=4.6e-6, unit_overhead_s=3.5e-8, units_per_sm_to_saturate=2.37,
                                    overlap=0.0, query_head_reads=0.0, max_bandwidth_utilisation=0.907,
                                    bytes_in_flight_per_unit=2048.0),
              "flashattention-paged": dict(launch_overhead_s=4.6e-6, unit_overhead_s=3.5e-8, page_overhead_s=0.0,
                                           max_bandwidth_utilisation=0.907, units_per_sm_to_saturate=2.37,
                                           overlap=0.0, query_head_reads=0.0, bytes_in_flight_per_unit=2048.0,
                                           ctas_per_sm=0.0),
              "flashinfer-paged": dict(launch_overhead_s=4.6e-6, unit_overhead_s=3.5e-8, max_bandwidth_utilisation=0.907,
                                       units_per_sm_to_saturate=2.37, overlap=0.0, bytes_in_flight_per_unit=2048.0,
                                       ctas_per_sm=0.0),
              "flashmla": dict(bytes_in_flight_per_unit=2048.0)}
# Profiles with too few corpus rows of their own to fit take a family's fitted time constants (never its
# page cost): FlashInfer's decode kernel and FlashAttention over contiguous KV used the Vidur A100
# FlashAttention fit before the corpus; they now use the corpus fit of the same kernel family.
# PagedAttention v1 takes only the saturation (the GPU memory system's bytes in flight, measured on the
# FlashAttention rows): its 12 GQA rows fit its own launch, unit, page and re-read costs.
TIME_CONSTANTS = ("launch_overhead_s", "unit_overhead_s", "max_bandwidth_utilisation", "units_per_sm_to_saturate",
                  "overlap", "bytes_in_flight_per_unit", "ctas_per_sm")
SATURATION = ("max_bandwidth_utilisation", "bytes_in_flight_per_unit")
# FlashInfer has rows of its own since the Vidur Llama-3-8B profile entered the corpus: it is a family
BORROWERS = {"flashattention-paged": {"contiguous": TIME_CONSTANTS, "flashmla": TIME_CONSTANTS,
                                      "vllm-paged-v1": SATURATION,
                                      # the same kernel family on Hopper, reading fp8 KV fused: every fitted constant
                                      "flashattention3-paged": FITTED["flashattention-paged"]},
             "vllm-paged-v1": {"vllm-paged-v2": ("page_overhead_s",)}}
HELD_FORM = ("ctas_per_sm",)  # form constants a start sets and the search never moves
TIE = 0.005  # weighted MAPE difference below which two fits count as equally good
BOUNDS = {"max_bandwidth_utilisation": (0.05, 1.0), "bytes_in_flight_per_unit": (16.0, 1e6), "overlap": (0.0, 1.0), "units_per_sm_to_saturate": (0.05, 64.0),
          "query_head_reads": (0.0, 1.0)}
STEP_START, STEP_END = 0.5, 0.004  # relative step of the coordinate search, halved when no step helps
SEEDS = {"page_overhead_s": 1e-10, "unit_overhead_s": 1e-9}  # a zero constant restarts here


def _weight(rows_of_source: int) -> float:
    """A fit row's weight: 1 / sqrt(fit rows of its source), so a source's total weight grows as the
    square root of its rows (174 Vidur rows count 7.6x a 3-row thread, not 58x nor 1x)."""
    return rows_of_source ** -0.5


def _objective(points, profiles, params: dict) -> float:
    from kvsim.timing.kernel_corpus import as_measured, host_floors, predict, profile_for

    floors = host_floors(points)  # eagerly timed sources' host floors, from these (fit) rows
    tuned = {b: replace(p, **params) for b, p in profiles.items()}
    counts: dict[str, int] = {}
    for p in points:
        counts[p.source_id] = counts.get(p.source_id, 0) + 1
    total = 0.0
    for p in points:
        t = as_measured(p, predict(p, profile_for(p, tuned))[0], floors)
        total += abs(t - p.time_s) / p.time_s * _weight(counts[p.source_id])
    return total / sum(_weight(c) * c for c in counts.values())


def _candidates(name: str, v: float, step: float):
    if name in ("overlap", "query_head_reads"):  # additive: they may be 0
        vals = [v - step / 2, v + step / 2]
    elif v == 0.0:
        vals = [SEEDS.get(name, 1e-9)]
    else:
        vals = [v * (1 - step), v * (1 + step), v / (1 - step)] + ([0.0] if name in SEEDS else [])
    lo, hi = BOUNDS.get(name, (0.0, float("inf")))
    return [min(max(x, lo), hi) for x in vals]


def fit_family(points, profiles: dict, fitted, max_rounds: int = 400) -> tuple[dict, float]:
    """Constants ``fitted`` shared by ``profiles`` that minimise the weighted mean relative error."""
    first = next(iter(profiles.values()))
    params = {k: getattr(first, k) for k in fitted}
    best = _objective(points, profiles, params)
    step = STEP_START
    for _ in range(max_rounds):
        improved = False
        for name in fitted:
            for v in _candidates(name, params[name], step):
                trial = dict(params, **{name: v})
                err = _objective(points, profiles, trial)
                if err < best - 1e-12:
                    best, params, improved = err, trial, True
        if not improved:
            step /= 2
            if step < STEP_END:
                break
    return params, best


def main(argv=None) -> int:
    from kvsim.timing.kernel_corpus import load_corpus

    ap = argparse.ArgumentParser(prog="python -m kvsim.calibration.kernel_corpus_fit", description=__doc__)
    ap.add_argument("--write", action="store_true", help="store the fitted constants in the built-in profiles")
    ap.add_argument("--family", choices=sorted(FAMILIES), action="append",
                    help="fit only this family (repeatable; default all, in order; borrowers of a family "
                         "left out keep their files' constants)")
    args = ap.parse_args(argv)
    corpus = load_corpus()
    lent: dict[str, dict] = {}  # backend -> time constants borrowed from an earlier family's fit
    for fam, backends in FAMILIES.items():
        if args.family and fam not in args.family:
            continue
        params = _fit_and_report(fam, corpus, lent)
        for b, keys in BORROWERS.get(fam, {}).items():
            lent.setdefault(b, {}).update({k: params[k] for k in keys})
            print(f"  {b} takes {', '.join(keys)} from this fit")
        if args.write:
            for b in backends:
                _write_constants(b, {**lent.get(b, {}), **params})
            for b in BORROWERS.get(fam, {}):
                _write_constants(b, lent[b])
    return 0


def _fit_and_report(fam: str, corpus, lent: dict) -> dict:
    """One family's fit from each of its starts (fit rows only), printed with its error table."""
    from kvsim.timing.kernel_corpus import error_table, evaluable

    profiles, corpus = family_inputs(fam, corpus, lent)
    fit_rows = [p for p in evaluable(corpus, profiles) if p.split == "fit"]
    results = []
    for start in STARTS.get(fam, ({},)):  # a few starts: some constants trade off on few rows
        start = dict(start)
        hold = start.pop("hold", ())
        p_start = {b: replace(p, **{**START_BASE[fam], **start}) for b, p in profiles.items()}
        cand, cerr = fit_family(fit_rows, p_start, tuple(k for k in FITTED[fam] if k not in hold))
        first = next(iter(p_start.values()))
        # held constants and the start's rounds (never searched) belong to the candidate too
        kept = (*hold, *(k for k in HELD_FORM if k in START_BASE[fam] or k in start))
        cand = {**{k: getattr(first, k) for k in kept}, **cand}
        print(f"  start {start}{' holding ' + ', '.join(hold) if hold else ''}: weighted MAPE {cerr:.4f}")
        results.append((cand, cerr))
    # the first start within TIE of the best: the corpus cannot tell them apart, the order can
    best = min(e for _, e in results)
    params, err = next((c, e) for c, e in results if e <= best + TIE)
    print(f"{fam}: {len(fit_rows)} fit rows, weighted MAPE {err:.4f}")
    print("  " + ", ".join(f"{k}={v:.4g}" for k, v in params.items()))
    tuned = {b: replace(p, **params) for b, p in profiles.items()}
    for r in error_table(corpus, tuned):
        print(f"  {r.backend:22s} {r.gpu:14s} {r.split:8s} n={r.points:3d} MAPE={r.mape:.3f} max={r.max_rel:.3f}")
    return params


def family_inputs(fam: str, corpus, lent: dict) -> tuple[dict, list]:
    """A family's profiles (its backends' files with what earlier fits lent them, and for ALSO_READS
    rows the family's own profile partitioned as the other backend partitions) and the corpus rows it
    reads (fit and held out alike)."""
    from kvsim.timing.kernel import load_backend

    backends = FAMILIES[fam]
    profiles = {b: replace(load_backend(b), **lent.get(b, {})) for b in backends}
    extra, sources = ALSO_READS.get(fam, (None, frozenset()))
    if extra:
        other = load_backend(extra)
        profiles[extra] = replace(profiles[backends[0]], name=extra,
                                  **{k: getattr(other, k) for k in PARTITIONING})
    rows = [p for p in corpus if p.backend in backends or (p.backend == extra and p.source_id in sources)]
    return profiles, rows


def yaml_number(value: float) -> str:
    """``value`` at 3 significant digits, written so that YAML reads a float back: PyYAML (YAML 1.1)
    takes ``4e-08`` for a string, so an exponent form gets a decimal point (``4.0e-08``)."""
    text = repr(float(f"{value:.3g}"))
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text


def _write_constants(backend: str, params: dict) -> None:
    """Replace the fitted keys' values in the built-in profile file, keeping its comments and order."""
    from importlib import resources

    path = resources.files("kvsim.timing.backends") / f"{backend}.yaml"
    lines = path.read_text().splitlines()
    out, seen = [], set()
    for line in lines:
        key = line.split(":", 1)[0]
        if key in params:
            line = f"{key}: {yaml_number(params[key])}"
            seen.add(key)
        out.append(line)
    out += [f"{key}: {yaml_number(params[key])}" for key in params if key not in seen]  # keys new to the file
    with open(str(path), "w") as fh:
        fh.write("\n".join(out) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
