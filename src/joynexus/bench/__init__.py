"""Benchmarks behind ``joynexus bench ...``: ratios and rates measured in one run."""
