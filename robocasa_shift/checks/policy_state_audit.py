"""The branch audit's look at the policy part of every checkpoint of a trunk (served policies' session states).

A checkpoint's policy part is hashed with the rest of the checkpoint (``TrunkTape.checkpoint_hash``,
checked by the branch audit). For a policy served by this harness's GR00T launcher or openpi shim it
also holds a sealed session-state blob and the identity of the server it came from; the audit cannot
check the seal (only the server holds its key) but checks, without it, that:

- the blob is within the size cap and is a well-formed sealed blob of the known format, whose arrays
  are plain numeric arrays;
- its header names the server and model that the checkpoint's recorded identity names;
- every checkpoint of the trunk names one server and one model;
- that model is the one in the branch study's manifest (the policy's ``modality_config_sha256`` or
  ``server_metadata_sha256``): a trunk recorded against another model cannot hide in the study;
- the client-side chunk buffer's index lies within the buffer.
"""

from __future__ import annotations

import json
from typing import Any, List, Mapping, Optional

import numpy as np

from robocasa_shift.errors import StateRefused
from robocasa_shift.policies.served.state import describe_blob

# Where a served policy's identity records its server's model identity (GR00T, openpi).
MODEL_IDENTITY_FIELDS = ("modality_config_sha256", "server_metadata_sha256")


def manifest_model(policy_identity: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The model identity hash a branch manifest's policy identity records (None for a local policy)."""
    for field in MODEL_IDENTITY_FIELDS:
        value = (policy_identity or {}).get(field)
        if isinstance(value, str):
            return value
    return None


def policy_state_problems(tape: Any, policy_identity: Optional[Mapping[str, Any]]) -> List[str]:
    """Problems of the policy parts of a trunk's checkpoints (empty when none holds a served session state)."""
    problems: List[str] = []
    seen = set()
    expected_model = manifest_model(policy_identity)
    for step in tape.chunk_steps:
        part = tape.checkpoint(step)["policy"]
        if "remote.blob" not in part:
            continue
        where = f"checkpoint step {step}: policy state"
        try:
            recorded = json.loads(np.asarray(part["remote.server"], dtype=np.uint8).tobytes().decode("utf-8"))
            claims = describe_blob(np.asarray(part["remote.blob"], dtype=np.uint8).tobytes())
        except (KeyError, UnicodeDecodeError, ValueError, StateRefused) as exc:
            problems.append(f"{where}: {exc}")
            continue
        if not isinstance(recorded, dict):
            problems.append(f"{where}: its server identity is not a JSON object")
            continue
        if (claims["server"], claims["model"]) != (recorded.get("server_id"), recorded.get("model_sha256")):
            problems.append(f"{where}: the blob names server {claims['server']} and model {claims['model']}, the "
                            f"checkpoint records {recorded.get('server_id')} and {recorded.get('model_sha256')}")
        if expected_model is not None and claims["model"] != expected_model:
            problems.append(f"{where}: taken with model {claims['model']}, the branch study's policy is "
                            f"{expected_model}")
        seen.add((claims["server"], claims["model"]))
        actions, index = np.asarray(part.get("buffer.actions", np.zeros((0, 0)))), part.get("buffer.index")
        if index is None or not 0 <= int(np.asarray(index)) <= len(actions):
            problems.append(f"{where}: its chunk buffer index lies outside the buffer")
    if len(seen) > 1:
        problems.append(f"policy states of one trunk name {len(seen)} servers or models: {sorted(seen)}")
    return problems


__all__ = ["policy_state_problems"]
