"""Execution-plane services (paper §4.1.2): Training Model, Inference Model, Environment."""
