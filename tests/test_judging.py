"""Success judges (judging/): the export, the judge set's checks, judges and their resumable runs, scoring.

Bookkeeping runs on the fake backend; the OpenAI-compatible adapter talks to a stand-in server on
loopback; one simulator test exports a real logged rollout.
"""

import hashlib
import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pandas as pd
import pytest
from helpers import cli

from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.errors import (
    BadInput,
    PolicyServerError,
    RunDirError,
    StateUnsupported,
)
from robocasa_shift.judging import export as jexport
from robocasa_shift.judging.export import (
    ExportSettings,
    export_judge,
    frame_steps,
    sample_id,
    select,
)
from robocasa_shift.judging.judges import (
    JUDGES,
    Judge,
    PredictionsError,
    Verdict,
    read_predictions,
    run_judge,
)
from robocasa_shift.judging.judgeset import JudgeSet, JudgeSetError
from robocasa_shift.judging.scoring import length_only, score
from robocasa_shift.rundir.store import RunStore
from robocasa_shift.study.runner import run

TASKS, CONDITIONS, EPISODES = ["Reach", "PickPlace"], ["clean", "blur:L3", "base:L3"], range(4)
SETTINGS = ExportSettings(size=32, frames=4)
QUIET = ExecutionConfig(workers=1, progress=False)


def _run(run_dir, log_steps=True, policy="fake"):
    run(run_dir, TASKS, CONDITIONS, EPISODES, StudyConfig(backend="fake", policy=policy, log_steps=log_steps), QUIET)
    return run_dir


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("judging") / "run")


@pytest.fixture(scope="module")
def exported(logged, tmp_path_factory):
    out = tmp_path_factory.mktemp("judging") / "set"
    export_judge(logged, out, SETTINGS, QUIET)
    return out


def test_an_export_holds_one_labelled_sample_per_rollout_with_clips_of_fixed_length(logged, exported):
    records = {sample_id(RolloutKey.from_record(r)): r for r in RunStore(logged).records()}
    js = JudgeSet(exported)
    assert sorted(js.by_id) == sorted(records) and js.info["excluded"] == []
    for sid, row in js.by_id.items():
        record = records[sid]
        assert row["success"] == record["success"] and row["steps"] == record["steps"]
        assert row["stages_completed"] == record["stages_completed"]
        assert row["first_incomplete"] == record["first_incomplete"]
        assert row["stratum"] == jexport.stratum(record["success"], record["stages_completed"], record["n_stages"])
        assert row["replayed_from"] == "step_log"
        # the same number of frames whatever the outcome: a clip's length gives nothing away
        assert row["frame_steps"] == frame_steps(record["steps"], 4) and len(row["frame_steps"]) == 5
        assert set(row["cameras"].values()) == {"third_person", "wrist"}
        for camera, paths in row["clip"].items():
            assert len(paths) == 5 and row["start"][camera] == paths[0] and row["end"][camera] == paths[-1]
        assert row["pair_id"] == records[sid]["task"] + "." + sid.split(".", 1)[1].rsplit(".", 1)[0]
    assert {row["success"] for row in js.rows} == {True, False}
    # the perturbed twin shares the clean sample's pair id
    clean = {r["pair_id"] for r in js.rows if r["condition"] == "clean"}
    assert all(r["pair_id"] in clean for r in js.rows)
    sample = js.sample(js.rows[0]["sample_id"], "clip")
    assert list(sample.cameras.values())[0] == "third_person"  # third-person first
    frames = sample.clip(list(sample.cameras)[0])
    assert len(frames) == 5 and frames[0].shape == (32, 32, 3) and frames[0].dtype == np.uint8


def test_frame_steps_spread_a_fixed_count_over_any_attempt():
    assert frame_steps(100, 4) == [0, 25, 50, 75, 100]
    assert frame_steps(3, 4) == [0, 0, 1, 2, 3]
    assert len(frame_steps(7, 8)) == len(frame_steps(400, 8)) == 9


def test_replaying_logs_and_re_running_the_policy_give_the_same_frames(exported, tmp_path):
    plain = _run(tmp_path / "plain", log_steps=False)
    out = tmp_path / "rerun"
    export_judge(plain, out, SETTINGS, QUIET)
    a, b = JudgeSet(exported), JudgeSet(out)
    assert sorted(a.by_id) == sorted(b.by_id)
    for sid, row in a.by_id.items():
        assert b.by_id[sid]["replayed_from"] == "policy_rerun"
        assert b.by_id[sid]["media_sha256"] == row["media_sha256"], sid


def test_rollouts_without_logs_of_a_policy_that_cannot_be_re_run_are_refused_with_the_reason(tmp_path):
    plain = _run(tmp_path / "plain", log_steps=False)
    manifest = json.loads((plain / "manifest.json").read_text())
    manifest["policy"]["name"] = "gr00t"  # its generators live on a policy server
    (plain / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StateUnsupported, match="no step log.*gr00t.*--log-steps"):
        export_judge(plain, tmp_path / "set", SETTINGS, QUIET)


def test_a_replay_that_does_not_reproduce_its_record_leaves_the_sample_out_with_the_reason(logged, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(logged, run_dir)
    store = RunStore(run_dir)
    record = next(r for r in store.records() if r["task"] == "PickPlace" and r["success"])
    log = store.step_log(record)
    log.action[:] = 0.0  # the arm never moves: the replay cannot succeed
    data = log.to_bytes()
    path = store.record_path(RolloutKey.from_record(record))
    path.with_name(path.stem + ".steps.npz").write_bytes(data)
    record["step_log"]["sha256"] = hashlib.sha256(data).hexdigest()  # hashes agree: only the replay can tell
    path.write_text(json.dumps(record))
    info = export_judge(run_dir, tmp_path / "set", SETTINGS, QUIET)
    sid = sample_id(RolloutKey.from_record(record))
    [left_out] = info["excluded"]
    assert left_out["sample_id"] == sid and "success recorded True, replayed False" in left_out["reason"]
    assert sid not in JudgeSet(tmp_path / "set").by_id


def test_a_killed_export_resumes_with_nothing_lost_or_made_twice(exported, logged, tmp_path):
    out = tmp_path / "set"
    shutil.copytree(exported, out)
    first = JudgeSet(out)
    lost = sorted(first.by_id)[:5]
    for sid in lost:  # as if the command died before these were written
        (out / "samples" / f"{sid}.json").unlink()
        shutil.rmtree(out / "media" / sid)
    (out / "manifest.jsonl").unlink()
    info = export_judge(logged, out, SETTINGS, QUIET)
    assert info["made"] == 5 and info["export_hash"] == first.export_hash
    again = export_judge(logged, out, SETTINGS, QUIET)
    assert again["made"] == 0 and again["export_hash"] == first.export_hash
    with pytest.raises(RunDirError, match="settings"):
        export_judge(logged, out, ExportSettings(size=48, frames=4), QUIET)


def test_max_per_cell_keeps_the_same_episodes_in_every_cell_of_a_task(logged):
    records = RunStore(logged).records()
    chosen = select(records, ExportSettings(max_per_cell=2, seed=3))
    for task in TASKS:
        cells = {}
        for r in chosen:
            if r["task"] == task:
                cells.setdefault(r["condition"], set()).add(r["episode"])
        assert set(cells) == set(CONDITIONS) and all(len(v) == 2 for v in cells.values())
        assert len({frozenset(v) for v in cells.values()}) == 1  # pairs stay whole
    assert select(records, ExportSettings(max_per_cell=2, seed=3)) == chosen
    with pytest.raises(BadInput):
        ExportSettings(max_per_cell=0)


def test_max_per_cell_keeps_formal_pairs_whole_beside_screening_records(tmp_path):
    """A run that also holds screening records (clean only, other base episodes), as make demo leaves one: the
    clean cell of the formal phase must take the formal episodes its perturbed cells take, not screening ones."""
    run_dir = tmp_path / "run"
    study, execution = StudyConfig(backend="fake", policy="fake"), ExecutionConfig(workers=1, progress=False)
    run(run_dir, ["Reach"], ["clean"], range(0, 12), study=study, execution=execution, phase="screening")
    run(run_dir, ["Reach"], ["clean", "blur:L2"], range(0, 6), study=study, execution=execution)
    chosen = select(RunStore(run_dir).records(), ExportSettings(max_per_cell=3, seed=0))
    formal = {}
    for r in chosen:
        if r["phase"] == "formal":
            formal.setdefault(r["condition"], set()).add(r["episode"])
    assert set(formal) == {"clean", "blur:L2"} and all(len(v) == 3 for v in formal.values())
    assert formal["clean"] == formal["blur:L2"]  # every formal pair whole
    assert len([r for r in chosen if r["phase"] == "screening"]) == 3


def test_a_changed_manifest_or_image_is_refused(exported, tmp_path):
    out = tmp_path / "set"
    shutil.copytree(exported, out)
    row = JudgeSet(out).rows[0]
    (out / row["end"][next(iter(row["end"]))]).write_bytes(b"\x89PNG not the exported image")
    with pytest.raises(JudgeSetError, match="image changed"):
        JudgeSet(out).sample(row["sample_id"])
    text = (out / "manifest.jsonl").read_text().replace('"success": true', '"success": false', 1)
    (out / "manifest.jsonl").write_text(text)
    with pytest.raises(JudgeSetError, match="changed since it was exported: sha256 [0-9a-f]{64}, export.json holds"):
        JudgeSet(out)


def test_a_forged_manifest_naming_a_file_outside_the_set_is_refused(exported, tmp_path):
    out = tmp_path / "set"
    shutil.copytree(exported, out)
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"not yours")
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    camera = next(iter(rows[0]["end"]))
    rows[0]["end"][camera] = "../secret.png"
    rows[0]["media_sha256"]["../secret.png"] = hashlib.sha256(b"not yours").hexdigest()
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    (out / "manifest.jsonl").write_text(text)
    info = json.loads((out / "export.json").read_text())
    info["export_hash"] = hashlib.sha256(text.encode()).hexdigest()  # a consistent forgery
    (out / "export.json").write_text(json.dumps(info))
    with pytest.raises(JudgeSetError, match="outside the set"):
        JudgeSet(out).sample(rows[0]["sample_id"])


# --------------------------------------------------------------------------- scoring, on a hand-made table


def _table(rows):
    columns = ["sample_id", "task", "condition", "episode", "pair_id", "success", "stratum", "steps", "horizon"]
    frame = pd.DataFrame(rows, columns=columns)
    for c in ("factor", "level", "replicate", "episode_key", "n_stages", "stages_completed", "first_incomplete"):
        frame[c] = None
    return frame


def _predictions(verdicts):
    return pd.DataFrame({"sample_id": list(verdicts), "predicted_success": [int(v) for v in verdicts.values()],
                         "confidence": np.nan})


def test_balanced_accuracy_macro_micro_and_one_class_subsets_on_a_hand_made_table():
    rows = []
    # Lift clean: 4 successes (all judged right), 4 failures (2 judged successes) -> BA 0.75
    for i in range(4):
        rows.append((f"L{i}s", "Lift", "clean", i, f"p{i}", True, "success", 50, 100))
        rows.append((f"L{i}f", "Lift", "clean", 10 + i, f"q{i}", False, "near_success" if i < 2 else "no_subgoal", 100, 100))
    # Stack clean: 2 successes, 2 failures, all right -> BA 1.0
    for i in range(2):
        rows.append((f"S{i}s", "Stack", "clean", i, f"r{i}", True, "success", 60, 100))
        rows.append((f"S{i}f", "Stack", "clean", 10 + i, f"t{i}", False, "mid_task", 100, 100))
    # Stack blur: failures only, 1 of 2 judged right -> failure recall 0.5; not in the macro
    rows += [("B0", "Stack", "blur:L3", 0, "r0", False, "mid_task", 100, 100),
             ("B1", "Stack", "blur:L3", 1, "r1", False, "mid_task", 100, 100)]
    table = _table(rows)
    verdicts = {r[0]: r[5] for r in rows}
    verdicts.update({"L0f": True, "L1f": True, "B0": True})
    result = score(table, {"j": _predictions(verdicts)}, n_boot=200)["judges"]["j"]
    subsets = {(s["task"], s["condition"]): s for s in result["accuracy"]["subsets"]}
    assert subsets[("Lift", "clean")]["ba"] == 0.75 and subsets[("Stack", "clean")]["ba"] == 1.0
    assert subsets[("Stack", "blur:L3")]["kind"] == "failure recall" and subsets[("Stack", "blur:L3")]["ba"] == 0.5
    assert result["accuracy"]["macro"]["ba"] == pytest.approx(0.875) and result["accuracy"]["macro"]["subsets"] == 2
    lo, hi = result["accuracy"]["macro"]["ci95"]
    assert lo <= 0.875 <= hi
    # micro: 6/6 successes right, 5/8 failures right
    assert result["accuracy"]["micro"]["ba"] == pytest.approx((1 + 5 / 8) / 2)
    bias = result["success_bias"]
    assert bias["false_success"]["k"] == 3 and bias["false_success"]["n"] == 8
    assert bias["strata"]["near_success"]["k"] == 2 and bias["strata"]["near_success"]["n"] == 2
    assert bias["strata"]["no_subgoal"]["k"] == 0 and bias["strata"]["mid_task"]["n"] == 4


def test_verdict_flips_sf_catches_and_mcnemar_on_hand_made_pairs():
    rows, verdicts = [], {}
    for i in range(10):  # ten base episodes, clean success; perturbed: 6 held (S->S), 4 lost (S->F)
        rows.append((f"c{i}", "Lift", "clean", i, f"p{i}", True, "success", 50, 100))
        held = i < 6
        rows.append((f"x{i}", "Lift", "illumination:L3", i, f"p{i}", held, "success" if held else "mid_task", 80, 100))
        verdicts[f"c{i}"] = True
        # the judge flips on 3 of the 6 held pairs and catches 1 of the 4 S->F pairs
        verdicts[f"x{i}"] = (i >= 3) if held else (i != 6)
    result = score(_table(rows), {"j": _predictions(verdicts)}, n_boot=200)["judges"]["j"]
    pair = result["paired"]["illumination:L3"]
    assert pair["pairs"] == 10 and pair["outcome_held"] == 6
    assert (pair["verdict_flip"]["k"], pair["verdict_flip"]["n"]) == (3, 6)
    assert (pair["verdict_flip_SS"]["k"], pair["verdict_flip_FF"]["n"]) == (3, 0)
    assert (pair["sf_caught"]["k"], pair["sf_caught"]["n"]) == (1, 4)
    # clean always right; perturbed wrong on 3 flips + 3 missed S->F: b = 6, c = 0
    assert pair["mcnemar"]["clean_right_perturbed_wrong"] == 6 and pair["mcnemar"]["clean_wrong_perturbed_right"] == 0
    assert pair["mcnemar"]["p_exact"] == pytest.approx(2 / 64)


def test_error_overlap_and_the_length_only_baseline():
    rows = [(f"s{i}", "Lift", "clean", i, f"p{i}", i < 4, "success" if i < 4 else "mid_task", 40 if i < 4 else 100, 100)
            for i in range(8)]
    table = _table(rows)
    a = {r[0]: r[5] for r in rows}
    b = dict(a)
    a.update({"s0": False, "s1": False})
    b.update({"s1": False, "s5": True})
    result = score(table, {"a": _predictions(a), "b": _predictions(b)}, n_boot=200)
    pairs = {(o["judge_a"], o["judge_b"]): o for o in result["overlap"]}
    assert pairs[("a", "b")]["both_wrong"] == 1 and pairs[("a", "b")]["iou"] == pytest.approx(1 / 3)
    base = length_only(table)
    assert base["predicted_success"].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert result["judges"]["length-only"]["baseline"] and result["judges"]["length-only"]["accuracy"]["micro"]["ba"] == 1.0


def test_a_malformed_predictions_file_names_the_file_row_and_field(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("sample_id,predicted_success\na,1\nb,2\n")
    with pytest.raises(PredictionsError, match=r"p.csv, row 3: field 'predicted_success' must be 0 or 1"):
        read_predictions(path)
    path.write_text("sample_id,predicted_success,confidence\na,1,1.5\n")
    with pytest.raises(PredictionsError, match=r"row 2: field 'confidence'"):
        read_predictions(path)
    path.write_text("sample_id,verdict\na,1\n")
    with pytest.raises(PredictionsError, match="no column 'predicted_success'"):
        read_predictions(path)
    path.write_text("sample_id,predicted_success\na,1\na,0\n")
    with pytest.raises(PredictionsError, match="judged more than once"):
        read_predictions(path)
    path.write_text("sample_id,predicted_success\nz,1\n")
    with pytest.raises(PredictionsError, match="not in the judge set"):
        read_predictions(path, known_ids=["a"])


# --------------------------------------------------------------------------- judges


class BrightEnd(Judge):
    """A test judge: success when the third-person end frame is brighter than ``level``."""

    name = "bright-end"
    inputs = "end"
    calls = 0

    def __init__(self, level: float = 100.0):
        self.level = level

    def judge(self, samples):
        BrightEnd.calls += len(samples)
        out = []
        for s in samples:
            mean = float(s.frame("end", next(iter(s.cameras))).mean())
            out.append(Verdict(mean > self.level, min(1.0, mean / 255)))
        return out


@pytest.fixture()
def bright_judge():
    if "bright-end" not in JUDGES:
        JUDGES.register("bright-end", BrightEnd)
    yield "bright-end"


def test_a_killed_judge_run_resumes_with_nothing_judged_twice(exported, bright_judge, tmp_path):
    full = tmp_path / "full.csv"
    run_judge(exported, bright_judge, full, {"level": 90.0}, QUIET, chunk=4)
    n = len(JudgeSet(exported).rows)
    assert len(read_predictions(full)) == n
    part = tmp_path / "part.csv"
    shutil.copy(full.with_name("full.csv.json"), part.with_name("part.csv.json"))
    lines = full.read_text().splitlines(keepends=True)
    part.write_text("".join(lines[:4]) + lines[4][:7])  # three rows, then a torn line
    BrightEnd.calls = 0
    result = run_judge(exported, bright_judge, part, {"level": 90.0}, QUIET, chunk=4)
    assert BrightEnd.calls == n - 3 and result["judged"] == n
    pd.testing.assert_frame_equal(read_predictions(part).sort_values("sample_id").reset_index(drop=True),
                                  read_predictions(full).sort_values("sample_id").reset_index(drop=True))
    with pytest.raises(RunDirError, match="another judge"):
        run_judge(exported, bright_judge, part, {"level": 10.0}, QUIET)


def test_unknown_judges_and_options_are_refused_with_the_valid_ones(exported, tmp_path):
    with pytest.raises(Exception, match="end-state"):
        run_judge(exported, "no-such-judge", tmp_path / "p.csv")
    with pytest.raises(BadInput, match="takes no option 'colour'.*weights_dir"):
        run_judge(exported, "end-state", tmp_path / "p.csv", {"colour": 1})


def test_the_end_state_judge_trains_on_judge_sets_and_judges_every_sample(exported, tmp_path):
    from robocasa_shift.judging.endstate import EndStateJudge, TrainConfig, train

    manifest = train([exported], tmp_path / "weights", TrainConfig(epochs=3))
    assert set(manifest["tasks"]) == set(TASKS)
    for entry in manifest["tasks"].values():
        assert entry["examples"] > entry["positives"] > 0 and entry["channels"] == 6
        assert (tmp_path / "weights" / entry["file"]).exists()
    again = train([exported], tmp_path / "again", TrainConfig(epochs=3))
    assert again["weights_sha256"] == manifest["weights_sha256"]  # fixed seeds: the same weights
    out = tmp_path / "p.csv"
    run_judge(exported, "end-state", out, {"weights_dir": str(tmp_path / "weights")}, QUIET)
    predictions = read_predictions(out, known_ids=list(JudgeSet(exported).by_id))
    assert len(predictions) == len(JudgeSet(exported).rows) and predictions["confidence"].between(0, 1).all()
    sidecar = json.loads(out.with_name("p.csv.json").read_text())
    assert sidecar["judge"]["weights_sha256"] == manifest["weights_sha256"]
    assert sidecar["export_hash"] == JudgeSet(exported).export_hash
    judge = EndStateJudge(weights_dir=str(tmp_path / "weights"))
    with pytest.raises(Exception, match="no classifier for task 'Lift'"):
        judge._net("Lift")


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "ray"])
def test_export_and_judging_on_worker_processes_equal_the_in_process_results(exported, logged, tmp_path, executor):
    from robocasa_shift.judging.endstate import TrainConfig, train

    if executor == "ray":
        pytest.importorskip("ray")
    parallel = ExecutionConfig(executor=executor, workers=2, progress=False)
    out = tmp_path / "set"
    info = export_judge(logged, out, SETTINGS, parallel)
    assert info["export_hash"] == JudgeSet(exported).export_hash  # the same bytes, wherever they were made
    train([exported], tmp_path / "weights", TrainConfig(epochs=2))
    options = {"weights_dir": str(tmp_path / "weights")}
    run_judge(exported, "end-state", tmp_path / "inline.csv", options, QUIET)
    run_judge(out, "end-state", tmp_path / "workers.csv", options, parallel, chunk=5)
    inline, workers = (read_predictions(tmp_path / f"{n}.csv").sort_values("sample_id").reset_index(drop=True)
                       for n in ("inline", "workers"))
    assert inline["sample_id"].tolist() == workers["sample_id"].tolist()
    assert inline["predicted_success"].tolist() == workers["predicted_success"].tolist()
    assert np.allclose(inline["confidence"], workers["confidence"], atol=1e-5)  # thread counts may differ


def test_the_committed_end_state_weights_match_their_manifest():
    from robocasa_shift.judging.endstate import MANIFEST, WEIGHTS_DIR

    manifest = json.loads((WEIGHTS_DIR / MANIFEST).read_text())
    assert set(manifest["tasks"]) == {"Lift", "Stack", "PickPlaceCan"}
    for entry in manifest["tasks"].values():
        assert hashlib.sha256((WEIGHTS_DIR / entry["file"]).read_bytes()).hexdigest() == entry["sha256"]


# --------------------------------------------------------------------------- the OpenAI-compatible adapter


class StandIn(BaseHTTPRequestHandler):
    """A loopback stand-in for an OpenAI-compatible server: checks the key before reading the body."""

    key, requests, answer = "sk-test-123", [], None

    def do_POST(self):  # noqa: N802
        if self.headers.get("Authorization") != f"Bearer {self.key}":
            self.send_response(401)
            self.end_headers()
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StandIn.requests.append(body)
        images = [p for p in body["messages"][1]["content"] if p["type"] == "image_url"]
        text = StandIn.answer or json.dumps({"success": len(images) == 4, "confidence": 0.75})
        reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": f"Answer: {text}"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@pytest.fixture()
def stand_in():
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    StandIn.requests, StandIn.answer = [], None
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_the_openai_adapter_sends_the_images_with_the_key_from_the_environment(exported, stand_in, tmp_path,
                                                                              monkeypatch):
    import base64

    monkeypatch.setenv("JUDGE_TEST_KEY", StandIn.key)
    out = tmp_path / "vlm.csv"
    options = {"base_url": stand_in, "model": "tiny-vlm", "api_key": "env:JUDGE_TEST_KEY", "inputs": "start_end"}
    run_judge(exported, "openai", out, options, QUIET, chunk=8)
    js = JudgeSet(exported)
    predictions = read_predictions(out)
    assert len(predictions) == len(js.rows) and predictions["predicted_success"].eq(1).all()  # 2 cameras x 2 images
    assert predictions["confidence"].eq(0.75).all()
    first = StandIn.requests[0]
    assert first["model"] == "tiny-vlm" and first["temperature"] == 0
    urls = [p["image_url"]["url"] for p in first["messages"][1]["content"] if p["type"] == "image_url"]
    row = js.rows[0]
    sent = [base64.b64decode(u.split(",", 1)[1]) for u in urls]
    expected = [js.image_bytes(row, row[w][c]) for c in ("robot0_robotview", "eye_in_hand", "agentview")
                if c in row["cameras"] for w in ("start", "end")]
    assert sorted(sent) == sorted(expected)
    assert row["instruction"] in first["messages"][1]["content"][0]["text"]
    for path in tmp_path.rglob("*"):  # the key is never written
        assert StandIn.key not in path.read_text()


def test_the_openai_adapter_reports_a_wrong_key_and_unreadable_answers(exported, stand_in, tmp_path, monkeypatch):
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-wrong")
    options = {"base_url": stand_in, "api_key": "env:JUDGE_TEST_KEY"}
    with pytest.raises(PolicyServerError, match="HTTP 401"):
        run_judge(exported, "openai", tmp_path / "a.csv", options, QUIET)
    monkeypatch.setenv("JUDGE_TEST_KEY", StandIn.key)
    StandIn.answer = "I cannot tell."
    result = run_judge(exported, "openai", tmp_path / "b.csv", options, QUIET)
    assert result["judged"] == 0 and len(result["errors"]) == len(JudgeSet(exported).rows)
    assert "unreadable answer" in result["errors"][0]
    monkeypatch.delenv("JUDGE_TEST_KEY")
    with pytest.raises(BadInput, match="JUDGE_TEST_KEY is not set"):
        run_judge(exported, "openai", tmp_path / "c.csv", options, QUIET)


# --------------------------------------------------------------------------- the command line


def test_export_judge_and_score_judge_from_the_command_line(logged, tmp_path):
    out = tmp_path / "set"
    cli("export-judge", str(logged), "--out", str(out), "--size", "32", "--frames", "2", "--max-per-cell", "2",
        "--workers", "1", "--no-progress")
    js = JudgeSet(out)
    assert len(js.rows) == len(TASKS) * len(CONDITIONS) * 2
    preds = tmp_path / "always.csv"
    pd.DataFrame({"sample_id": list(js.by_id), "predicted_success": 1}).to_csv(preds, index=False)
    proc = cli("score-judge", str(out), str(preds), "--n-boot", "200")
    assert "always" in proc.stdout and "length-only" in proc.stdout
    scores = json.loads((out / "scores" / "scores.json").read_text())
    assert scores["export_hash"] == js.export_hash
    assert scores["judges"]["always"]["success_bias"]["false_success"]["rate"] == 1.0
    for name in ("scores.md", "subsets.csv", "conditions.csv", "strata.csv", "flips.csv", "judges_by_condition.png"):
        assert (out / "scores" / name).exists(), name
    assert "export-judge" in cli("--help").stdout


# --------------------------------------------------------------------------- the simulator


@pytest.mark.sim
def test_a_real_logged_rollout_exports_from_its_replay(tmp_path):
    run_dir = tmp_path / "run"
    run(run_dir, ["Lift"], ["clean", "illumination:L3"], [0], StudyConfig(policy="expert", log_steps=True), QUIET)
    info = export_judge(run_dir, tmp_path / "set", ExportSettings(size=64, frames=3), QUIET)
    assert info["excluded"] == [] and info["samples"] == 2
    js = JudgeSet(tmp_path / "set")
    clean = next(r for r in js.rows if r["condition"] == "clean")
    dark = next(r for r in js.rows if r["condition"] != "clean")
    camera = "robot0_robotview"
    a = js.sample(clean["sample_id"]).frame("end", camera).astype(float)
    b = js.sample(dark["sample_id"]).frame("end", camera).astype(float)
    assert a.std() > 5 and abs(a.mean() - b.mean()) > 5  # a real image, and the illumination shift shows
