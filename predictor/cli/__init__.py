"""`python -m predictor ...`: the command line."""
