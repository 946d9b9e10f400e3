"""The transformer and the layout: typed specs, the one typed error, bounds, parameter counts, presets, MoE routing,
frameworks, loose fields <-> specs, the operator vocabulary."""
