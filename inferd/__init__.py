"""inferd: an LLM serving daemon for GPU nodes. The root holds only what every package needs.

`tomllib` is the standard library's on 3.11+ and its backport `tomli` on 3.10 (GPU nodes may run
3.10: the TensorRT-LLM images do), so nothing else in inferd checks the Python version to read TOML.
"""
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__version__ = "0.1.0"

__all__ = ["__version__", "tomllib"]
