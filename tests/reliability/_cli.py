"""Helpers shared by the reliability tests: run the real CLI in a subprocess and check its output.

Every test here goes through ``[sys.executable, "-m", "kvsim", ...]`` with a temporary working
directory, so what is checked is exactly what a user sees: the exit status, stdout, stderr and the
files left behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus"
REPO = Path(__file__).resolve().parents[2]
TRACEBACK = "Traceback (most recent call last)"

# A subprocess that runs longer than this is a hang, not a slow test.
SUBPROCESS_TIMEOUT_S = 120


@dataclass
class Result:
    argv: list[str]
    cwd: Path
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return (f"$ kvsim {' '.join(self.argv)}   (cwd {self.cwd})\nexit {self.returncode}\n"
                f"--- stdout ---\n{self.stdout}--- stderr ---\n{self.stderr}")


def kvsim_env(hashseed: str | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONHASHSEED", None)
    env["PYTHONWARNINGS"] = "ignore"  # a stray library warning is not what these tests check
    env["COLUMNS"] = "200"
    if hashseed is not None:
        env["PYTHONHASHSEED"] = hashseed
    env.update(extra)
    return env


def kvsim_cmd(argv: list[str], memory_limit_bytes: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "kvsim", *argv]
    if memory_limit_bytes is None:
        return cmd
    # Cap the address space so an input that makes kvsim allocate without bound fails fast instead
    # of exhausting the machine. bash's ulimit, then exec: the process is still `python -m kvsim`
    # (no preexec_fn, which is unsafe with the thread pool of the corpus runner).
    return ["bash", "-c", f'ulimit -v {memory_limit_bytes // 1024} && exec "$@"', "kvsim", *cmd]


def run_kvsim(argv: list[str], cwd: Path, *, hashseed: str | None = None,
              timeout: float = SUBPROCESS_TIMEOUT_S, memory_limit_bytes: int | None = None) -> Result:
    proc = subprocess.run(kvsim_cmd(argv, memory_limit_bytes), cwd=cwd, env=kvsim_env(hashseed),
                          capture_output=True, text=True, timeout=timeout, check=False)
    return Result(argv, Path(cwd), proc.returncode, proc.stdout, proc.stderr)


def start_kvsim(argv: list[str], cwd: Path, *, hashseed: str | None = None) -> subprocess.Popen:
    return subprocess.Popen(kvsim_cmd(argv), cwd=cwd, env=kvsim_env(hashseed), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, argv: list[str], cwd: Path, timeout: float = SUBPROCESS_TIMEOUT_S) -> Result:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"kvsim {' '.join(argv)} did not finish within {timeout} s\n{err}") from None
    return Result(argv, Path(cwd), proc.returncode, out, err)


def stop(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to a child we started (by its pid) unless it already exited."""
    if proc.poll() is None:
        proc.send_signal(sig)


def wait_for(predicate, proc: subprocess.Popen | None = None, timeout: float = 60.0, poll_s: float = 0.02):
    """Poll until ``predicate()`` is truthy; fail if it times out or ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"the run exited ({proc.returncode}) before the condition held:\n{err}")
        time.sleep(poll_s)
    raise AssertionError(f"condition not met within {timeout} s")


def copy_corpus(name: str, dest: Path) -> Path:
    target = dest / name
    shutil.copyfile(CORPUS / name, target)
    return target


def stderr_lines(res: Result) -> list[str]:
    return res.stderr.rstrip("\n").split("\n") if res.stderr.strip() else []


def assert_one_line_error(res: Result, expect: list[str] = (), *, code: int = 2,
                          prefix: str = "kvsim: error: ") -> str:
    """The user-error contract: exit ``code``, exactly one stderr line starting with ``prefix``,
    every ``expect`` substring in it, no traceback, nothing on stdout. Returns the line."""
    info = res.describe()
    assert TRACEBACK not in res.stderr and TRACEBACK not in res.stdout, f"traceback printed\n{info}"
    assert res.returncode == code, f"exit status {res.returncode}, expected {code}\n{info}"
    lines = stderr_lines(res)
    assert len(lines) == 1, f"stderr has {len(lines)} lines, expected one\n{info}"
    line = lines[0]
    assert line.startswith(prefix), f"stderr does not start with {prefix!r}\n{info}"
    missing = [s for s in expect if s not in line]
    assert not missing, f"message lacks {missing}\n{info}"
    assert res.stdout == "", f"unexpected stdout\n{info}"
    return line


def temp_dirs(out: Path) -> list[Path]:
    """The hidden temporary directories of runs into ``out`` (``.OUT.tmp-<pid>``)."""
    return sorted(out.parent.glob(f".{out.name}.tmp-*"))


def assert_no_complete_dir(out: Path) -> None:
    """Nothing at ``out`` that looks like a finished run, and every temp dir visibly incomplete."""
    assert not out.exists() or not (out / "summary.json").exists(), f"{out} looks complete"
    for tmp in temp_dirs(out):
        assert not (tmp / "summary.json").exists() or (tmp / "INCOMPLETE").exists(), f"{tmp} looks complete"
