"""Branching on the real simulator: a checkpoint restored in a fresh process continues bit for bit.

robosuite + MuJoCo + the reference policy (issue 14's replay-fidelity requirement): the trunk is
recorded here, its snapshot file is read in another process, and continuing from checkpoints early,
mid-way and late, with no intervention and no noise, reproduces every joint position and physics
state of the trunk, its latched subgoals and its outcome. Conditions cover a clean rollout that
succeeds, a moved base (a perturbation of the initial state) and blur (an observation-side factor).
"""

import json
import subprocess
import sys

import pytest
from helpers import ROOT

pytestmark = pytest.mark.sim

CHILD = r"""
import json, sys
from robocasa_shift.core import specs
from robocasa_shift.backends import get_backend
from robocasa_shift.branching.checkpoints import BranchSettings, replay_fidelity, run_branch
from robocasa_shift.branching.interventions import make_intervention
from robocasa_shift.branching.snapshot import TrunkTape
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.policies import make_policy

path, key_id, steps = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split(",")]
key = RolloutKey.from_id(key_id)
protocol, tape = specs.load_protocol(), TrunkTape.read(path)
env, policy = get_backend("robosuite").make(key.task), make_policy("reference")
stage_spec = specs.load_stage_spec("robosuite", key.task)
out = []
for step in steps:
    fidelity = replay_fidelity(env, policy, key, protocol, stage_spec, "robosuite", tape, step)
    branch = run_branch(env, policy, key, protocol, stage_spec, "robosuite", tape, step, make_intervention("continue"), 0,
                        BranchSettings(sigma=0.0))
    out.append({"step": step, "fidelity": fidelity, "branch": branch})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def lift():
    from robocasa_shift.backends import get_backend
    from robocasa_shift.core import specs
    from robocasa_shift.policies import make_policy

    return specs.load_protocol(), get_backend("robosuite").make("Lift"), make_policy("reference")


# a perturbed trunk at spread checkpoints (the restore re-applies a state-side perturbation) and one late in a
# failing trunk under an observation-side one; a clean trunk is the same path without the perturbation
@pytest.mark.slow
@pytest.mark.parametrize("key_id,pick", [("formal/Lift/0000/base:L2/r0", "spread"), ("formal/Lift/0000/blur:L3/r0", "late")])
def test_a_checkpoint_restored_in_a_fresh_process_continues_the_trunk_bit_for_bit(lift, tmp_path, key_id, pick):
    from robocasa_shift.branching.checkpoints import record_trunk
    from robocasa_shift.core import specs
    from robocasa_shift.core.records import RolloutKey

    protocol, env, policy = lift
    key = RolloutKey.from_id(key_id)
    record, tape = record_trunk(env, policy, key, protocol, specs.load_stage_spec("robosuite", "Lift"), "robosuite")
    assert record.valid and len(tape.chunk_steps) == record.policy_calls
    path = tmp_path / "trunk.npz"
    path.write_bytes(tape.to_bytes())
    chunks = tape.chunk_steps
    # late checkpoints keep the failing (400-step) trunk's continuations short; the first restore in the
    # fresh process is mid-trajectory, where the arm moves (a process's first restore once differed)
    steps = [chunks[len(chunks) // 2], chunks[0], chunks[-1]] if pick == "spread" else chunks[-3:]
    child = subprocess.run([sys.executable, "-c", CHILD, str(path), key.id, ",".join(map(str, steps))], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    for result in json.loads(child.stdout.splitlines()[-1]):
        fidelity, branch = result["fidelity"], result["branch"]
        assert fidelity["ok"], result
        assert fidelity["max_qpos_dev"] == 0.0 and fidelity["max_state_dev"] == 0.0
        assert (branch["success"], branch["steps"], branch["stage_steps"]) == (record.success, record.steps,
                                                                                 record.stage_steps)
    assert record.success is (key.condition != "blur:L3")
