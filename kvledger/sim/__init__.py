"""The simulation driver behind ``kvledger simulate``: workload, run, report."""
