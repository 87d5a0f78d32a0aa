"""``kvsim conformance vllm [--cases A,B] [--list]``: run the conformance cases against vLLM."""

from __future__ import annotations

import sys

from kvsim.errors import KvsimError


def parse_cases(text: str | None) -> list[str] | None:
    """The case names of ``--cases A,B`` (spaces around a name stripped, empty items dropped); None when the
    flag is not given (all cases). ValueError when it names none (``''``, ``,``)."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        from kvsim.conformance.cases import builtin_cases

        raise ValueError(f"{text!r} names no case; give comma-separated names (choose from "
                         f"{', '.join(c.name for c in builtin_cases())}), or leave --cases out to run them all")
    return names


def _cmd_vllm(args) -> int:
    from kvsim.conformance.runner import run_case, select, table
    from kvsim.conformance.vllm_side import vllm_version

    try:
        cases = select(parse_cases(args.cases))
    except ValueError as e:
        raise KvsimError(f"--cases: {e}") from None
    if args.list:
        for c in cases:
            print(f"{c.name}: {c.description}" + (f" [exceptions: {', '.join(c.exceptions)}]" if c.exceptions else ""))
        return 0
    version = vllm_version()  # one line and exit 2 without vLLM
    outcomes = []
    for c in cases:
        outcomes.append(run_case(c))
        if not args.quiet:
            print(f"{c.name}: {outcomes[-1].status()}", file=sys.stderr)
    print(f"vLLM {version} v1 scheduler vs kvsim (engine.mode step and fast, constant step time)")
    print(table(outcomes))
    bad = [o for o in outcomes if not o.ok]
    for o in bad:
        if o.case.exceptions:
            print(f"case {o.case.name}: expected a difference (exceptions {', '.join(o.case.exceptions)}), "
                  f"found none", file=sys.stderr)
        for mode, diffs in o.diffs.items():
            if diffs and not o.case.exceptions:
                print(diffs[0].message(), file=sys.stderr)
    return 1 if bad else 0


def register(sub) -> None:
    c = sub.add_parser("conformance", help="check kvsim's scheduler and KV cache against a real engine's",
                       description="Conformance suites against real engines (docs/conformance.md).")
    engines = c.add_subparsers(dest="engine", metavar="ENGINE")
    engines.required = True
    v = engines.add_parser(
        "vllm", help="replay each case through vLLM's v1 scheduler and kvsim; print the table",
        description="Replay each case's requests through vLLM's own v1 Scheduler + KVCacheManager (driven "
                    "step by step without a model) and through kvsim in engine.mode step and fast with a "
                    "constant step time; compare per step (running, waiting, scheduled tokens, prefill/decode "
                    "requests, KV blocks used, preemptions, prefix-hit tokens) and per request (first scheduled, "
                    "first token and finish step, preemptions, cached tokens). Needs the conformance extra "
                    "(pip install 'kvsim[conformance]'). Exit 0: every case as expected; 1: a case differs "
                    "(the first differing step or request, field and both values on stderr); 2: bad input or "
                    "no vLLM.")
    v.add_argument("--cases", metavar="A,B", help="comma-separated case names (default: all; --list shows them)")
    v.add_argument("--list", action="store_true", help="list the cases and exit (needs no vLLM)")
    v.add_argument("-q", "--quiet", action="store_true", help="no per-case progress lines on stderr")
    v.set_defaults(func=_cmd_vllm)
