"""LeRobot-format datasets: write (v3.0), read (v3.0, v2.x), and build SFT batches.

The public entry points are :class:`LeRobotDatasetWriter` (record or convert data),
:class:`LeRobotDataset` (frame access, ``delta_timestamps`` windows) and, in
:mod:`joynexus.data.sft`, the tenant-schema batch builder with its normalization stats.
"""

from __future__ import annotations

from joynexus.data.lerobot_format import CODEBASE_VERSION, DatasetInfo, FeatureSpec
from joynexus.data.metadata import DatasetMeta, EpisodeMeta, load_meta
from joynexus.data.reader import LeRobotDataset
from joynexus.data.writer import LeRobotDatasetWriter

__all__ = [
    "CODEBASE_VERSION",
    "DatasetInfo",
    "DatasetMeta",
    "EpisodeMeta",
    "FeatureSpec",
    "LeRobotDataset",
    "LeRobotDatasetWriter",
    "load_meta",
]
