"""stackforge: declarative MUSA release trains rendered into gated vLLM images."""

__version__ = "0.1.0"
