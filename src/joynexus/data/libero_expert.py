"""Scripted pick-and-place expert for LIBERO tasks whose goal is ``(On A B)``.

LIBERO's own demonstrations were teleoperated and are hdf5 files out of reach here; this
expert plans from the simulator's true state instead (privileged information, as a
motion planner would use), in the env's own control: OSC_POSE deltas and a gripper
command (:mod:`joynexus.envs.libero`).

It reads the task's goal from the parsed BDDL problem: a single ``On`` predicate whose
first argument is a movable object ``A`` and whose second is an object or a region site
``B``. That accepts every libero_spatial task ("pick up the black bowl ... and place it on
the plate") and the libero_goal tasks that put one thing on another ("put the bowl on
the plate", "put the bowl on the stove", ...). The plan, with waypoints from the live
poses and collision geometry of ``A`` and ``B``:

1. hover above the grasp point with the gripper open, fingers along the world x axis,
   pointing straight down (the orientation is held throughout);
2. descend to it and close. The Panda's fingers open about 8 cm: an object wider than
   that along x (the bowls) is pinched by its rim, on the side of its centre that has
   more room; a narrower one is grasped across its centre;
3. lift ``A``, carry it above ``B`` and lower it until it is a little above ``B``'s top,
   steering ``A``'s position rather than the gripper's (the grasp is off-centre);
4. open the gripper; LIBERO's success check ends the episode once ``A`` rests on ``B``.

If ``A`` did not come up with the gripper (a missed grasp), the expert opens and starts
over from 1. ``joynexus data record --env libero --task libero_spatial/0`` records it.
Success rates it reached are in the docs (results, LIBERO section).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from joynexus.envs.base import EnvAdapter, EnvObservation, EnvSpec
from joynexus.envs.vector import gym_envs
from joynexus.errors import SpecError

__all__ = ["LiberoScriptedPolicy", "pick_place_goal"]

_OPEN, _CLOSED = -1.0, 1.0
#: OSC_POSE maps an action of 1 to a 5 cm (position) / 0.5 rad (rotation) target offset;
#: the arm settles short of small offsets (gravity, damping), so the expert asks for a
#: full-scale move until it is within 1.5 cm of a target.
_POS_SCALE, _ROT_SCALE = 0.015, 0.5
_FINGER_REACH = 0.07  # widest object the open fingers straddle (they open ~8 cm)
_RIM_INSET = 0.004  # grasp a wide object's rim this far inside its outer edge
_HOVER = 0.08  # above the object's top before descending
_CARRY = 0.10  # A's bottom above B's top while carried
_DROP = 0.015  # A's bottom above B's top when released
_NEAR = 0.012  # a via point is reached
_CLOSE_STEPS = 12  # gripper closing time
_OPEN_STEPS = 8
_STALL_STEPS = 40  # give up waiting on a waypoint the arm cannot quite reach
_MISSED = 100  # the phase after a grasp that did not hold
_X, _Z = np.array([1.0, 0.0, 0.0]), np.array([0.0, 0.0, 1.0])
_DOWN = np.diag([1.0, -1.0, -1.0])  # gripper pointing down, fingers along world x


def pick_place_goal(goal_state: list[list[str]]) -> tuple[str, str] | None:
    """``(A, B)`` when a parsed BDDL goal is the single predicate ``(On A B)``, else None."""
    if len(goal_state) != 1:
        return None
    pred = [str(p).lower() for p in goal_state[0]]
    if len(pred) != 3 or pred[0] != "on":
        return None
    return goal_state[0][1], goal_state[0][2]


@dataclass
class _Extent:
    """A body's collision geometry in the world: centre of its AABB, half sizes."""

    center: np.ndarray
    half: np.ndarray

    @property
    def top(self) -> float:
        return float(self.center[2] + self.half[2])

    @property
    def bottom(self) -> float:
        return float(self.center[2] - self.half[2])


@dataclass
class _Plan:
    """One sub-env's progress through the pick and place."""

    phase: int = 0
    steps: int = 0  # steps spent in this phase
    grasp: np.ndarray | None = None  # gripper target at the grasp
    a_lift_from: float = 0.0  # A's height when the gripper closed
    below: float = 0.0  # A's body position above its bottom
    attempts: int = 0


def _collision_geoms(model: Any, body_id: int) -> list[int]:
    """Collision geoms of ``body_id`` and every body below it."""
    out = []
    for g in range(model.ngeom):
        b = int(model.geom_bodyid[g])
        while b not in (0, body_id):
            b = int(model.body_parentid[b])
        if b == body_id and (model.geom_contype[g] or model.geom_conaffinity[g]):
            out.append(g)
    return out


def _extent(model: Any, data: Any, geoms: list[int]) -> _Extent:
    lo, hi = np.full(3, np.inf), np.full(3, -np.inf)
    for g in geoms:
        rot = np.asarray(data.geom_xmat[g]).reshape(3, 3)
        center = np.asarray(data.geom_xpos[g]) + rot @ model.geom_aabb[g, :3]
        half = np.abs(rot) @ model.geom_aabb[g, 3:]
        lo, hi = np.minimum(lo, center - half), np.maximum(hi, center + half)
    return _Extent(center=(lo + hi) / 2, half=(hi - lo) / 2)


def _rotation_error(current: np.ndarray) -> np.ndarray:
    """World-frame axis-angle that turns ``current`` (3×3) into :data:`_DOWN`."""
    err = _DOWN @ current.T
    cos = float(np.clip((np.trace(err) - 1.0) / 2.0, -1.0, 1.0))
    angle = float(np.arccos(cos))
    if angle < 1e-6:
        return np.zeros(3)
    axis = np.array([err[2, 1] - err[1, 2], err[0, 2] - err[2, 0], err[1, 0] - err[0, 1]])
    norm = float(np.linalg.norm(axis))
    if norm < 1e-9:  # a half turn: the gripper points up; turn it over about x
        return np.array([angle, 0.0, 0.0])
    vec: np.ndarray = axis / norm * angle
    return vec


class _Scene:
    """Live poses of the gripper, ``A`` and ``B`` in one LIBERO problem instance."""

    def __init__(self, problem: Any, a: str, b: str) -> None:
        self.problem = problem
        self.model = problem.sim.model._model
        self.data = problem.sim.data._data
        self.a_body = self._body(a)
        self.a_geoms = _collision_geoms(self.model, self.a_body)
        self.b_site: int | None = None
        self.b_geoms: list[int] = []
        if b in problem.object_sites_dict and b not in problem.objects_dict:
            self.b_site = int(self.model.site(b).id)  # a region site is named as in the BDDL
        else:
            self.b_geoms = _collision_geoms(self.model, self._body(b))
        self.grip_site = int(self.model.site("gripper0_grip_site").id)

    def _body(self, name: str) -> int:
        thing = self.problem.get_object(name)
        root = getattr(thing, "root_body", None)
        if root is None:
            raise SpecError(f"the LIBERO expert cannot find the body of {name!r}")
        return int(self.model.body(root).id)

    def eef(self) -> np.ndarray:
        return np.array(self.data.site_xpos[self.grip_site])

    def eef_rot(self) -> np.ndarray:
        return np.array(self.data.site_xmat[self.grip_site]).reshape(3, 3)

    def a_pos(self) -> np.ndarray:
        return np.array(self.data.xpos[self.a_body])

    def a_extent(self) -> _Extent:
        return _extent(self.model, self.data, self.a_geoms)

    def others(self) -> list[np.ndarray]:
        """Centres of the other movable objects (to pick the freer side of a rim)."""
        out = []
        for obj in self.problem.objects_dict.values():
            body = int(self.model.body(obj.root_body).id)
            if body != self.a_body:
                out.append(np.array(self.data.xpos[body]))
        return out

    def b_place(self) -> tuple[np.ndarray, float]:
        """Where ``A`` goes: ``B``'s centre (xy) and the height of its top."""
        if self.b_site is not None:
            pos = np.array(self.data.site_xpos[self.b_site])
            return pos[:2], float(pos[2])
        ext = _extent(self.model, self.data, self.b_geoms)
        return ext.center[:2], ext.top


class LiberoScriptedPolicy:
    """Pick-and-place expert for LIBERO tasks with an ``(On A B)`` goal (module docstring).

    Args:
        spec: The recorded env (``kind: libero``).

    Raises:
        SpecError: not a LIBERO env, or (on the first action) a goal this expert does not
            handle.
    """

    def __init__(self, spec: EnvSpec) -> None:
        if spec.kind != "libero" or not spec.task:
            raise SpecError(
                "the LIBERO expert needs a libero env with a task, e.g. libero_spatial/0"
            )
        self.task = spec.task
        self._plans: dict[int, _Plan] = {}
        self._scenes: dict[int, _Scene] = {}

    def reset(self) -> None:
        """Start every sub-env's episode from the first waypoint."""
        self._plans.clear()
        self._scenes.clear()

    def act(self, env: EnvAdapter, obs: EnvObservation) -> np.ndarray:
        rows = [self._act_one(i, sim) for i, sim in enumerate(gym_envs(env))]
        return np.stack(rows).astype(np.float32)

    def _scene(self, i: int, wrapper: Any) -> _Scene:
        scene = self._scenes.get(i)
        if scene is None:
            problem = getattr(wrapper, "env", wrapper)
            goal = pick_place_goal(problem.parsed_problem["goal_state"])
            if goal is None or goal[0] not in problem.objects_dict:
                raise SpecError(
                    f"no scripted LIBERO expert for {self.task!r}: it handles goals "
                    "(On <object> <object or region>), this task's goal is "
                    f"{problem.parsed_problem['goal_state']}"
                )
            scene = self._scenes[i] = _Scene(problem, *goal)
        return scene

    def _move(self, scene: _Scene, target: np.ndarray, grip: float) -> np.ndarray:
        pos = np.clip((target - scene.eef()) / _POS_SCALE, -1.0, 1.0)
        rot = np.clip(_rotation_error(scene.eef_rot()) / _ROT_SCALE, -1.0, 1.0)
        return np.concatenate([pos, rot, [grip]])

    def _grasp_point(self, scene: _Scene) -> np.ndarray:
        ext = scene.a_extent()
        point = ext.center.copy()
        if ext.half[0] > _FINGER_REACH / 2:  # too wide to straddle: pinch its rim
            offset = ext.half[0] - _RIM_INSET
            sides = [point + s * offset * _X for s in (1.0, -1.0)]
            others = scene.others()

            def room(p: np.ndarray) -> float:
                return min((float(np.linalg.norm((p - o)[:2])) for o in others), default=1.0)

            point = max(sides, key=room)
        # Fingertips reach ~1 cm below the grip site: close them ~3 cm below its top.
        point[2] = max(ext.top - 0.02, ext.bottom + 0.02)
        return point

    def _act_one(self, i: int, wrapper: Any) -> np.ndarray:
        scene = self._scene(i, wrapper)
        plan = self._plans.setdefault(i, _Plan())
        plan.steps += 1
        eef = scene.eef()

        def advance(done: bool) -> None:
            if done or plan.steps >= _STALL_STEPS:
                plan.phase, plan.steps = plan.phase + 1, 0

        if plan.phase == 0:  # hover above the grasp point, open
            plan.grasp = self._grasp_point(scene)
            above = plan.grasp + _HOVER * _Z
            advance(bool(np.linalg.norm(above - eef) < _NEAR))
            return self._move(scene, above, _OPEN)
        assert plan.grasp is not None
        if plan.phase == 1:  # descend to it
            advance(bool(np.linalg.norm(plan.grasp - eef) < 0.006))
            return self._move(scene, plan.grasp, _OPEN)
        if plan.phase == 2:  # close
            if plan.steps >= _CLOSE_STEPS:
                plan.a_lift_from = float(scene.a_pos()[2])
                plan.below = plan.a_lift_from - scene.a_extent().bottom
                plan.phase, plan.steps = 3, 0
            return self._move(scene, plan.grasp, _CLOSED)
        a = scene.a_pos()
        held = eef - a  # steer A, not the gripper: the grasp is off-centre
        b_xy, b_top = scene.b_place()
        carry_z = max(b_top, plan.a_lift_from - plan.below) + _CARRY + plan.below
        if plan.phase == 3:  # lift straight up
            lifted = np.array([a[0], a[1], carry_z])
            if plan.steps > 10 and a[2] < plan.a_lift_from + 0.01:  # it stayed down
                plan.attempts += 1
                plan.phase, plan.steps = _MISSED, 0
                return self._move(scene, eef, _OPEN)
            advance(bool(a[2] > carry_z - 0.02))
            return self._move(scene, lifted + held, _CLOSED)
        if plan.phase == 4:  # carry it above B
            over = np.array([b_xy[0], b_xy[1], carry_z])
            advance(bool(np.linalg.norm((over - a)[:2]) < _NEAR / 2))
            return self._move(scene, over + held, _CLOSED)
        if plan.phase == 5:  # lower it onto B
            on = np.array([b_xy[0], b_xy[1], b_top + _DROP + plan.below])
            advance(bool(abs(on[2] - a[2]) < 0.006))
            return self._move(scene, on + held, _CLOSED)
        if plan.phase == 6:  # let go, holding still
            advance(plan.steps >= _OPEN_STEPS)
            return self._move(scene, eef, _OPEN)
        if plan.phase == _MISSED:  # open, rise a little, then start over
            if plan.steps >= _OPEN_STEPS:
                self._plans[i] = _Plan(attempts=plan.attempts)
            return self._move(scene, eef + 0.02 * _Z, _OPEN)
        return self._move(scene, eef + 0.03 * _Z, _OPEN)  # back off up
