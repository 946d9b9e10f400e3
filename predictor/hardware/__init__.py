"""Devices, platforms and clusters, the network model and its fit, CPU fingerprints, the speed check."""
