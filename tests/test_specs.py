import json

import pytest
import yaml

from robocasa_shift import errors
from robocasa_shift.core import specs

FROZEN = {
    "illumination": {"L1": {"alpha": 0.8}, "L2": {"alpha": 0.6}, "L3": {"alpha": 0.4}},
    "camera": {"L1": {"theta_max_deg": 2.0}, "L2": {"theta_max_deg": 6.0}, "L3": {"theta_max_deg": 10.0}},
    "base": {
        "L1": {"sigma_xy_m": 0.02, "sigma_psi_deg": 2.0},
        "L2": {"sigma_xy_m": 0.05, "sigma_psi_deg": 5.0},
        "L3": {"sigma_xy_m": 0.10, "sigma_psi_deg": 10.0},
    },
    "blur": {"L1": {"sigma_px": 1.0}, "L2": {"sigma_px": 2.0}, "L3": {"sigma_px": 4.0}},
}


def test_protocol_has_the_frozen_numbers(protocol):
    assert protocol.conditions == ["clean"] + [f"{f}:L{i}" for f in FROZEN for i in (1, 2, 3)]
    for factor, levels in FROZEN.items():
        assert {lv: protocol.factor(factor).level(lv) for lv in levels} == levels
    assert protocol.factor("camera").draw == "unit_disk"
    assert protocol.factor("base").draw == "standard_normal_3"
    assert protocol.factor("illumination").draw == "none"


def test_hash_ignores_comments_and_formatting(tmp_path):
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    a.write_text("x: 1\ny: [1, 2]\n")
    b.write_text("# a comment\ny:\n  - 1\n  - 2   # another\nx:    1\n")
    assert specs.canonical_hash(yaml.safe_load(a.read_text())) == specs.canonical_hash(yaml.safe_load(b.read_text()))
    assert specs.canonical_hash({"x": 1}) != specs.canonical_hash({"x": 2})


def test_tampered_number_is_refused_with_both_hashes(spec_copy):
    path = spec_copy / "blur.yaml"
    version = yaml.safe_load(path.read_text())["version"]
    frozen = specs.read_lock(spec_copy)["blur.yaml"][str(version)]
    path.write_text(path.read_text().replace("L3: {sigma_px: 4}", "L3: {sigma_px: 5}"))
    current = specs.canonical_hash(yaml.safe_load(path.read_text()))
    with pytest.raises(errors.FrozenSpecError) as info:
        specs.load_protocol(spec_copy)
    message = str(info.value)
    assert frozen in message and current in message and "blur.yaml" in message
    # a comment-only edit is not a change
    path.write_text(path.read_text().replace("L3: {sigma_px: 5}", "L3: {sigma_px: 4}") + "# reviewed\n")
    specs.load_protocol(spec_copy)


def test_bumped_version_must_be_frozen_and_old_versions_stay(spec_copy):
    path = spec_copy / "blur.yaml"
    old = yaml.safe_load(path.read_text())["version"]
    new = old + 1
    path.write_text(path.read_text().replace(f"version: {old}", f"version: {new}").replace("L3: {sigma_px: 4}", "L3: {sigma_px: 5}"))
    with pytest.raises(errors.FrozenSpecError, match=f"version {new} is not frozen"):
        specs.load_protocol(spec_copy)
    frozen = specs.freeze(spec_copy)
    assert len(frozen) == 1 and frozen[0].startswith(f"blur.yaml version {new}")
    protocol = specs.load_protocol(spec_copy)
    assert protocol.factor("blur").level("L3") == {"sigma_px": 5.0}
    lock = json.loads((spec_copy / "spec.lock").read_text())
    assert set(lock["blur.yaml"]) == {str(v) for v in range(1, new + 1)}


def test_freeze_never_rewrites_a_frozen_version(spec_copy):
    path = spec_copy / "camera.yaml"
    path.write_text(path.read_text().replace("theta_max_deg: 10", "theta_max_deg: 12"))
    with pytest.raises(errors.FrozenSpecError):
        specs.freeze(spec_copy)


@pytest.mark.parametrize(
    "old, new, field",
    [
        ("L2: {alpha: 0.6}", "L2: {alpha: bright}", "levels.L2.alpha"),
        ("L2: {alpha: 0.6}", "L2: {gamma: 0.6}", "levels.L2.alpha"),
        ("L2: {alpha: 0.6}", "L2: {alpha: 0.6, beta: 1}", "levels.L2.beta"),
        ("kind: light_scale", "kind: light_scael", "kind"),
        ("version: 1", "version: one", "version"),
        ("draw: none", "draw: unit_disk", "draw"),
    ],
)
def test_malformed_spec_names_file_and_field(spec_copy, old, new, field):
    path = spec_copy / "illumination.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    with pytest.raises(errors.SpecError) as info:
        specs.load_protocol(spec_copy)
    assert info.value.path.endswith("illumination.yaml")
    assert info.value.field == field
    assert f"field '{field}'" in str(info.value)


def test_missing_level_and_bad_yaml(spec_copy):
    path = spec_copy / "camera.yaml"
    path.write_text(path.read_text().replace("  L3: {theta_max_deg: 10}\n", ""))
    with pytest.raises(errors.SpecError, match="camera.yaml: field 'levels'"):
        specs.load_protocol(spec_copy)
    path.write_text("levels: [unclosed\n")
    with pytest.raises(errors.SpecError, match="not valid YAML"):
        specs.load_protocol(spec_copy)


def test_stage_specs_of_the_embedded_tasks():
    for task in ("Lift", "Stack", "PickPlaceCan", "NutAssemblySquare"):
        spec = specs.load_stage_spec("robosuite", task)
        assert 3 <= len(spec.subgoals) <= 5
        assert spec.task == task and len(spec.content_hash) == 64


def test_malformed_stage_spec_names_field(tmp_path):
    d = tmp_path / "robosuite"
    d.mkdir()
    (d / "Lift.yaml").write_text(
        "task: Lift\nbackend: robosuite\nversion: 1\ndescription: x\nsubgoals:\n  - id: a\n    description: y\n"
    )
    with pytest.raises(errors.SpecError) as info:
        specs.load_stage_spec("robosuite", "Lift", tmp_path)
    assert info.value.field == "subgoals[0].predicate"
    with pytest.raises(errors.SpecError, match="no stage spec for task 'Lfit'"):
        specs.load_stage_spec("robosuite", "Lfit", tmp_path)


def test_unknown_condition_lists_valid_ones(protocol):
    from robocasa_shift.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match="known: clean, illumination:L1"):
        protocol.condition("camera:L4")
    assert (protocol.condition("camera:L2").factor, protocol.condition("camera:L2").level) == ("camera", "L2")
    assert protocol.condition("clean").is_clean and protocol.condition("clean").factor is None
