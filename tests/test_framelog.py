"""Frame logs (--log-frames): kept beside their records, audited, never changing a rollout, and filmed by the report
without a simulator.

Bookkeeping runs on the fake backend; the frames logged are checked against what a pair video's re-run films.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, cli

from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.core import specs
from robocasa_shift.core.framelog import FrameLog, FrameLogError, frame_log_path, max_frame_bytes
from robocasa_shift.core.records import RolloutKey, comparable
from robocasa_shift.engine.frame_logger import FrameLogger
from robocasa_shift.engine.replay import Replayer
from robocasa_shift.report.page import build_report
from robocasa_shift.rundir.store import RunStore
from robocasa_shift.study.runner import run

TASKS, CONDITIONS = ["Reach", "PickPlace"], ["clean", "base:L3", "blur:L3", "camera:L3"]


def _run(run_dir, log_frames, batch=1, episodes=range(4)):
    study = StudyConfig(backend="fake", policy="fake", log_frames=log_frames)
    return run(run_dir, TASKS, CONDITIONS, episodes, study, ExecutionConfig(workers=1, batch=batch, progress=False))


def _by_key(run_dir):
    return {RolloutKey.from_record(r).id: r for r in RunStore(run_dir).records()}


@pytest.fixture(scope="module")
def filmed(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("filmed") / "run"
    _run(run_dir, log_frames=True, batch=2)
    cli("audit", str(run_dir))
    return run_dir


def test_logging_frames_changes_no_record_and_each_log_holds_what_a_rerun_films(filmed, tmp_path):
    _run(tmp_path / "plain", log_frames=False)
    plain, logged = _by_key(tmp_path / "plain"), _by_key(filmed)
    assert plain.keys() == logged.keys() and len(plain) == len(TASKS) * len(CONDITIONS) * 4
    assert {k: comparable(r) for k, r in plain.items()} == \
        {k: comparable({n: v for n, v in r.items() if n != "frame_log"}) for k, r in logged.items()}
    assert not any("frame_log" in r for r in plain.values()) and not list((tmp_path / "plain").rglob("*.frames.npz"))
    store, manifest = RunStore(filmed), RunStore(filmed).manifest()
    with Replayer(manifest) as replayer:
        for key_id in ("formal/PickPlace/0001/blur:L3/r0", "formal/Reach/0002/camera:L3/r0"):
            record = logged[key_id]
            log = store.frame_log(record)
            assert log.steps == record["steps"] == record["frame_log"]["steps"] and log.meta["key"] == \
                RolloutKey.from_record(record).to_json()
            replay = replayer.replay(RolloutKey.from_id(key_id), record)
            third = [replay.capture.cameras.index(c) for c in log.meta["cameras"]]
            filmed_again = np.stack([np.stack([frames[i] for i in third]) for frames in replay.capture.frames])
            # the logged frames (batched in lockstep here) are exactly what the re-run films, blur included
            assert replay.reproduced and np.array_equal(log.frames, filmed_again)
    # the differences from frame to frame deflate to a fraction of the frames
    sizes = [(r["frame_log"]["bytes"], (r["steps"] + 1) * r["frame_log"]["size"] ** 2 * 3) for r in logged.values()]
    assert sum(b for b, _ in sizes) < 0.5 * sum(raw for _, raw in sizes)


_NO_SIMULATOR = """
import importlib.abc, sys
BLOCKED = ("robocasa_shift.backends.fake", "robocasa_shift.backends.robosuite_backend", "mujoco", "robosuite")

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith(BLOCKED):
            raise ImportError(f"{name} may not be imported in this process")

sys.meta_path.insert(0, Blocker())
from robocasa_shift.cli import main
try:
    main(sys.argv[1:], prog_name="robocasa-shift")
except SystemExit as exc:
    code = exc.code
try:
    import robocasa_shift.backends.fake
    print("BACKEND IMPORTABLE")
except ImportError as exc:
    print("blocked:", exc)
assert not any(name.startswith(BLOCKED) for name in sys.modules)
sys.exit(code)
"""


def _report_without_simulator(run_dir):
    return subprocess.run([sys.executable, "-c", _NO_SIMULATOR, "report", str(run_dir)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_a_run_with_logged_frames_gets_its_pair_videos_without_the_simulator(filmed, tmp_path):
    copy = Path(shutil.copytree(filmed, tmp_path / "run"))
    proc = _report_without_simulator(copy)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "blocked: robocasa_shift.backends.fake may not be imported" in proc.stdout
    videos = json.loads((copy / "report" / "videos.json").read_text())
    assert len(videos) >= 2
    for v in videos:
        assert v["source"] == "logged" and not v["kept"] and (copy / "report" / v["file"]).stat().st_size > 1000
    page = (copy / "report" / "index.html").read_text()
    assert page.count("filmed from the third-person frames the run logged") == len(videos)


def _pair_keys(video):
    return [f"formal/{video['task']}/{video['episode']:04d}/{c}/r0" for c in ("clean", video["condition"])]


def test_a_tampered_or_missing_frame_log_fails_the_audit_and_its_pair_is_rerun(filmed, tmp_path):
    copy = Path(shutil.copytree(filmed, tmp_path / "run"))
    build_report(copy, n_boot=200)
    first, second = json.loads((copy / "report" / "videos.json").read_text())[:2]
    shutil.rmtree(copy / "report")  # else its videos are kept: they were filmed from these same records
    store, records = RunStore(copy), _by_key(copy)
    tampered, missing = _pair_keys(first)[1], _pair_keys(second)[0]
    path = frame_log_path(store.record_path(RolloutKey.from_id(tampered)))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    frame_log_path(store.record_path(RolloutKey.from_id(missing))).unlink()
    with pytest.raises(FrameLogError, match="changed since it was written"):
        store.frame_log(records[tampered])
    proc = cli("audit", str(copy), check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    audit = json.loads((copy / "audit.json").read_text())
    problems = [p for t in audit["tasks"].values() for p in t["checks"]["frame_log_problems"]["rollouts"]]
    assert len(problems) == 2 and any(p.startswith(tampered) and "changed since it was written" in p
                                      for p in problems) and any(p.startswith(missing) for p in problems)
    assert "frame-log problems" in (copy / "audit.md").read_text()
    # the report films the pairs of broken logs by re-running them, never from the broken files
    build_report(copy, n_boot=200)
    for v in json.loads((copy / "report" / "videos.json").read_text()):
        broken = {tampered, missing} & set(_pair_keys(v))
        assert v["source"] == ("re-run" if broken else "logged") and v["reproduced"], v
        assert not broken or v["file"] in (first["file"], second["file"])


def test_a_log_over_its_cap_is_not_kept(tmp_path):
    from robocasa_shift.backends import get_backend
    from robocasa_shift.engine.rollout import run_rollout
    from robocasa_shift.policies import make_policy

    protocol, env = specs.load_protocol(), get_backend("fake").make("Reach")
    policy = make_policy("fake")
    key = RolloutKey("formal", "Reach", 0, "clean")
    spec = specs.load_stage_spec("fake", "Reach")
    kept, small = FrameLogger(key, protocol, policy.image_size, 2**24), FrameLogger(key, protocol, policy.image_size, 200)
    first = run_rollout(env, policy, key, protocol, spec, "fake", kept)
    second = run_rollout(env, policy, key, protocol, spec, "fake", small)
    data, summary = kept.encoded()
    assert summary["bytes"] == len(data) > 200 and summary["steps"] == first.steps == second.steps
    assert small.encoded() == (None, None)
    # what the reader allows a file to declare: exactly its frames (and the metadata's room)
    assert max_frame_bytes(summary) - 2**16 == (first.steps + 1) * summary["cameras"] * summary["size"] ** 2 * 3
    assert FrameLog.read(data, max_bytes=max_frame_bytes(summary)).steps == first.steps
    with pytest.raises(FrameLogError, match="declare more than"):
        FrameLog.read(data, max_bytes=max_frame_bytes({**summary, "steps": first.steps - 1}) - 2**16)


def test_merge_and_retry_carry_frame_logs_with_their_records(filmed, tmp_path):
    merged = tmp_path / "merged"
    cli("merge", str(merged), str(filmed))
    assert cli("audit", str(merged), check=False).returncode == 0
    assert len(list(merged.rglob("*.frames.npz"))) == len(list(filmed.rglob("*.frames.npz"))) > 0
    store = RunStore(merged)
    key = RolloutKey.from_id("formal/Reach/0000/clean/r0")
    store.supersede(key)
    assert not frame_log_path(store.record_path(key)).exists()
    assert len(list((merged / "history").rglob("*.frames.npz"))) == 1
