"""Success judges beyond the first version, with hand-made answers: majority-vote ensembles, pipelines compared on
the same samples (fixes, breaks, McNemar), localise-and-crop (projection, boxes, crops), MP4 clips, prompt
templates hashed into the sidecar, a thinking budget, and the judge's reasoning kept in the predictions."""

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pandas as pd
import pytest

from robocasa_shift.backends import get_backend
from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.errors import BadInput, RunDirError
from robocasa_shift.judging import crops
from robocasa_shift.judging.export import ExportSettings, export_judge, png_bytes
from robocasa_shift.judging.judges import JUDGES, Judge, Verdict, read_predictions, run_judge
from robocasa_shift.judging.judgeset import JudgeSet, JudgeSetError, decode_png
from robocasa_shift.judging.scoring import majority_vote, pipelines, score
from robocasa_shift.study.runner import run

QUIET = ExecutionConfig(workers=1, progress=False)


def _table(rows):
    columns = ["sample_id", "task", "condition", "episode", "pair_id", "success", "stratum", "steps", "horizon"]
    frame = pd.DataFrame(rows, columns=columns)
    for c in ("factor", "level", "replicate", "episode_key", "n_stages", "stages_completed", "first_incomplete"):
        frame[c] = None
    return frame


def _predictions(verdicts, confidence=None):
    return pd.DataFrame({"sample_id": list(verdicts), "predicted_success": [int(v) for v in verdicts.values()],
                         "confidence": np.nan if confidence is None else [confidence[k] for k in verdicts]})


# --------------------------------------------------------------------------- item 13: ensembles


def test_a_majority_vote_follows_the_majority_and_breaks_ties_by_mean_confidence_else_failure():
    a = _predictions({"x": 1, "y": 1, "z": 0, "w": 0})
    b = _predictions({"x": 1, "y": 0, "z": 0, "w": 1})
    c = _predictions({"x": 0, "y": 1, "z": 0, "q": 1})  # w not judged by c: left out of the three-way vote
    vote = majority_vote({"a": a, "b": b, "c": c}).set_index("sample_id")
    assert sorted(vote.index) == ["x", "y", "z"]
    assert vote["predicted_success"].to_dict() == {"x": 1, "y": 1, "z": 0}
    assert vote.loc["x", "confidence"] == pytest.approx(2 / 3)
    # two judges that split: mean confidence 0.6 -> success; without confidences -> failure
    d = _predictions({"x": 1}, {"x": 0.9})
    e = _predictions({"x": 0}, {"x": 0.3})
    assert majority_vote({"d": d, "e": e})["predicted_success"].tolist() == [1]
    assert majority_vote({"a": a, "b": b}).set_index("sample_id").loc["y", "predicted_success"] == 0
    with pytest.raises(ValueError, match="at least two"):
        majority_vote({"a": a})


def test_an_ensemble_is_scored_like_a_judge_and_may_hold_the_length_only_baseline():
    rows = [(f"s{i}", "Lift", "clean", i, f"p{i}", i < 4, "success" if i < 4 else "mid_task",
             40 if i < 4 else 100, 100) for i in range(8)]
    truth = {r[0]: r[5] for r in rows}
    a = dict(truth, s0=False, s4=True)  # two errors
    b = dict(truth, s1=False, s4=True)  # two errors, one shared (s4)
    result = score(_table(rows), {"a": _predictions(a), "b": _predictions(b)}, n_boot=100,
                   ensembles=[["a", "b", "length-only"]])
    name = "majority(a+b+length-only)"
    # length-only is right everywhere (successes end before the horizon): the vote fixes s0 and s1, s4 stays wrong
    ensemble = result["judges"][name]
    assert ensemble["ensemble"] == ["a", "b", "length-only"] and ensemble["judged"] == 8
    assert ensemble["accuracy"]["micro"]["ba"] == pytest.approx((1.0 + 3 / 4) / 2)
    with pytest.raises(ValueError, match="not a scored judge"):
        score(_table(rows), {"a": _predictions(a)}, ensembles=[["a", "nobody"]])


# --------------------------------------------------------------------------- item 14: pipelines


def test_two_pipelines_on_the_same_samples_count_fixes_and_breaks_with_exact_mcnemar():
    rows = [(f"s{i}", "Lift", "clean" if i < 6 else "blur:L3", i, f"p{i}", i % 2 == 0, "success", 50, 100)
            for i in range(10)]
    truth = {r[0]: r[5] for r in rows}
    full = dict(truth, s0=not truth["s0"], s1=not truth["s1"], s2=not truth["s2"], s3=not truth["s3"])
    crop = dict(truth, s3=not truth["s3"], s7=not truth["s7"])
    result = score(_table(rows), {"full": _predictions(full), "crop": _predictions(crop)}, n_boot=100,
                   compare=[["full", "crop"]])
    by = {r["condition"]: r for r in result["pipelines"]}
    # the crop fixes s0, s1, s2 and breaks s7: McNemar on 3 vs 1, exact two-sided p = 2 x P(X <= 1 | 4, 1/2) = 0.625
    assert (by["all"]["fixes"], by["all"]["breaks"], by["all"]["samples"]) == (3, 1, 10)
    assert by["all"]["mcnemar_p"] == pytest.approx(0.625)
    assert (by["clean"]["fixes"], by["clean"]["breaks"]) == (3, 0) and (by["blur:L3"]["fixes"], by["blur:L3"]["breaks"]) == (0, 1)
    # BA full: successes s0 s2 s4 s6 s8 -> s0, s2 wrong (3/5); failures s1 s3 s5 s7 s9 -> s1, s3 wrong (3/5): 0.6
    assert by["all"]["ba_first"] == pytest.approx(0.6) and by["all"]["ba_second"] == pytest.approx((1.0 + 3 / 5) / 2)
    assert "## Pipelines on the same samples" in __import__("robocasa_shift.judging.scoring", fromlist=["x"]).markdown(
        {**result, "export_hash": "0" * 64})
    with pytest.raises(ValueError, match="two scored judges"):
        score(_table(rows), {"full": _predictions(full)}, compare=[["full", "nobody"]])
    assert pipelines({}, []) == []


# --------------------------------------------------------------------------- localise and crop


def test_the_simulators_object_projects_where_the_renderer_draws_it():
    from robocasa_shift.embodiments.fake_planar import THIRD_PERSON_CAMERAS
    from robocasa_shift.policies.scripted.fake import find_colour

    env = get_backend("fake").make("PickPlace")
    env.reset(3)
    camera, size = THIRD_PERSON_CAMERAS[0], 96
    image = env.render(camera, size)
    red = find_colour(image, 0)  # (row, column) centroid of the object's pixels
    spec = __import__("robocasa_shift.core.specs", fromlist=["x"]).load_stage_spec("fake", "PickPlace")
    obj, _ = crops.relevant_points(env, spec)
    col, row = crops.project(crops.camera_frame(env, camera), size, [obj])[0]
    assert abs(col - red[1]) < 1.5 and abs(row - red[0]) < 1.5


def test_crops_read_points_and_camera_frames_only_through_the_object_points_capability():
    from robocasa_shift.backends.fake import FakeEnv
    from robocasa_shift.core.specs import load_stage_spec

    class WithoutObjectPoints(FakeEnv):
        outcome_points = camera_frame = None

    backend = get_backend("fake")
    spec = load_stage_spec("fake", "PickPlace")
    env = backend.make("PickPlace")
    env.reset(1)
    assert len(crops.relevant_points(env, spec)) == 2 and crops.camera_frame(env, "agentview") is not None
    blind = WithoutObjectPoints(backend.tasks["PickPlace"])
    blind.reset(1)
    assert crops.relevant_points(blind, spec) == [] and crops.camera_frame(blind, "agentview") is None


def test_a_box_is_the_widened_bounding_box_of_the_points_inside_the_image_and_a_crop_cuts_it():
    # margin max(0.12 x 100, 12) = 12: x from 10 - 12 to 20 + 12 + 1, y from 10 - 12 to 30 + 12 + 1, clipped at 0
    assert crops.box([np.array([[10.0, 10.0], [20.0, 30.0]])], 100) == [0, 0, 33, 43]
    # a single point: 12 px each side and the pixel itself, 25 px: a quarter of the image already
    assert crops.box([np.array([[50.0, 50.0]])], 100) == [38, 38, 63, 63]
    # at 200 px the margin is 24: 49 px, widened to 50 around its centre 100.5 (75.5 to 125.5, rounded outward)
    assert crops.box([np.array([[100.0, 100.0]])], 200) == [75, 75, 126, 126]
    assert crops.box([np.array([[np.nan, np.nan], [500.0, 500.0]])], 100) is None
    # a point 2 px from the left edge: x from -10 to 15, clipped to 15 px, widened inward to the quarter (25)
    assert crops.box([np.array([[2.0, 50.0]])], 100) == [0, 38, 25, 63]
    # and at the right edge: x from 86 to 111, clipped at 100, widened inward to 75
    assert crops.box([np.array([[98.0, 50.0]])], 100) == [75, 38, 100, 63]
    # x 34.82-89.68 widened to 56 px around 62.25 (34.25-90.25, which float arithmetic makes 55.99999999999999 wide):
    # it stays there (a version that took any short box for one clipped at the right edge lost it)
    assert crops.box([np.array([[61.7, 100.0], [61.8, 110.0]])], 224) == [34, 73, 91, 138]
    # points the camera does not see are left out; seeing none, the judge gets the image whole
    assert crops.box([np.array([[-5.0, 50.0], [40.0, 40.0]])], 100) == [28, 28, 53, 53]
    assert crops.box([np.array([[-5.0, 50.0], [50.0, 100.0]])], 100) is None
    image = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3)
    assert (decode_png(crops.crop_png(png_bytes(image), [1, 1, 3, 3])) == image[1:3, 1:3]).all()
    with pytest.raises(ValueError, match="not inside"):
        crops.crop_png(png_bytes(image), [0, 0, 5, 2])


@pytest.fixture(scope="module")
def video_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("judge_extended")
    run(root / "run", ["PickPlace"], ["clean", "base:L3"], range(2), StudyConfig(backend="fake", policy="fake",
                                                                                  log_steps=True), QUIET)
    export_judge(root / "run", root / "set", ExportSettings(size=48, frames=3, video=True), QUIET)
    return root


def test_the_export_records_a_box_per_fixed_camera_and_an_mp4_per_camera(video_set):
    js = JudgeSet(video_set / "set")
    for row in js.rows:
        third = [c for c, role in row["cameras"].items() if role == "third_person"]
        wrist = [c for c, role in row["cameras"].items() if role == "wrist"]
        assert set(row["boxes"]) == set(third) and all(row["boxes"][c] is not None for c in third)
        assert not set(row["boxes"]) & set(wrist)  # moving cameras are shown whole
        for camera, path in row["video"].items():
            data = js.image_bytes(row, path)
            assert crops.is_mp4(data) and hashlib.sha256(data).hexdigest() == row["media_sha256"][path]
    # cropped images are the box's size; the wrist camera stays whole
    row = js.rows[0]
    sample = js.sample(row["sample_id"], "clip", crop=True)
    for camera, frames in sample.images["clip"].items():
        shape = decode_png(frames[0]).shape
        rect = row["boxes"].get(camera)
        assert shape[:2] == ((rect[3] - rect[1], rect[2] - rect[0]) if rect else (48, 48))
    assert "video" not in sample.images
    assert crops.is_mp4(next(iter(js.sample(row["sample_id"], "video").images["video"].values())))
    with pytest.raises(JudgeSetError, match="cannot be cropped"):
        js.sample(row["sample_id"], "video", crop=True)
    # the same run exports to the same bytes (MP4 included)
    again = export_judge(video_set / "run", video_set / "again", ExportSettings(size=48, frames=3, video=True), QUIET)
    assert again["export_hash"] == js.export_hash


class SizeJudge(Judge):
    """Success when the end frame of the first camera is narrower than 40 px (a crop): shows what it was given."""

    name = "size-for-test"
    inputs = "end"

    def judge(self, samples):
        out = []
        for s in samples:
            width = decode_png(next(iter(s.images["end"].values()))).shape[1]
            out.append(Verdict(width < 40, None, reasoning=f"first camera {width} px wide\x00"))
        return out


def test_a_judge_run_with_crop_gives_the_judge_crops_and_keeps_its_reasoning(video_set, monkeypatch, tmp_path):
    monkeypatch.setitem(JUDGES._entries, "size-for-test", SizeJudge)
    out = tmp_path / "p.csv"
    run_judge(video_set / "set", "size-for-test", out, {}, QUIET, crop=True)
    predictions = read_predictions(out)
    assert predictions["predicted_success"].eq(1).all()
    assert predictions["reasoning"].str.match(r"first camera \d+ px wide$").all()  # NUL removed
    assert json.loads((tmp_path / "p.csv.json").read_text())["crop"] is True
    with pytest.raises(RunDirError, match="crop"):  # the same file without crop: another pipeline
        run_judge(video_set / "set", "size-for-test", out, {}, QUIET)
    full = tmp_path / "full.csv"
    run_judge(video_set / "set", "size-for-test", full, {}, QUIET)
    assert read_predictions(full)["predicted_success"].eq(0).all()


def test_the_crop_rendering_ablations_blackout_and_upscaled_beside_the_native_cut(video_set, monkeypatch, tmp_path):
    """FailBench App. C, Table 9: the same box rendered three ways; each is its own pipeline with its own sidecar."""
    image = np.arange(6 * 8 * 3, dtype=np.uint8).reshape(6, 8, 3)
    rect = [2, 1, 6, 4]
    blackout = decode_png(crops.crop_png(png_bytes(image), rect, mode="blackout"))
    assert blackout.shape == image.shape and (blackout[1:4, 2:6] == image[1:4, 2:6]).all()
    outside = np.ones(image.shape[:2], bool)
    outside[1:4, 2:6] = False
    assert (blackout[outside] == 0).all()
    upscaled = decode_png(crops.crop_png(png_bytes(image), rect, mode="upscaled"))
    assert upscaled.shape == image.shape
    assert crops.crop_png(png_bytes(image), rect, mode="upscaled") == crops.crop_png(png_bytes(image), rect, mode="upscaled")
    with pytest.raises(ValueError, match="unknown crop mode 'zoom'"):
        crops.crop_png(png_bytes(image), rect, mode="zoom")
    # a blackout judge sees full-size frames (SizeJudge: success only below 40 px), and its sidecar says which mode
    monkeypatch.setitem(JUDGES._entries, "size-for-test", SizeJudge)
    out = tmp_path / "blackout.csv"
    run_judge(video_set / "set", "size-for-test", out, {}, QUIET, crop="blackout")
    assert read_predictions(out)["predicted_success"].eq(0).all()
    sidecar = json.loads((tmp_path / "blackout.csv.json").read_text())
    assert sidecar["crop"] is True and sidecar["crop_mode"] == "blackout"
    with pytest.raises(RunDirError, match="crop"):  # the native cut into the blackout file: another pipeline
        run_judge(video_set / "set", "size-for-test", out, {}, QUIET, crop=True)


# --------------------------------------------------------------------------- item 15, 16: the OpenAI adapter


class Thinker(BaseHTTPRequestHandler):
    requests = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Thinker.requests.append(body)
        message = {"role": "assistant", "content": '<think>the cube sits on the other one</think>'
                                                   '{"success": true, "confidence": 0.8}'}
        if body.get("chat_template_kwargs"):
            message = {"role": "assistant", "reasoning_content": "looked at both views",
                       "content": '{"success": false, "confidence": 0.1}'}
        reply = json.dumps({"choices": [{"message": message}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@pytest.fixture()
def thinker():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Thinker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Thinker.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_prompt_templates_are_hashed_thinking_is_asked_for_and_reasoning_is_kept(video_set, thinker, tmp_path,
                                                                                 monkeypatch):
    from robocasa_shift.judging.openai_judge import DEFAULT_PROMPT_FILE, SYSTEM_PROMPT

    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-test")
    prompt = tmp_path / "strict.txt"
    prompt.write_text("Be strict. Answer JSON {\"success\": bool, \"confidence\": number}.\n")
    base = {"base_url": thinker, "api_key": "env:JUDGE_TEST_KEY", "inputs": "end"}
    run_judge(video_set / "set", "openai", tmp_path / "a.csv", {**base, "prompt_file": str(prompt)}, QUIET)
    sidecar = json.loads((tmp_path / "a.csv.json").read_text())
    assert sidecar["judge"]["prompt_sha256"] == hashlib.sha256(prompt.read_bytes()).hexdigest()
    assert Thinker.requests[0]["messages"][0]["content"] == prompt.read_text().strip()
    a = read_predictions(tmp_path / "a.csv")
    assert a["predicted_success"].eq(1).all() and a["reasoning"].eq("the cube sits on the other one").all()
    # the default template is the package's file, and holds the prompt the adapter always sent
    assert DEFAULT_PROMPT_FILE.read_text().strip() == SYSTEM_PROMPT
    Thinker.requests = []
    run_judge(video_set / "set", "openai", tmp_path / "b.csv", {**base, "thinking_budget": "256", "max_tokens": "64",
                                                                "reasoning_effort": "high"}, QUIET)
    body = Thinker.requests[0]
    assert body["chat_template_kwargs"] == {"enable_thinking": True} and body["max_tokens"] == 320
    assert body["reasoning_effort"] == "high"
    b = read_predictions(tmp_path / "b.csv")
    assert b["predicted_success"].eq(0).all() and b["reasoning"].eq("looked at both views").all()
    with pytest.raises(BadInput, match="prompt_file"):
        run_judge(video_set / "set", "openai", tmp_path / "c.csv", {**base, "prompt_file": str(tmp_path / "no.txt")},
                  QUIET)


def test_the_video_input_sends_each_cameras_mp4(video_set, thinker, tmp_path, monkeypatch):
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-test")
    options = {"base_url": thinker, "api_key": "env:JUDGE_TEST_KEY", "inputs": "video"}
    run_judge(video_set / "set", "openai", tmp_path / "v.csv", options, QUIET)
    js = JudgeSet(video_set / "set")
    first = Thinker.requests[0]["messages"][1]["content"]
    videos = [p["video_url"]["url"] for p in first if p["type"] == "video_url"]
    assert videos and not [p for p in first if p["type"] == "image_url"]
    sent = sorted(base64.b64decode(u.split(",", 1)[1]) for u in videos)
    row = next(r for r in js.rows if sorted(js.image_bytes(r, p) for p in r["video"].values()) == sent)
    assert row is not None


# --------------------------------------------------------------------------- the run's report


def test_the_report_shows_the_scores_of_a_judge_set_exported_into_the_run(tmp_path):
    from robocasa_shift.report.studies import judge_sections

    assert judge_sections(tmp_path) == []
    scores = tmp_path / "judge-set" / "scores"
    scores.mkdir(parents=True)
    (scores / "scores.md").write_text("# Success judges on judge set 0123abcd\n\n## Pipelines on the same samples\n\n| first | fixes |\n|---|---|\n| a | 3 |\n")
    assert judge_sections(tmp_path) == []  # scores without an export beside them are not a judge set
    (tmp_path / "judge-set" / "export.json").write_text("{}")
    html = "".join(judge_sections(tmp_path))
    assert "<h2>Success judges</h2>" in html and "<h3>judge-set: Success judges on judge set 0123abcd</h3>" in html and "Pipelines on the same samples" in html
    assert "<td>3</td>" in html


# --------------------------------------------------------------------------- a VLM localiser


class Localiser(BaseHTTPRequestHandler):
    """A stand-in VLM localiser: answers a box of 10 x 12 px at (5, 6), garbage for the instruction 'garble'."""

    requests = []
    answer = '{"box": [5, 6, 15, 18]}'

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Localiser.requests.append(body)
        reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": Localiser.answer}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def test_a_vlm_localisers_boxes_crop_any_detectors_input(video_set, tmp_path, monkeypatch):
    """FailBench Sec. 4.4 / App. C: localiser and detector as two halves; here the localiser is a stand-in server."""
    import shutil

    from robocasa_shift.judging.boxes import read_boxes
    from robocasa_shift.judging.localiser import localise_set, parse_box

    js_dir = tmp_path / "set"
    shutil.copytree(video_set / "set", js_dir)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Localiser)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Localiser.requests, Localiser.answer = [], '{"box": [5, 6, 15, 18]}'
    monkeypatch.setenv("LOCALISER_KEY", "sk-test")
    try:
        options = {"base_url": f"http://127.0.0.1:{server.server_address[1]}/v1", "api_key": "env:LOCALISER_KEY"}
        result = localise_set(js_dir, "standin", options)
    finally:
        server.shutdown()
    js = JudgeSet(js_dir)
    third = {sid: [c for c, role in row["cameras"].items() if role == "third_person"] for sid, row in js.by_id.items()}
    assert len(Localiser.requests) == sum(len(v) for v in third.values())  # one request per third-person view
    first = Localiser.requests[0]["messages"][1]["content"]
    assert first[0]["text"].startswith("Task instruction:") and "48x48 pixels" in first[1]["text"]
    assert all(box == [5, 6, 15, 18] for by in result["boxes"].values() for box in by.values())
    assert read_boxes(js, "standin")["export_hash"] == js.export_hash
    # any detector crops to them: SizeJudge sees 10 px wide images (success below 40 px)
    monkeypatch.setitem(JUDGES._entries, "size-for-test", SizeJudge)
    out = tmp_path / "p.csv"
    run_judge(js_dir, "size-for-test", out, {}, QUIET, boxes="standin")
    assert read_predictions(out)["reasoning"].str.contains("first camera 10 px wide").any()
    sidecar = json.loads((tmp_path / "p.csv.json").read_text())
    assert sidecar["boxes"]["name"] == "standin" and len(sidecar["boxes"]["sha256"]) == 64
    # replies without a usable box leave the camera whole; a box is clipped to the image
    assert parse_box("I cannot see it", 48, 48) is None and parse_box('{"box": null}', 48, 48) is None
    assert parse_box('thinking... {"box": [-3, 2, 60, 20.4]}', 48, 48) == [0, 2, 48, 20]
    assert parse_box('{"box": [30, 2, 10, 20]}', 48, 48) is None and parse_box('{"box": [1, true, 3, 4]}', 48, 48) is None


def test_a_forged_boxes_file_is_refused_naming_the_file_and_the_field(video_set, tmp_path):
    import shutil

    from robocasa_shift.judging.boxes import read_boxes

    js_dir = tmp_path / "set"
    shutil.copytree(video_set / "set", js_dir)
    js = JudgeSet(js_dir)
    sid, row = next(iter(js.by_id.items()))
    camera = next(c for c, role in row["cameras"].items() if role == "third_person")
    wrist = next(c for c, role in row["cameras"].items() if role == "wrist")
    (js_dir / "boxes").mkdir()
    cases = [
        ({"export_hash": "0" * 64, "boxes": {}}, "made for judge set"),
        ({"export_hash": js.export_hash, "boxes": {"../x": {}}}, "is not in the judge set"),
        ({"export_hash": js.export_hash, "boxes": {sid: {wrist: [0, 0, 5, 5]}}}, "no third-person camera"),
        ({"export_hash": js.export_hash, "boxes": {sid: {camera: [5, 5, 1, 1]}}}, "not \\[x0, y0, x1, y1\\]"),
        ({"export_hash": js.export_hash, "boxes": {sid: {camera: [0, 0, 10**9, 5]}}}, "not \\[x0, y0, x1, y1\\]"),
        ([1, 2], "not a boxes file"),
    ]
    for data, message in cases:
        (js_dir / "boxes" / "forged.json").write_text(json.dumps(data))
        with pytest.raises(JudgeSetError, match=message):
            read_boxes(js, "forged")
    with pytest.raises(BadInput, match="localiser output name"):
        read_boxes(js, "../escape")
