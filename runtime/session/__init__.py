"""Sessions: building (EPs, partition, compile, plan) and running (plan, hooks, profiler)."""
