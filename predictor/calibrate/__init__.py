"""Fitting from the store: regressors of a platform, end-to-end framework terms, a platform's host overhead."""
