"""The web dashboard: static page (``static/``, no build step, no CDN) and its live feed.

The page (``/dashboard``) is plain HTML + JS + CSS shipped in this package; it polls
``/v1/dashboard/state`` with the viewer's API key and draws its own SVG charts.
:class:`~joynexus.server.dashboard.feed.DashboardFeed` keeps the bounded histories the
state endpoint reports (learning curves, service utilization).
"""

from __future__ import annotations

from pathlib import Path

from joynexus.server.dashboard.feed import (
    CURVE_NAMES,
    CurvePoint,
    DashboardFeed,
    UtilizationBucket,
    UtilizationTimeline,
)

__all__ = [
    "CURVE_NAMES",
    "STATIC_DIR",
    "CurvePoint",
    "DashboardFeed",
    "UtilizationBucket",
    "UtilizationTimeline",
]

#: Where the page's files live.
STATIC_DIR = Path(__file__).parent / "static"
