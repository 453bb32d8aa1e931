"""The reference policy's perception: what it estimates per task and the images its networks read.

A leaf of the reference package: the policy, its training-data generator and
its trainer all read it, and it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

NET_IMAGE_SIZE = 96  # networks read images resized to this (cv2.INTER_AREA)


@dataclass(frozen=True)
class Perception:
    """What the reference policy estimates for one task."""

    third_points: Tuple[str, ...]  # regressed from robot0_robotview, base frame
    wrist_points: Tuple[str, ...]  # regressed from robot0_eye_in_hand, relative to the gripper
    frames: int  # training frames to generate
    every: int = 3  # render every n control steps
    noise: float = 0.25  # std of the expert's action noise while generating data
    # The policy first looks from this height above a search point (PickPlaceCan: the source bin);
    # the data-generating expert does the same, so the wrist network sees those views.
    search_hover: Optional[float] = None
    # Frames rendered along the policy's own clean rollouts after a first training round
    # (one DAgger round): the wrist network then also knows the views its own mistakes lead to.
    on_policy_frames: int = 0


PERCEPTION: Dict[str, Perception] = {
    "Lift": Perception(third_points=("cube",), wrist_points=("cube",), frames=5000, every=2),
    "Stack": Perception(third_points=("cubeA", "cubeB"), wrist_points=("cubeA", "cubeB"), frames=6000,
                        on_policy_frames=3000),
    # robot0_robotview sits above the bins looking back at the robot: it never sees the can,
    # so this task is solved from a learned prior (the mean can position) and the wrist camera.
    "PickPlaceCan": Perception(third_points=(), wrist_points=("can", "bin"), frames=6000, search_hover=0.2),
    # the handle's direction from the nut's centre gives the nut's yaw
    "NutAssemblySquare": Perception(third_points=("nut", "nut_handle", "peg"), wrist_points=("nut", "nut_handle", "peg"),
                                    frames=6000),
}


def resize(image: np.ndarray) -> np.ndarray:
    """``image`` at the networks' input size (cv2.INTER_AREA), as in training and at inference."""
    import cv2

    if image.shape[0] == NET_IMAGE_SIZE:
        return image
    return cv2.resize(image, (NET_IMAGE_SIZE, NET_IMAGE_SIZE), interpolation=cv2.INTER_AREA)
