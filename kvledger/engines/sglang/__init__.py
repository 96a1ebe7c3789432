"""SGLang's real memory components, built on CPU and watched by kvledger's ledgers (spec/sglang-attach.md).

An optional extra: ``bash scripts/setup_sglang.sh`` installs SGLang without its dependency tree. Nothing
here imports SGLang at import time; :func:`load` does, once per process.
"""

from kvledger.engines.sglang.loader import SUPPORTED_RELEASES, SGLangUnavailable, available, load

__all__ = ["SUPPORTED_RELEASES", "SGLangUnavailable", "available", "load"]
