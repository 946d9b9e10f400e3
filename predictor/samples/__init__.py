"""The DuckDB sample store and the parsers of every sample / measured-run format it ingests."""
