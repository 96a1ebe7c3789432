"""The generic Hypothesis state machines, in the package so ``kvledger hunt`` can run them.

* :mod:`.scheduler`: the whole scheduler (any tree, page size, overlap, Mamba V1/V2), :class:`SchedulerMachine`;
* :mod:`.pd`: both PD instances and the channel, :class:`PDMachine`;
* :mod:`.cache`: the radix caches alone (plain, Mamba V1, Mamba V2; tombstone locks and revival),
  :class:`CacheMachine`, checked against a set-of-prefixes model (:mod:`.cache_model`).

They know no exhibit: what makes them find bugs is generic (tiny pools, rule swarms that Hypothesis
draws per example, a swarm of fault kinds per example, aborts of requests in every state including
ended ones, forced retraction, overlap, ``hypothesis.target`` toward pressure, requests in flight and
retractions). The tests (``tests/scheduler/test_scheduler_machine.py``, ``tests/disagg/test_pd_machine.py``,
``tests/caches/test_stateful.py``) run them under the ``ci``/``dev``/``deep`` profiles.

Every check a machine makes raises a ``ContractViolation`` naming a registered invariant
(:mod:`.checks`), so every failure ``kvledger hunt`` reports carries an ID; a plain ``assert`` is kept
only to narrow a type (``tests/museum/test_machine_checks.py`` holds the machines to that).
"""

MACHINES = ("scheduler", "pd", "cache")
