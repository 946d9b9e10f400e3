"""The samplers: sampling plans, timing, operator / collective / ring / in-context samplers, device facts, the speed
check, Parquet shards."""
