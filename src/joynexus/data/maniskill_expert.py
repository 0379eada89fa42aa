"""Scripted experts for ManiSkill3 tabletop tasks, from the simulator's object state.

ManiSkill's own demonstrations come from motion planning (``mplib``), whose release
that ManiSkill 3.0 pins crashes under NumPy 2 in this environment; these experts steer
the end effector with ``pd_ee_delta_pos`` actions (xyz delta + gripper, 4-D) towards
waypoints computed from the true poses of the cube, the goal and the gripper, which they
read from the simulator (privileged information, as a motion planner does):

* ``PushCube-v1``: go behind the cube at table height with the gripper closed, then
  push it along the line to the goal region;
* ``PickCube-v1``: hover above the cube with the gripper open, descend, close, and
  carry the grasped cube to the goal position;
* ``StackCube-v1``: grasp cube A the same way, lift it clear of cube B, carry it above
  cube B, lower it until it rests on B and open the gripper (ManiSkill's success needs
  cube A on B, static and released). Once cube A is held the expert steers the cube's
  own position, not the gripper's, so an off-centre grasp still lands it on B.

``joynexus data record --env maniskill`` records with :data:`EXPERT_CONTROL_MODE`.

Measured (``joynexus data record``, seeds 0-9 each): PickCube, PushCube and StackCube
10 of 10; the StackCube expert also succeeded in 139 of 140 episodes on seeds 10-49 and
100-199. Its known failure: the gripper cannot turn in this control mode and its fingers
open along the world x axis, so when cube B sits right next to cube A along x (seed 31)
a finger lands on cube B and the descent stalls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from joynexus.envs.base import EnvAdapter, EnvObservation, EnvSpec
from joynexus.envs.vector import gym_envs
from joynexus.errors import SpecError

__all__ = ["EXPERT_CONTROL_MODE", "EXPERT_TASKS", "ManiSkillScriptedPolicy"]

EXPERT_TASKS = ("PickCube-v1", "PushCube-v1", "StackCube-v1")
#: The control mode the experts act in (xyz end-effector delta + gripper).
EXPERT_CONTROL_MODE = "pd_ee_delta_pos"
#: ``pd_ee_delta_pos`` maps an action of 1 to a 0.1 m target displacement.
_STEP_M = 0.1
_OPEN, _CLOSED = 1.0, -1.0
_HALF = 0.02  # the cubes' half size
_NEAR = 0.01  # waypoint reached
_LIFT = 0.05  # cube A's clearance above cube B while carried


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
        SpecError: no task, a task without an expert, or another control mode.
    """

    def __init__(self, spec: EnvSpec) -> None:
        if not spec.task:
            raise SpecError(
                "maniskill recording needs a task with an expert, e.g. --task PickCube-v1; "
                f"experts exist for {', '.join(EXPERT_TASKS)}"
            )
        if spec.task not in EXPERT_TASKS:
            raise SpecError(
                f"no scripted ManiSkill expert for {spec.task!r}; experts exist for "
                f"{', '.join(EXPERT_TASKS)}"
            )
        if spec.options.get("control_mode") != EXPERT_CONTROL_MODE:
            raise SpecError(
                "the ManiSkill expert steers the end effector: record with "
                f"options.control_mode: {EXPERT_CONTROL_MODE}",
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
        phase = self._phase.setdefault(i, 0)
        if self.task == "StackCube-v1":
            return self._stack(i, sim, tcp, phase)
        cube = _vec(sim.obj.pose.p if self.task == "PushCube-v1" else sim.cube.pose.p)
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
        grasping = self._grasp(i, tcp, cube, _grasping(sim, sim.cube), phase)
        return grasping if grasping is not None else self._toward(tcp, goal, _CLOSED)

    def _grasp(
        self, i: int, tcp: np.ndarray, cube: np.ndarray, grasped: bool, phase: int
    ) -> np.ndarray | None:
        """Phases 0–2 of a pick (hover above ``cube`` open, descend around it, close
        until it holds); None from phase 3 on, once it is held."""
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
        return None

    def _stack(self, i: int, sim: Any, tcp: np.ndarray, phase: int) -> np.ndarray:
        """StackCube: grasp cube A, lift it, carry it above cube B, lower it, let go."""
        cube_a, cube_b = _vec(sim.cubeA.pose.p), _vec(sim.cubeB.pose.p)
        grasped = _grasping(sim, sim.cubeA)
        grasping = self._grasp(i, tcp, cube_a, grasped, phase)
        if grasping is not None:
            return grasping
        # Once held, steer the cube (the grasp need not be centred): tcp moves with it.
        held = tcp - cube_a
        on_b = cube_b + np.array([0.0, 0.0, 2 * _HALF])  # cube A's centre when stacked
        over_b = on_b + np.array([0.0, 0.0, _LIFT])
        if phase == 3:  # lift straight up, clear of cube B
            lifted = np.array([cube_a[0], cube_a[1], over_b[2]])
            if cube_a[2] > over_b[2] - _NEAR:
                self._phase[i] = 4
            return self._toward(tcp, lifted + held, _CLOSED)
        if phase == 4:  # carry it above cube B
            if np.linalg.norm(over_b - cube_a) < _NEAR / 2:
                self._phase[i] = 5
            return self._toward(tcp, over_b + held, _CLOSED)
        if phase == 5:  # lower it onto cube B
            if np.linalg.norm(on_b - cube_a) < 0.004:
                self._phase[i] = 6
            return self._toward(tcp, on_b + held, _CLOSED)
        if phase == 6:  # let go, holding still
            if not grasped:
                self._phase[i] = 7
            return np.array([0.0, 0.0, 0.0, _OPEN])
        return self._toward(tcp, tcp + np.array([0.0, 0.0, 0.02]), _OPEN)  # back off up


def _grasping(sim: Any, actor: Any) -> bool:
    held = sim.agent.is_grasping(actor)
    return bool(np.asarray(held.cpu() if hasattr(held, "cpu") else held).reshape(-1)[0])
