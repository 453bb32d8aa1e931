"""Generated asset kits in run directories: which kit a run was made on, and the label its outputs carry.

A backend may run on a generated *asset kit* instead of its simulator's real assets (the robocasa
backend's stand-in kitchens: primitive geometry under RoboCasa's names). Its results are not the
simulator's results. The kit - ``{"kind", "version", "sha256", ...}`` - is in the environment
configuration and at the top of the run's manifest; every record carries ``asset_kit`` (the kind)
and ``asset_kit_sha256``. The audit fails a run whose records name another kit than its manifest,
``compare`` refuses two runs made on different kits, and the audit, the report and the comparison
put :data:`STANDIN_BANNER` on every page of a stand-in run. Pure functions: no simulator needed.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

STANDIN = "standin"
STANDIN_BANNER = "STAND-IN KIT - not RoboCasa results"
# The fake backend (a point gripper in a plane) exists to test the harness: its verdicts describe that toy.
TESTING_BACKEND = "fake"
TESTING_BANNER = "FAKE TESTING BACKEND - not robot results"


def run_asset_kit(manifest: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """The asset kit a run's manifest names (top level, else its environment configuration), None for real assets."""
    manifest = manifest or {}
    kit = manifest.get("asset_kit") or (manifest.get("env_config") or {}).get("asset_kit")
    return dict(kit) if isinstance(kit, Mapping) else None


def kit_key(kit: Optional[Mapping[str, Any]]) -> Tuple[Optional[str], Optional[str]]:
    """(kind, sha256) of a kit; (None, None) for a backend's own assets."""
    return (kit.get("kind"), kit.get("sha256")) if kit else (None, None)


def record_kit_key(record: Mapping[str, Any]) -> Tuple[Optional[str], Optional[str]]:
    """(kind, sha256) of the kit a record says it ran on."""
    return record.get("asset_kit"), record.get("asset_kit_sha256")


def kit_problems(manifest: Optional[Mapping[str, Any]], records: Iterable[Mapping[str, Any]]) -> List[str]:
    """Records that ran on another asset kit than the run's manifest names (one line per kit, with a count)."""
    want = kit_key(run_asset_kit(manifest))
    other: Dict[Tuple[Optional[str], Optional[str]], int] = {}
    for rec in records:
        got = record_kit_key(rec)
        if got != want:
            other[got] = other.get(got, 0) + 1
    return [f"{n} record(s) ran on {describe_key(key)}, the manifest names {describe_key(want)}: a run mixes asset "
            f"kits" for key, n in sorted(other.items(), key=lambda item: str(item[0]))]


def describe_key(key: Tuple[Optional[str], Optional[str]]) -> str:
    kind, sha = key
    return "the backend's own assets" if kind is None else f"asset kit {kind} (sha256 {str(sha)[:12]})"


def is_standin(kit: Optional[Mapping[str, Any]]) -> bool:
    """Whether a kit is the robocasa backend's stand-in kit."""
    return bool(kit) and kit.get("kind") == STANDIN


def banner(kit: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The line every page of a stand-in run starts with (None for real assets)."""
    if not is_standin(kit):
        return None
    return (f"{STANDIN_BANNER} (generated stand-in kit v{kit.get('version')}, sha256 {str(kit.get('sha256'))[:12]}: "
            f"primitive geometry under RoboCasa's names; it tests the harness, not RoboCasa's numbers)")


def run_banner(manifest: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The line every page of a run starts with: the stand-in kit's, or the fake backend's (None otherwise)."""
    kit_line = banner(run_asset_kit(manifest))
    if kit_line or (manifest or {}).get("backend") != TESTING_BACKEND:
        return kit_line
    return (f"{TESTING_BANNER} (the fake backend: a point gripper in a plane; its numbers test the harness and say "
            f"nothing about robots)")


def same_kit_or_raise(kit_a: Optional[Mapping[str, Any]], kit_b: Optional[Mapping[str, Any]], what_a: str,
                      what_b: str) -> None:
    """Refuse to put two runs side by side when they were made on different asset kits.

    Raises:
        BadInput: the kits (kind or content hash) differ.
    """
    from robocasa_shift.errors import BadInput

    if kit_key(kit_a) != kit_key(kit_b):
        raise BadInput(f"{what_a} was made on {describe_key(kit_key(kit_a))} and {what_b} on "
                       f"{describe_key(kit_key(kit_b))}: results on different asset kits are not comparable")


__all__ = ["STANDIN", "STANDIN_BANNER", "banner", "describe_key", "is_standin", "kit_key", "kit_problems",
           "record_kit_key", "run_asset_kit", "same_kit_or_raise"]
