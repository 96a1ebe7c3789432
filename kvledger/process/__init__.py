"""Process-wide concerns below every room: a Ctrl-C that ends a command even when a library swallowed it
(:mod:`.interrupt`), and output files that appear whole or not at all (:mod:`.staged`).

Any floor may import it; it imports nothing of kvledger's but itself.
"""
