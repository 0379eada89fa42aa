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
