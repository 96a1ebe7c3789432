"""The reference implementation: pools on torch tensors, radix caches, scheduler, PD queues."""
