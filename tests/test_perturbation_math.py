import numpy as np
import pytest

from robocasa_shift import seeding
from robocasa_shift.core.factors import (
    CameraRotation,
    GaussianBlur,
    axis_angle_quat,
    in_place_offsets,
    max_abs_difference,
    quat_mul,
    quat_to_mat,
    rotate_in_place,
)

ROBOTVIEW_QUAT = np.array([0.65309797, 0.27104066, 0.27104066, 0.65309797])


@pytest.mark.parametrize("yaw, pitch", [(0.0, 0.0), (1.3, -0.4), (-7.0, 6.5), (10.0, 0.0), (0.0, -10.0)])
def test_in_place_rotation_round_trips(yaw, pitch):
    vertical = np.array([0.0, 0.0, 1.0])
    q = rotate_in_place(ROBOTVIEW_QUAT, vertical, yaw, pitch)
    assert np.isclose(np.linalg.norm(q), 1.0)
    got = in_place_offsets(ROBOTVIEW_QUAT, q, vertical)
    np.testing.assert_allclose(got, (yaw, pitch), atol=1e-9)


def test_yaw_turns_the_optical_axis_about_the_vertical_and_pitch_tilts_it():
    vertical = np.array([0.0, 0.0, 1.0])
    axis0 = -quat_to_mat(ROBOTVIEW_QUAT)[:, 2]  # cameras look along -z
    axis_yaw = -quat_to_mat(rotate_in_place(ROBOTVIEW_QUAT, vertical, 10.0, 0.0))[:, 2]
    # yaw keeps the elevation of the optical axis and turns its heading by 10 degrees
    assert np.isclose(axis_yaw[2], axis0[2])
    heading = np.degrees(np.arctan2(axis_yaw[1], axis_yaw[0]) - np.arctan2(axis0[1], axis0[0]))
    assert np.isclose(heading, 10.0)
    axis_pitch = -quat_to_mat(rotate_in_place(ROBOTVIEW_QUAT, vertical, 0.0, 10.0))[:, 2]
    assert np.isclose(np.degrees(np.arccos(np.clip(axis0 @ axis_pitch, -1, 1))), 10.0)


def test_camera_draw_is_in_the_unit_disk_and_shared_by_levels():
    kind = CameraRotation()
    draws = [kind.draw(None, seeding.draw_rng(1, "camera", "Lift", "formal", e))["draw"] for e in range(500)]
    radii = np.linalg.norm(draws, axis=1)
    assert radii.max() <= 1.0
    # uniform in the disk: P(r < 1/2) = 1/4
    assert 0.19 < np.mean(radii < 0.5) < 0.31


def test_blur_is_exactly_cv2_gaussian_blur():
    import cv2

    img = np.random.default_rng(0).integers(0, 256, (128, 128, 3), dtype=np.uint8)
    out = GaussianBlur().transform(img, {"sigma_px": 2.0})
    assert out.dtype == np.uint8 and out.shape == img.shape
    np.testing.assert_array_equal(out, cv2.GaussianBlur(img, (0, 0), sigmaX=2.0, sigmaY=2.0))
    np.testing.assert_array_equal(
        out, cv2.GaussianBlur(img, (0, 0), sigmaX=2.0, sigmaY=2.0, borderType=cv2.BORDER_REFLECT_101)
    )


def test_quaternion_helpers_agree():
    q = quat_mul(axis_angle_quat([0, 0, 1], 0.3), axis_angle_quat([1, 0, 0], -0.2))
    r = quat_to_mat(axis_angle_quat([0, 0, 1], 0.3)) @ quat_to_mat(axis_angle_quat([1, 0, 0], -0.2))
    np.testing.assert_allclose(quat_to_mat(q), r, atol=1e-12)


def test_max_abs_difference():
    assert max_abs_difference({"a": [1.0, 2.0]}, {"a": [1.0, 2.5]}) == 0.5
    assert max_abs_difference({"a": [1.0]}, {"b": [1.0]}) == float("inf")
    assert max_abs_difference([1.0, 2.0], [1.0]) == float("inf")
