"""Operator features, the per-(platform, operator, pass) regressors, and their transfer to unsampled GPUs."""
