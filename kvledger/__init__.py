"""kvledger: formal-invariant-checked reference implementation of LLM-serving memory bookkeeping."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvledger")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.1.0"
