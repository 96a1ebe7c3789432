"""The museum of historical memory-accounting bugs (issue 9).

* :mod:`kvledger.museum.exhibit`: what an exhibit is, and the scoped patch that installs one.
* :mod:`kvledger.museum.catalogue`: the registry, one exhibit per catalogued bug (``EXHIBITS``).
* :mod:`kvledger.museum.scheduler_bugs`, :mod:`kvledger.museum.pd_bugs`: the historical methods.
* :mod:`kvledger.museum.machines`: the generic Hypothesis state machines (scheduler, PD, cache).
* :mod:`kvledger.museum.hunt`: ``kvledger hunt``, the machines run against one exhibit at a time.

Nothing here is imported by the reference code: the museum points at it from outside.
"""

from kvledger.museum.catalogue import BY_ID, EXHIBITS, exhibit, huntable
from kvledger.museum.exhibit import Exhibit, patched

__all__ = ["BY_ID", "EXHIBITS", "Exhibit", "exhibit", "huntable", "patched"]
