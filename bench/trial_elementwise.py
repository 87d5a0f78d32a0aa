"""Trial (not adopted): the layers' elementwise kernels as a timing term, priced from Vidur's profiles.

    .venv/bin/python bench/trial_elementwise.py --fit-only           # the per-op fit, printed
    .venv/bin/python bench/trial_elementwise.py --fit --out DIR      # validate_serving.py with the term

kvsim's fitted linear layers price each layer's four GEMMs (docs/gemm_model.md); the layer's other
kernels (two RMSNorms, two residual adds, rotary embedding on the query and key heads, the gated
activation) are left to the engine profile's fitted per-step constants. Vidur's public profiles
(../shared/peer-data/vidur, MIT; sarathi-serve's eager kernels, tensor parallelism 1) time each of
them per layer (``mlp.csv`` columns ``input_layernorm``, ``post_attention_layernorm``, ``add``,
``attn_rope``, ``mlp_act``). This script fits each op as ``floor + per_element x tokens x width``
(width: hidden size for the norms and adds, (query + KV heads) x head dim for rotary, intermediate
size for the activation; phi-2, whose layer has no second norm, left out), adds
``layers x (2 norm + 2 add + rope + act)`` (MoE layers without the activation) to the fitted linear
table of an A100 or H100 deployment (monkeypatched: nothing under kvsim/ changes), and runs
``bench/validate_serving.py`` with the given arguments. docs/validation.md ("Tried, not adopted:
elementwise kernels") has what it gave. Not a test.
"""

from __future__ import annotations

import csv
import glob
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VIDUR = ROOT.parent / "shared" / "peer-data" / "vidur" / "data" / "profiling" / "compute"
OPS = ("norm", "add", "rope", "act")
COLUMNS = {"norm": ("input_layernorm", "post_attention_layernorm"), "add": ("add",), "rope": ("attn_rope",),
           "act": ("mlp_act",)}


def _width(op: str, r: dict) -> int:
    h, nh, nkv = int(r["n_embd"]), int(r["n_head"]), int(r["n_kv_head"])
    if op == "rope":
        return (nh + nkv) * (h // nh)
    return int(r["n_expanded_embd"]) if op == "act" else h


def fit(gpu: str) -> dict:
    """(floor s, s per element) per op on Vidur's TP-1 rows of ``gpu``, least squares on relative error."""
    rows = [r for f in sorted(glob.glob(str(VIDUR / gpu / "*" / "*" / "mlp.csv"))) if "phi-2" not in f
            for r in csv.DictReader(open(f)) if r["num_tensor_parallel_workers"] == "1"]
    out = {}
    for op in OPS:
        x, y = [], []
        for r in rows:
            for col in COLUMNS[op]:
                x.append([1.0, int(r["num_tokens"]) * _width(op, r)])
                y.append(float(r[f"time_stats.{col}.median"]) * 1e-3)
        X, Y = np.array(x), np.array(y)
        coef, *_ = np.linalg.lstsq(X / Y[:, None], np.ones_like(Y), rcond=None)
        mape = float(np.mean(np.abs(X @ coef / Y - 1)))
        out[op] = (float(coef[0]), float(coef[1]), mape, len(Y))
    return out


def patch(params: dict) -> None:
    from kvsim.timing import fitted_linear as FL
    from kvsim.timing import gemm

    grow = FL.FittedLinear._grow

    def elementwise(self, toks):
        p = params.get(gemm.PROFILE_FOR_GPU.get(self.gpu.name))
        if p is None:
            return 0.0
        m = self.model  # one GPU's shard: its heads and intermediate width, the hidden size whole
        t = sum(k * (p[op][0] + p[op][1] * toks * w) for op, k, w in (
            ("norm", 2, m.hidden_size), ("add", 2, m.hidden_size),
            ("rope", 1, (m.num_attention_heads + m.num_kv_heads) * m.head_dim)))
        if not m.num_experts:
            t = t + p["act"][0] + p["act"][1] * toks * m.intermediate_size
        return m.num_layers * t

    def _grow(self, n):
        old = len(self._layers)
        grow(self, n)
        self._layers[old:] = self._layers[old:] + elementwise(self, np.arange(old, len(self._layers), dtype=float))
        self._layers_list = self._layers.tolist()

    FL.FittedLinear._grow = _grow


def main(argv) -> int:
    params = {gpu: fit(gpu) for gpu in ("a100", "h100")}
    for gpu, ops in params.items():
        for op, (floor, per, mape, n) in ops.items():
            print(f"{gpu} {op:5s} floor {floor * 1e6:5.2f} us  {per * 1e12:6.3f} ps per element  MAPE {mape:.3f} ({n} rows)")
    if "--fit-only" in argv:
        return 0
    patch(params)
    sys.path.insert(0, str(ROOT / "bench"))
    import validate_serving

    return validate_serving.main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
