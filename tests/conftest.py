"""Session-wide test settings."""

import os

# Simulators render in software on CI machines; never try a display.
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

# Tests are correctness checks, not benchmarks: one intra-op thread keeps the tiny
# backbones fast on a 2-core machine where env workers and pytest share the cores
# (two threads there were measured ~45x slower under contention).
torch.set_num_threads(1)

from joynexus.models import backbone as _backbone  # noqa: E402  (after the settings above)

#: The way a backbone splits its forward as the package ships it (tests check it).
SHIPPED_FORWARD_SPLIT = _backbone.DEFAULT_FORWARD_SPLIT
# Which threads a test's forward runs on must not follow the machine's load (a test that
# counts them, or compares results to the last bit, would flake): the size rule, fixed.
# Servers the tests start in other processes keep the shipped default.
_backbone.DEFAULT_FORWARD_SPLIT = "size"
