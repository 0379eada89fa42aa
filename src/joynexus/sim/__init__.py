"""Trace-driven simulation of JoyNexus at paper scale, around the real Training Scheduler.

``run_experiment(load_scenario("paper-5.1"))`` runs §5.1's multi-tenant trace and its
workload-matched isolated replay; :func:`summarize` turns it into the JSON report.
"""

from joynexus.sim.engine import Engine, Event, Signal, SimClock, Timeout, WaitSignal
from joynexus.sim.experiment import Experiment, run_experiment, summarize
from joynexus.sim.model import RunResult, Simulation, UpdateRecord
from joynexus.sim.scenario import Scenario, load_scenario, preset, scenario_to_yaml

__all__ = [
    "Engine",
    "Event",
    "Experiment",
    "RunResult",
    "Scenario",
    "Signal",
    "SimClock",
    "Simulation",
    "Timeout",
    "UpdateRecord",
    "WaitSignal",
    "load_scenario",
    "preset",
    "run_experiment",
    "scenario_to_yaml",
    "summarize",
]
