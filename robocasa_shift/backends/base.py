"""What the harness needs from a simulator backend and from one of its environments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence

import numpy as np

# Camera roles a policy may ask for; each backend maps a role to camera names.
CAMERA_ROLES = ("third_person", "wrist")


@dataclass(frozen=True)


class TaskInfo:
    name: str
    horizon: int
    instruction: str
    description: str


class Env(Protocol):
    """One live environment of a backend, kept across rollouts of one task.

    Perturbation hooks (lights, cameras, base) read from and write to the
    simulator's model and state; ``restore_nominal`` undoes every edit exactly.
    """

    task: TaskInfo
    third_person_cameras: Sequence[str]
    wrist_cameras: Sequence[str]
    action_dim: int

    def reset(self, seed: int) -> None: ...
    def step(self, action: np.ndarray) -> None: ...
    def is_success(self) -> bool: ...
    def render(self, camera: str, size: int) -> np.ndarray: ...
    def proprio(self) -> Dict[str, np.ndarray]: ...
    def privileged_state(self) -> Dict[str, np.ndarray]: ...
    def fingerprint(self) -> str: ...
    def get_state(self) -> Dict[str, Any]: ...
    def set_state(self, state: Mapping[str, Any]) -> None: ...
    def set_physics_state(self, integration: np.ndarray) -> None: ...
    def restore_nominal(self) -> None: ...
    def renderer_info(self) -> Dict[str, Any]: ...
    def close(self) -> None: ...


class TaskTable:
    """``task_names`` and ``task`` for a backend whose tasks are a class-level ``tasks`` mapping
    (name -> an object with ``info() -> TaskInfo``); unknown names list the valid ones."""

    tasks: Mapping[str, Any] = {}

    def task_names(self) -> List[str]:
        return list(self.tasks)

    def task(self, name: str) -> TaskInfo:
        if name not in self.tasks:
            from robocasa_shift.errors import UnknownNameError

            raise UnknownNameError("task", name, list(self.tasks))
        return self.tasks[name].info()


class Backend(Protocol):
    name: str

    def task_names(self) -> List[str]: ...
    def task(self, name: str) -> TaskInfo: ...
    def make(self, task: str, render_profile: str = "fast") -> Env: ...
    def versions(self) -> Dict[str, str]: ...


def cameras_for_roles(env: Env, roles: Sequence[str]) -> List[str]:
    """Camera names for the roles a policy reads, third-person first."""
    unknown = [r for r in roles if r not in CAMERA_ROLES]
    if unknown:
        from robocasa_shift.errors import UnknownNameError

        raise UnknownNameError("camera role", unknown[0], list(CAMERA_ROLES))
    names: List[str] = []
    for role in roles:
        names += list(env.third_person_cameras if role == "third_person" else env.wrist_cameras)
    return names


def state_equal(a: Optional[Mapping[str, Any]], b: Optional[Mapping[str, Any]]) -> bool:
    if a is None or b is None or set(a) != set(b):
        return False
    return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)
