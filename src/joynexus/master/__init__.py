"""The Master Service (paper §4.1.1): the one orchestrator of workloads.

It sits above :mod:`joynexus.workflows` (whose loops it starts and stops) and below the
entry points that host it: ``joynexus run`` (in process, to completion), ``joynexus
serve`` (behind HTTP) and ``joynexus demo``.
"""
