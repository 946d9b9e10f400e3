"""The kernels a sample times, built exactly as predictor.step.decompose asks for them, forward and backward."""
