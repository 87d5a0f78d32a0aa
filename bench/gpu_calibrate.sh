#!/usr/bin/env bash
# One-shot GPU calibration: correctness check of the Triton kernel on the GPU, then the measurement
# grid under a time budget, then the report -- in a single run, for a session lent a GPU machine
# (e.g. one H200 for 15 minutes of device time, of which starting the machine takes 1-2).
#
#   bash bench/gpu_calibrate.sh [BUDGET_S] [MODEL] [GPU_NAME]
#
# BUDGET_S (default 360) bounds the measuring phases (the runner splits it among GEMMs, decode,
# prefill and the contiguous baseline; points that do not fit are listed in meta.json "skipped").
# Give the device call a timeout ~3 minutes above it (the self-check and Triton's first
# compilations come on top of the measuring phases only partly, the report and start-up fully).
#
# Output: $OUT/calib/{meta.json,measurements.csv,report_*} and $OUT/log.txt (7 files: within the
# device tool's 8-file limit). $OUT defaults to /tmp/kvsim-calibration. Copy calib/ into the repo as
# calibration/<GPU_NAME>/<MODEL>/ and commit it.
#
# The GPU image's python3 has torch/triton/numpy/pandas/matplotlib but not necessarily kvsim's other
# dependencies (pydantic, simpy): the measuring code needs none of them, and `python3 -m
# kvsim.calibration` avoids importing the rest of the CLI. Nothing is installed.
#
# Engine calibration (issue 22): with ENGINE_MODEL=path/config.json, and where the GPU image's Python
# has vLLM, the same command's running-engine form follows the kernel grid:
#   python3 -m kvsim.calibration --engine vllm --model $ENGINE_MODEL --device cuda --out $OUT/engine-calib
# (whole LLMEngine.step() times, dummy weights; docs/calibration.md, "Calibrating against a running
# engine"). Its files come back in $OUT/engine-calib (meta.json, measurements.csv, engine_steps.csv).
set -uo pipefail
cd "$(dirname "$0")/.."

BUDGET_S=${1:-360}
MODEL=${2:-Llama-3-8B}
GPU_NAME=${3:-}
OUT_DIR=${OUT:-/tmp/kvsim-calibration}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET  # real GPU compilation, never the interpreter
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/log.txt"

run() {
  echo "== environment ($(date -u +%FT%TZ))"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem --format=csv || true
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', \
triton.__version__, 'device', torch.cuda.get_device_name(), 'cc', torch.cuda.get_device_capability())" || return 1

  # Correctness first (Triton kernel vs the fp32 torch reference, on the GPU, every code path the
  # grid uses); the runner aborts before timing if it fails. Then measure, then report.
  local args=(--device cuda --model "$MODEL" --out "$OUT_DIR/calib" --time-budget-s "$BUDGET_S" --report)
  if [ -n "$GPU_NAME" ]; then args+=(--gpu-name "$GPU_NAME"); fi
  echo "== calibrate: python3 -m kvsim.calibration ${args[*]}"
  "$PY" -m kvsim.calibration "${args[@]}" || return 1

  if [ -n "${ENGINE_MODEL:-}" ]; then
    if "$PY" -c "import vllm" 2>/dev/null; then
      local eargs=(--engine vllm --model "$ENGINE_MODEL" --device cuda --out "$OUT_DIR/engine-calib"
                   --block-sizes 16 32 128)
      echo "== engine calibration: python3 -m kvsim.calibration ${eargs[*]}"
      "$PY" -m kvsim.calibration "${eargs[@]}" || return 1
    else
      echo "== engine calibration skipped: vLLM is not installed in $PY"
    fi
  fi

  # (peer-check needs /work/shared/peer-data, which does not travel: run it back on the CPU machine:
  #  kvsim calibrate peer-check --calibration calibration/<gpu>/<model>)
  echo "== done ($(date -u +%FT%TZ)); files:"
  ls -la "$OUT_DIR/calib"
}

run 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
