"""SGLang's real ``Scheduler`` on CPU under kvledger (issue 35): build per release, fake tagging worker.

Each release runs in its own process (two SGLang releases cannot share one): :mod:`.release` imports
it, :mod:`.build` builds the real ``Scheduler`` with three overrides, :mod:`.worker` is the fake model
worker that writes and checks data tags, :mod:`.loop` feeds requests and runs the loop body step by
step. See spec/sglang-scheduler.md.
"""
