"""One training step: decomposition into calls, the step-time engine, pipeline schedules, memory, end-to-end terms."""
