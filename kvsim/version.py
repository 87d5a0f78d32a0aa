"""kvsim's version string (a leaf: imports nothing). ``kvsim.__version__`` re-exports it; modules
inside kvsim import it from here, so nothing below the package root imports the root (docs/architecture.md, "Layers")."""

__version__ = "0.1.0"
