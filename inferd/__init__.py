"""inferd: an LLM serving daemon for GPU nodes."""

__version__ = "0.1.0"
