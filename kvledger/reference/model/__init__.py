"""The tiny hybrid reference model (attention + Mamba-like layer) and its runner over the pools."""

from kvledger.reference.model.runner import TinyHybridRunner
from kvledger.reference.model.tiny_hybrid import TinyHybridConfig, TinyHybridWeights, generate_alone

__all__ = ["TinyHybridConfig", "TinyHybridRunner", "TinyHybridWeights", "generate_alone"]
