"""What a user asks: the Predictor facade, layout search, predict-batch, costing, memory verdicts, what a prediction
rests on."""
