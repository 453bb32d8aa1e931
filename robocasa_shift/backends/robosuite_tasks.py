"""The embedded backend's tasks, each in one place: instruction, horizon, success, randomization, geometry.

The ordered subgoals of a task are data of their own (``stage_specs/robosuite/<Task>.yaml``,
content-hashed); everything else the harness, the predicates and the scripted expert
need to know about a task is here, and ``robocasa-shift tasks`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping

from robocasa_shift.core.backend import TaskInfo

HORIZON = 400  # robomimic's evaluation horizon for these tasks (docs/protocol.md section 6)


@dataclass(frozen=True)
class RobosuiteTask:
    """One task of the embedded backend.

    Attributes:
        name: the harness's task name.
        env_name: robosuite's environment name.
        instruction: the language instruction policies receive.
        success: what robosuite's own ``_check_success`` requires (the official outcome).
        randomization: what differs between base episodes (robosuite's placement samplers).
        points: name -> ("body" | "site", model name): the points predicates and the expert read.
        objects: name -> robosuite attribute holding the MujocoObject (contacts and grasps).
        surface: where the objects start: "table" (``table_offset``) or "source_bin" (``bin1_pos``).
        bins: the task has a source and a target bin (their positions are privileged state).
        horizon: official horizon in control steps.
    """

    name: str
    env_name: str
    instruction: str
    success: str
    randomization: str
    points: Mapping[str, tuple] = field(default_factory=dict)
    objects: Mapping[str, str] = field(default_factory=dict)
    surface: str = "table"
    bins: bool = False
    horizon: int = HORIZON

    def info(self) -> TaskInfo:
        """The backend-neutral view of the task."""
        return TaskInfo(self.name, self.horizon, self.instruction, self.success, self.randomization)


TASKS: Dict[str, RobosuiteTask] = {
    t.name: t
    for t in [
        RobosuiteTask(
            "Lift",
            "Lift",
            "lift the red cube",
            "Grasp the cube on the table and lift it 4 cm above the table top.",
            "Cube centre uniform in a 6 x 6 cm square (+-3 cm) at the table's centre, yaw uniform.",
            points={"cube": ("body", "cube_main")},
            objects={"cube": "cube"},
        ),
        RobosuiteTask(
            "Stack",
            "Stack",
            "stack the red cube on the green cube",
            "Pick up cubeA (red) and release it resting on cubeB (green).",
            "Both cubes uniform in a 16 x 16 cm square (+-8 cm), yaw uniform, without overlap.",
            points={"cubeA": ("body", "cubeA_main"), "cubeB": ("body", "cubeB_main")},
            objects={"cubeA": "cubeA", "cubeB": "cubeB"},
        ),
        RobosuiteTask(
            "PickPlaceCan",
            "PickPlaceCan",
            "pick the can and place it in its bin",
            "Move the can from the left bin into its quadrant of the right bin and let go of it.",
            "Can uniform over the source bin's floor, yaw uniform; its target quadrant is fixed.",
            points={"can": ("body", "Can_main")},
            objects={"can": "objects[object_id]"},
            surface="source_bin",
            bins=True,
        ),
        RobosuiteTask(
            "NutAssemblySquare",
            "NutAssemblySquare",
            "put the square nut on the square peg",
            "Grasp the square nut by its handle and fit it over the square peg.",
            "Nut x in [-11.5, -11] cm, y in [11, 22.5] cm from the table centre, yaw uniform; pegs fixed.",
            points={
                "nut": ("body", "SquareNut_main"),
                "nut_handle": ("site", "SquareNut_handle_site"),
                "peg": ("body", "peg1"),
            },
            objects={"nut": "nuts[nut_id]"},
        ),
    ]
}
