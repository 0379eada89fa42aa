"""``joynexus demo``: the paper's §5.1 experiment at small scale on the real services.

* :mod:`joynexus.demo.mixture` — the workload mixture (3 RL + 1 SFT + 1 evaluation).
* :mod:`joynexus.demo.phase` — one run on an in-process Master and its measured trace.
* :mod:`joynexus.demo.baseline` — the isolated single-tenant replay of the matched work.
* :mod:`joynexus.demo.report` — utilization, device time and ``report.json``;
* :mod:`joynexus.demo.plots` — its figures.
* :mod:`joynexus.demo.runner` — :func:`run_demo`, what the command runs.
"""

from joynexus.demo.mixture import DemoMixture, build_mixture
from joynexus.demo.runner import DemoResult, run_demo

__all__ = ["DemoMixture", "DemoResult", "build_mixture", "run_demo"]
