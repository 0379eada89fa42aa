"""Scripted experts for ManiSkill3 tabletop tasks, from the simulator's object state.

ManiSkill's own demonstrations come from motion planning (``mplib``), whose release
that ManiSkill 3.0 pins crashes under NumPy 2 in this environment; these experts steer
the end effector with ``pd_ee_delta_pos`` actions (xyz delta + gripper, 4-D) towards
waypoints computed from the true poses of the cube, the goal and the gripper, which they
read from the simulator (privileged information, as a motion planner does):

* ``PushCube-v1``: go behind the cube at table height with the gripper closed, then
  push it along the line to the goal region;
* ``PickCube-v1``: hover above the cube with the gripper open, descend, close, and
  carry the grasped cube to the goal position.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from joynexus.envs.base import EnvAdapter, EnvObservation, EnvSpec
from joynexus.envs.vector import gym_envs
from joynexus.errors import SpecError

__all__ = ["EXPERT_TASKS", "ManiSkillScriptedPolicy"]

EXPERT_TASKS = ("PickCube-v1", "PushCube-v1")
_CONTROL_MODE = "pd_ee_delta_pos"
#: ``pd_ee_delta_pos`` maps an action of 1 to a 0.1 m target displacement.
_STEP_M = 0.1
_OPEN, _CLOSED = 1.0, -1.0
_HALF = 0.02  # the cubes' half size
_NEAR = 0.01  # waypoint reached


def _vec(pose_p: Any) -> np.ndarray:
    arr = pose_p.cpu().numpy() if hasattr(pose_p, "cpu") else pose_p
    out: np.ndarray = np.asarray(arr, np.float64).reshape(-1, 3)[0]
    return out


class ManiSkillScriptedPolicy:
    """Waypoint expert for :data:`EXPERT_TASKS` (see the module docstring).

    Args:
        spec: The recorded env: ``kind: maniskill``, one of :data:`EXPERT_TASKS`,
            ``options.control_mode: pd_ee_delta_pos``.

    Raises:
        SpecError: another task or control mode.
    """

    def __init__(self, spec: EnvSpec) -> None:
        if spec.task not in EXPERT_TASKS:
            raise SpecError(
                f"no scripted ManiSkill expert for {spec.task!r}; experts exist for "
                f"{', '.join(EXPERT_TASKS)}"
            )
        if spec.options.get("control_mode") != _CONTROL_MODE:
            raise SpecError(
                "the ManiSkill expert steers the end effector: record with "
                f"options.control_mode: {_CONTROL_MODE}",
                field="env.options.control_mode",
            )
        self.task = spec.task
        self._phase: dict[int, int] = {}

    def reset(self) -> None:
        """Start every sub-env's episode from the first waypoint."""
        self._phase.clear()

    def act(self, env: EnvAdapter, obs: EnvObservation) -> np.ndarray:
        rows = [self._act_one(i, sim) for i, sim in enumerate(gym_envs(env))]
        return np.stack(rows).astype(np.float32)

    def _toward(self, tcp: np.ndarray, target: np.ndarray, grip: float) -> np.ndarray:
        delta = np.clip((target - tcp) / _STEP_M, -1.0, 1.0)
        return np.concatenate([delta, [grip]])

    def _act_one(self, i: int, sim: Any) -> np.ndarray:
        tcp = _vec(sim.agent.tcp.pose.p)
        cube = _vec(sim.obj.pose.p if self.task == "PushCube-v1" else sim.cube.pose.p)
        phase = self._phase.setdefault(i, 0)
        if self.task == "PushCube-v1":
            goal = _vec(sim.goal_region.pose.p)
            direction = goal[:2] - cube[:2]
            direction /= max(float(np.linalg.norm(direction)), 1e-6)
            behind = cube.copy()
            behind[:2] -= direction * (_HALF + 0.03)
            waypoints = [
                np.array([behind[0], behind[1], 0.08]),  # above, behind the cube
                np.array([behind[0], behind[1], _HALF]),  # down to its centre height
            ]
            if phase < len(waypoints):
                target = waypoints[phase]
                if np.linalg.norm(target - tcp) < _NEAR:
                    self._phase[i] = phase + 1
                return self._toward(tcp, target, _CLOSED)
            push = cube.copy()
            push[:2] += direction * 0.05  # keep pushing through the cube's centre
            push[2] = _HALF
            return self._toward(tcp, push, _CLOSED)
        goal = _vec(sim.goal_site.pose.p)
        grasped = bool(np.asarray(sim.agent.is_grasping(sim.cube).cpu()).reshape(-1)[0])
        above = cube + np.array([0.0, 0.0, 0.06])
        if phase == 0:  # hover above the cube, open
            if np.linalg.norm(above - tcp) < _NEAR:
                self._phase[i] = 1
            return self._toward(tcp, above, _OPEN)
        if phase == 1:  # descend around it
            if np.linalg.norm(cube - tcp) < 0.005:
                self._phase[i] = 2
            return self._toward(tcp, cube, _OPEN)
        if phase == 2:  # close until it holds
            if grasped:
                self._phase[i] = 3
            return self._toward(tcp, cube, _CLOSED)
        return self._toward(tcp, goal, _CLOSED)
