"""kvsim: a trace-driven discrete-event simulator of KV-cache memory in LLM serving engines."""

from kvsim.version import __version__


def __getattr__(name):
    # Lazy so that `import kvsim` stays cheap and the CLI starts fast.
    if name in ("run", "run_to_dir", "load_results", "comparison_table"):
        from kvsim import api

        return getattr(api, name)
    if name == "sweep":
        import importlib

        return importlib.import_module("kvsim.sweep")
    if name == "load_scenario":
        from kvsim.config import load_scenario

        return load_scenario
    raise AttributeError(name)


def __dir__():
    # The lazy names above are public: list them as `dir(kvsim)` would if they were imported.
    return sorted(set(globals()) | set(__all__))


__all__ = ["__version__", "comparison_table", "load_scenario", "load_results", "run", "run_to_dir", "sweep"]
