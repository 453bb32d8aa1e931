"""Shared run directories, judge sets and judge servers, round 3 (issue 31): each finding attacked, then refused.

Every test plays whoever wrote a directory someone else runs commands on (planted symbolic links,
FIFOs, forged paths, decompression bombs, forged metadata) or a hostile OpenAI-compatible server on
loopback (redirects, drips, huge or malformed replies), on directories and servers it makes itself.
A test that could hang on the bug it checks runs under a deadline (SIGALRM), so a regression fails
instead of stalling the suite.
"""

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import sys
import threading
import time
import tracemalloc
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from shared_dirs import QUIET, copy_corpus, deadline, make_corpus, register_test_judge

from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.core.steplog import StepLog, StepLogError, log_path
from robocasa_shift.errors import BadInput, PolicyOptionError, PolicyServerError, RunDirError, RunDirLocked
from robocasa_shift.judging.judgeset import JudgeSample, JudgeSet, JudgeSetError
from robocasa_shift.judging.judges import PredictionsError, read_predictions, run_judge
from robocasa_shift.rundir.store import RunStore

HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture()
def mine(corpus, tmp_path):
    """A private copy of the corpus, plus an ``outside`` folder (what a planted link points at)."""
    dirs = copy_corpus(corpus, tmp_path)
    dirs["outside"] = tmp_path / "outside"
    dirs["outside"].mkdir()
    return dirs


def snapshot_of(folder: Path):
    """Every file under ``folder`` with its bytes: to show nothing outside changed."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def rehash_judge_set(judge_set: Path, rows) -> None:
    """Rewrite a judge set's manifest with ``rows`` and a matching export hash (what a forger does)."""
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    (judge_set / "manifest.jsonl").write_text(text)
    info = json.loads((judge_set / "export.json").read_text())
    info["export_hash"] = hashlib.sha256(text.encode()).hexdigest()
    (judge_set / "export.json").write_text(json.dumps(info))


# =========================================================================== 1. planted symbolic links


def test_judge_never_appends_through_a_planted_predictions_link_or_folder(mine):
    judge = register_test_judge()
    aliases = mine["outside"] / "bash_aliases"
    aliases.write_text("alias ll='ls -l'\n")
    predictions = mine["set"] / "predictions" / f"{judge}.csv"
    predictions.unlink()
    predictions.symlink_to(aliases)
    with pytest.raises(RunDirError, match="symbolic link"):
        run_judge(mine["set"], judge, predictions, {}, QUIET)
    assert aliases.read_text() == "alias ll='ls -l'\n"
    # a planted folder: SET/predictions -> somewhere else
    shutil.rmtree(mine["set"] / "predictions")
    (mine["set"] / "predictions").symlink_to(mine["outside"], target_is_directory=True)
    with pytest.raises(RunDirError, match="symbolic link"):
        run_judge(mine["set"], judge, mine["set"] / "predictions" / f"{judge}.csv", {}, QUIET)
    assert sorted(p.name for p in mine["outside"].iterdir()) == ["bash_aliases"]


def test_a_sample_id_outside_the_safe_character_set_is_refused_when_the_set_is_read(mine):
    rows = [json.loads(line) for line in (mine["set"] / "manifest.jsonl").read_text().splitlines()]
    rows[0]["sample_id"] = "x;touch MARKER;#"
    rehash_judge_set(mine["set"], rows)
    with pytest.raises(JudgeSetError, match="sample_id"):
        JudgeSet(mine["set"])
    with pytest.raises(JudgeSetError, match="sample_id"):
        run_judge(mine["set"], register_test_judge(), mine["outside"] / "p.csv", {}, QUIET)
    assert not (mine["outside"] / "p.csv").exists()


def test_report_monitors_and_analysis_never_write_through_planted_links(mine):
    from robocasa_shift.report.monitors import evaluate_monitors
    from robocasa_shift.report.page import build_report

    run, outside = mine["run"], mine["outside"]
    victim = outside / "victim.txt"
    victim.write_text("precious\n")
    # a link in place of a file: replaced by the file, the file it names untouched
    (run / "monitors").mkdir()
    (run / "monitors" / "summary.json").symlink_to(victim)
    evaluate_monitors(run, ["clock"], n_resamples=20)
    assert victim.read_text() == "precious\n" and not (run / "monitors" / "summary.json").is_symlink()
    # a link in place of a folder: refused, nothing created outside
    for folder in ("monitors", "report", "analysis"):
        if (run / folder).exists():
            shutil.rmtree(run / folder)
        (run / folder).symlink_to(outside, target_is_directory=True)
    with pytest.raises(RunDirError, match="symbolic link"):
        evaluate_monitors(run, ["clock"], n_resamples=20)
    with pytest.raises(RunDirError, match="symbolic link"):
        build_report(run, videos_per_kind=0, n_boot=100)
    assert snapshot_of(outside) == {"victim.txt": b"precious\n"}


def test_score_judge_and_the_branch_summary_never_write_through_planted_links(mine):
    from robocasa_shift.report.branching import write_branch_outputs
    from robocasa_shift.report.judges import write_judge_scores

    outside = mine["outside"]
    (mine["set"] / "scores").symlink_to(outside, target_is_directory=True)
    with pytest.raises(RunDirError, match="symbolic link"):
        write_judge_scores(mine["set"], [mine["predictions"]], n_boot=100)
    study = mine["run"] / "branching" / "default"
    (study / "summary.json").symlink_to(outside / "summary.json")
    (study / "figures").symlink_to(outside, target_is_directory=True)
    with pytest.raises(RunDirError, match="symbolic link"):
        write_branch_outputs(study)
    assert snapshot_of(outside) == {}


def test_commands_jsonl_and_the_lock_are_never_opened_through_planted_links(mine):
    import robocasa_shift as rs

    run, outside = mine["run"], mine["outside"]
    for name in ("commands.jsonl", ".lock"):
        target = outside / name
        target.write_text("keep me\n")
        path = run / name
        if path.exists():
            path.unlink()
        path.symlink_to(target)
        with pytest.raises(RunDirError, match="symbolic link"):
            rs.run_study(run, ["Reach"], ["clean"], [0], study=StudyConfig(backend="fake", policy="fake",
                                                                             log_steps=True), execution=QUIET)
        assert target.read_text() == "keep me\n"  # neither appended to nor truncated
        path.unlink()


# =========================================================================== 2. the judge's key on redirects


class Recorder(BaseHTTPRequestHandler):
    """The host a redirect points at: records the Authorization header of every request and answers 'success'."""

    seen = []

    def do_POST(self):  # noqa: N802
        Recorder.seen.append(self.headers.get("Authorization"))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def do_GET(self):  # noqa: N802  (urllib turned the POST into a GET on a 302)
        Recorder.seen.append(self.headers.get("Authorization"))
        self._answer()

    def _answer(self):
        reply = json.dumps({"choices": [{"message": {"content": '{"success": true, "confidence": 1.0}'}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def http_server(handler):
    server = ThreadingHTTPServer((HOST, 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def tiny_samples(n=3):
    from robocasa_shift.judging.export import png_bytes

    png = png_bytes(np.zeros((8, 8, 3), np.uint8))
    return [JudgeSample(f"s{i}", "do it", "Reach", {"cam": "third_person"},
                        {"end": {"cam": png}, "start": {"cam": png}}) for i in range(n)]


def test_the_openai_judge_follows_no_redirect_and_refuses_credentials_in_base_url(monkeypatch):
    from robocasa_shift.judging.openai_judge import OpenAIJudge

    monkeypatch.setenv("JUDGE_KEY_31", "sk-secret-31")
    Recorder.seen = []
    with http_server(Recorder) as elsewhere:
        class Redirect(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(302)
                self.send_header("Location", f"{elsewhere}/v1/chat/completions")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        with http_server(Redirect) as base:
            judge = OpenAIJudge(base_url=f"{base}/v1", api_key="env:JUDGE_KEY_31", timeout_s=5)
            verdicts = judge.judge(tiny_samples(3))
    assert Recorder.seen == []  # the key never reached the other host, and it decided nothing
    assert all(v.error and "HTTP 302" in v.error and "redirect" in v.error for v in verdicts)
    for url in ("http://user:sk-secret@127.0.0.1:9/v1", "http://sk-secret@127.0.0.1:9/v1",
                "http://127.0.0.1:9/v1?api_key=sk-secret"):
        with pytest.raises(BadInput, match="base_url"):
            OpenAIJudge(base_url=url, api_key="env:JUDGE_KEY_31")


# =========================================================================== 3. URL credentials in run directories


def test_url_credentials_of_any_option_are_redacted_wherever_options_are_written(tmp_path, monkeypatch):
    import robocasa_shift as rs
    from robocasa_shift.policies import POLICIES
    from robocasa_shift.policies.scripted.fake import FakeExpertPolicy

    class UrlPolicy(FakeExpertPolicy):
        name = "url-test"

        def __init__(self, host="ws://localhost:8000"):
            super().__init__()
            self.host = host

    if "url-test" not in POLICIES:
        POLICIES.register("url-test", UrlPolicy)
    host = "ws://alice:PW-3131@127.0.0.1:9/?api_key=Q-3131&x=1"
    monkeypatch.setattr(sys, "argv", ["robocasa-shift", "run", "--policy-option", f"host={host}",
                                      f"--policy-option=host={host}", host])
    run = tmp_path / "run"
    rs.run_study(run, ["Reach"], ["clean"], [0], study=StudyConfig(backend="fake", policy="url-test",
                                                                     policy_options={"host": host}), execution=QUIET)
    written = {p.name: p.read_text() for p in run.rglob("*.json*")}
    assert not [name for name, text in written.items() if "PW-3131" in text or "Q-3131" in text]
    manifest = json.loads(written["manifest.json"])
    assert manifest["policy_options"]["host"] == "ws://alice:<redacted>@127.0.0.1:9/?api_key=<redacted>&x=1"
    assert "alice:<redacted>@" in written["commands.jsonl"] and "x=1" in written["commands.jsonl"]


@pytest.mark.parametrize("address", ["ray://alice:PW-3131@10.0.0.5:10001", "alice:PW-3131@10.0.0.5:6379",
                                     "ray://PW-3131@10.0.0.5:10001"])
def test_a_ray_address_with_credentials_is_refused_without_showing_them(address, tmp_path):
    """Defect: a ray://user:PASS@host address was echoed in clear in the error message. Ray takes no credentials
    in its address; it is refused before anything starts, the password shown as the placeholder."""
    from click.testing import CliRunner

    from robocasa_shift.cli import main

    with pytest.raises(BadInput, match="must not hold credentials") as refused:
        ExecutionConfig(executor="ray", address=address)
    assert "PW-3131" not in str(refused.value) and "<redacted>" in str(refused.value)
    result = CliRunner().invoke(main, ["run", "--backend", "fake", "--policy", "fake", "--task", "Reach",
                                       "--condition", "clean", "--episodes", "0", "--executor", "ray", "--address",
                                       address, "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2 and "must not hold credentials" in result.output, result.output
    assert "PW-3131" not in result.output and not (tmp_path / "run").exists()


# =========================================================================== 4. paths a trunk file names


def _pending_checkpoint(run: Path):
    """The branch study's trunk file and its JSON, with one checkpoint result removed (so resume reads the snapshot)."""
    study = run / "branching" / "default"
    trunk_file = next((study / "trunks").rglob("*.json"))
    trunk = json.loads(trunk_file.read_text())
    next((study / "checkpoints").rglob("*.json")).unlink()
    return study, trunk_file, trunk


def test_branch_resume_reads_no_snapshot_outside_the_study_and_no_fifo(mine):
    from robocasa_shift.branching.checkpoints import BranchSettings
    from robocasa_shift.branching.study import Selection, branch

    run, outside = mine["run"], mine["outside"]
    study, trunk_file, trunk = _pending_checkpoint(run)
    snapshot = study / trunk["snapshot_file"]
    stolen = outside / "secret.npz"
    shutil.copy(snapshot, stolen)
    settings = BranchSettings(interventions=("continue",), k_initial=1, k_expanded=1, stride=4)
    outside_hash = hashlib.sha256(stolen.read_bytes()).hexdigest()
    for forged in (str(stolen), os.path.relpath(stolen, study), "trunks/../../../../outside/secret.npz"):
        trunk_file.write_text(json.dumps({**trunk, "snapshot_file": forged}))
        snapshot.unlink(missing_ok=True)
        with pytest.raises(RunDirError, match="snapshot_file") as info:
            with deadline(60):
                branch(run, Selection(max_trunks=1), settings, QUIET)
        assert outside_hash not in str(info.value)
    # a link inside the study to the outside file, and a FIFO in place of the snapshot
    trunk_file.write_text(json.dumps(trunk))
    snapshot.symlink_to(stolen)
    with pytest.raises(RunDirError, match="snapshot_file"):
        with deadline(60):
            branch(run, Selection(max_trunks=1), settings, QUIET)
    snapshot.unlink()
    os.mkfifo(snapshot)
    started = time.monotonic()
    with pytest.raises(RunDirError, match="snapshot_file"):
        with deadline(60):
            branch(run, Selection(max_trunks=1), settings, QUIET)
    assert time.monotonic() - started < 30


# =========================================================================== 5. decompression bombs


def zero_bomb(declared_shape, name="action", dtype="<f8") -> bytes:
    """An ``.npz`` entry of zeros: its deflated bytes are ~1000 times smaller than the array it declares."""
    header = io.BytesIO()
    np.lib.format.write_array_header_2_0(header, {"descr": dtype, "fortran_order": False, "shape": declared_shape})
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        info = zipfile.ZipInfo(f"{name}.npy")
        info.compress_type = zipfile.ZIP_DEFLATED
        with archive.open(info, "w", force_zip64=True) as f:
            f.write(header.getvalue())
            block = bytes(2**20)
            left = int(np.prod(declared_shape)) * np.dtype(dtype).itemsize
            while left:
                f.write(block[: min(left, len(block))])
                left -= min(left, len(block))
    return buffer.getvalue()


@contextlib.contextmanager
def peak_allocation():
    """The largest memory traced while the block runs (numpy's arrays are traced), in bytes."""
    tracemalloc.start()
    box = {}
    try:
        yield box
    finally:
        box["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


def test_forged_step_logs_and_snapshots_are_refused_before_they_are_decompressed(mine):
    from robocasa_shift.branching.snapshot import SnapshotError, TrunkTape

    store = RunStore(mine["run"])
    record = next(r for r in store.records() if r.get("step_log"))
    path = log_path(store.record_path(RolloutKey.from_record(record)))
    bomb = zero_bomb((200_000, 64))  # 100 MiB of arrays in ~100 kB
    assert len(bomb) < 1_000_000
    path.write_bytes(bomb)
    record["step_log"]["sha256"] = hashlib.sha256(bomb).hexdigest()
    store.record_path(RolloutKey.from_record(record)).write_text(json.dumps(record))
    with peak_allocation() as memory:
        with pytest.raises(StepLogError, match="declare more than"):
            store.step_log(record)
    assert memory["peak"] < 20 * 2**20
    snapshot_bomb = zero_bomb((300 * 2**20,), "trunk/states", "|u1")  # 300 MiB in ~300 kB
    (mine["outside"] / "t.npz").write_bytes(snapshot_bomb)
    with peak_allocation() as memory:
        with pytest.raises(SnapshotError, match="declare more than"):
            TrunkTape.read(mine["outside"] / "t.npz")
    assert memory["peak"] < 20 * 2**20
    from robocasa_shift.branching.study import read_snapshot  # what `branch` and the audit read snapshots with

    with peak_allocation() as memory:
        with pytest.raises(RunDirError, match="declare more than"):
            read_snapshot(mine["outside"] / "t.npz", hashlib.sha256(snapshot_bomb).hexdigest())
    assert memory["peak"] < 20 * 2**20


# =========================================================================== 6. judge-set media


def test_judge_set_images_must_be_regular_files_inside_the_set_and_small(mine):
    from robocasa_shift.judging.judgeset import decode_png

    js = JudgeSet(mine["set"])
    row = js.rows[0]
    relative = row["end"][next(iter(row["cameras"]))]
    image = mine["set"] / relative
    copy = mine["outside"] / "known.png"
    shutil.copy(image, copy)  # the same bytes: the hash in the manifest matches
    image.unlink()
    image.symlink_to(copy)
    with pytest.raises(JudgeSetError, match="symbolic link"):
        js.image_bytes(row, relative)
    image.unlink()
    os.mkfifo(image)
    with deadline(20):
        with pytest.raises(JudgeSetError, match="not a regular file"):
            js.image_bytes(row, relative)
        with pytest.raises(JudgeSetError, match="not a regular file"):
            run_judge(mine["set"], register_test_judge(), mine["outside"] / "p.csv", {}, QUIET)
    image.unlink()
    image.symlink_to("/dev/zero")
    with deadline(20):
        with pytest.raises(JudgeSetError, match="symbolic link"):
            js.image_bytes(row, relative)
    from PIL import Image

    huge = io.BytesIO()
    Image.new("RGB", (6000, 6000)).save(huge, format="PNG")  # 108 MB of pixels in ~100 kB
    with pytest.raises(JudgeSetError, match="pixels"):
        decode_png(huge.getvalue())


# =========================================================================== 7. a hostile OpenAI-compatible server


def hostile(behaviour):
    """A handler class whose replies are ``behaviour(handler)``."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            behaviour(self)

        def log_message(self, *args):
            pass

    return Handler


def reply(handler, status, body: bytes, headers=()):
    handler.send_response(status)
    for k, v in headers:
        handler.send_header(k, v)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def content(text):
    return json.dumps({"choices": [{"message": {"content": text}}]}).encode()


def test_a_hostile_judge_server_cannot_hold_flood_or_crash_the_judge(monkeypatch):
    from robocasa_shift.judging.openai_judge import OpenAIJudge

    monkeypatch.setenv("JUDGE_KEY_31", "k")

    def make(url, **kw):
        return OpenAIJudge(base_url=f"{url}/v1", api_key="env:JUDGE_KEY_31", **kw)

    def drip(h):
        h.send_response(200)
        h.send_header("Content-Length", "100")
        h.end_headers()
        try:
            for _ in range(100):
                h.wfile.write(b" ")
                h.wfile.flush()
                time.sleep(0.1)
        except OSError:
            pass

    with http_server(hostile(drip)) as url:  # one byte every 0.1 s: 10 s in all, the deadline is 1 s
        started = time.monotonic()
        with deadline(30):
            [verdict] = make(url, timeout_s=1.0).judge(tiny_samples(1))
        assert time.monotonic() - started < 4 and "within timeout_s" in verdict.error

    big = b'{"choices": [{"message": {"content": "yes"}}]}' + b" " * (6 * 2**20)
    with http_server(hostile(lambda h: reply(h, 200, big))) as url:
        [verdict] = make(url).judge(tiny_samples(1))
        assert "max_reply_bytes" in verdict.error

    odd = iter([content(None), b"{not json", None, None, content('{"success": true, "confidence": 0.5}')])

    def mixed(h):
        body = next(odd)
        if body is None:  # an HTTP 500, then a 307
            status = 500 if not getattr(mixed, "once", False) else 307
            mixed.once = True
            reply(h, status, b"", [("Location", "http://127.0.0.1:9/")] if status == 307 else [])
        else:
            reply(h, 200, body)

    with http_server(hostile(mixed)) as url:
        verdicts = make(url).judge(tiny_samples(5))  # four bad answers in a row, fewer than the limit (5)
    assert [bool(v.error) for v in verdicts] == [True, True, True, True, False]
    assert "not text" in verdicts[0].error and "not JSON" in verdicts[1].error
    assert "HTTP 500" in verdicts[2].error and "HTTP 307" in verdicts[3].error and verdicts[4].predicted_success

    with http_server(hostile(lambda h: reply(h, 500, b""))) as url:
        with pytest.raises(PolicyServerError, match="3 requests in a row failed"):
            make(url, max_consecutive_failures=3).judge(tiny_samples(5))
    with http_server(hostile(lambda h: reply(h, 401, b""))) as url:
        with pytest.raises(PolicyServerError, match="HTTP 401"):
            make(url).judge(tiny_samples(5))


# =========================================================================== 8. one writer per predictions file


def test_a_predictions_file_has_one_writer_and_score_judge_names_duplicates_and_stray_headers(mine):
    judge = register_test_judge()
    predictions = mine["predictions"]
    lock = os.open(predictions.with_name(predictions.name + ".lock"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another `judge` run holds it
        with pytest.raises(RunDirLocked, match="another judge run"):
            run_judge(mine["set"], judge, predictions, {}, QUIET)
    finally:
        os.close(lock)
    # what two concurrent runs made before: two header lines, rows judged twice
    text = predictions.read_text()
    header, rows = text.splitlines()[0], text.splitlines()[1:]
    predictions.write_text("\n".join([header, *rows[:3], header, *rows]) + "\n")
    with pytest.raises(PredictionsError, match="repeats the header"):
        read_predictions(predictions)
    predictions.write_text("\n".join([header, *rows[:3], *rows]) + "\n")
    with pytest.raises(PredictionsError, match=f"{rows[0].split(',')[0]}.*judged more than once"):
        read_predictions(predictions)
    predictions.write_text("\n".join([header, *rows[:3], header, *rows]) + "\n")
    result = run_judge(mine["set"], judge, predictions, {}, QUIET)  # a rerun repairs the file
    assert result["repaired"] == {"headers": 1, "duplicates": 3}
    frame = read_predictions(predictions, known_ids=list(JudgeSet(mine["set"]).by_id))
    assert len(frame) == len(rows) and frame["sample_id"].is_unique


# =========================================================================== lower severity


def test_forged_step_log_metadata_is_refused_before_a_monitor_indexes_with_it():
    from robocasa_shift.monitoring import monitors

    from robocasa_shift.arrays import npz_bytes, text_array
    from robocasa_shift.core.steplog import FORMAT, VERSION

    steps = 12
    meta = {"arm_dims": [0, 1], "gripper_dim": 2, "samples": 0, "stage_names": [], "format": FORMAT, "version": VERSION}
    arrays = {"eef_pos": np.zeros((steps + 1, 3)), "action": np.zeros((steps, 3)), "latched": np.zeros(steps, np.int64),
              "boundary": np.arange(0, steps, 4)}

    def forge(meta_changes=(), **changes):
        return npz_bytes({"meta": text_array(json.dumps({**meta, **dict(meta_changes)})), **arrays, **changes})

    assert len(monitors.score("action_jerk", StepLog.read(forge()))) == 3
    forged = [(forge({"arm_dims": "abc"}), "arm_dims"), (forge({"arm_dims": list(range(10**6))}), "arm_dims"),
              (forge({"arm_dims": [0, 0, 0, 0, 0, 0]}), "arm_dims"), (forge({"gripper_dim": 7}), "gripper_dim"),
              (forge(boundary=np.array([0, 4, 99])), "boundaries"), (forge(boundary=np.array([-1, 4])), "boundaries"),
              (forge(action=np.zeros((steps, 3), "S4")), "action"), (forge(eef_pos=np.zeros((steps + 1, 2))), "eef_pos"),
              # contact rows the behaviour metrics index: one per step, five integer columns, flags 0 or 1
              (forge(contacts=np.zeros((steps, 3), np.int64)), "contacts"),
              (forge(contacts=np.zeros((steps - 1, 5), np.int64)), "contact rows"),
              (forge(contacts=np.zeros((steps, 5))), "contacts"),
              (forge(contacts=np.full((steps, 5), 7, np.int64)), "contacts"),
              (forge(contacts=np.full((steps, 5), -1, np.int64)), "contacts")]
    assert StepLog.read(forge(contacts=np.tile([1, 0, 1, 0, -5], (steps, 1)))).contacts.shape == (steps, 5)
    for data, word in forged:
        with pytest.raises(StepLogError, match=word):
            StepLog.read(data)
    # feature sets that the feature-set analyses slice columns with: names and widths that fit the features
    features = np.zeros((3, 5), np.float32)
    good = StepLog.read(forge({"feature_blocks": [["a", 2], ["b", 3]]}, features=features))
    assert good.meta["feature_blocks"] == [["a", 2], ["b", 3]]
    for blocks in ([["a", 2], ["b", 2]], [["a", 2], ["a", 3]], [["a", -1], ["b", 6]], "ab", [["a" * 65, 5]],
                   [["a\n", 5]], [[1, 5]], [["a", 5.0]], [["a", True], ["b", 4]], [["a", 5, 0]]):
        with pytest.raises(StepLogError, match="feature_blocks"):
            StepLog.read(forge({"feature_blocks": blocks}, features=features))
    with pytest.raises(StepLogError, match="feature_blocks"):  # sets named, but no features
        StepLog.read(forge({"feature_blocks": [["a", 5]]}))


def test_the_launcher_keeps_no_session_id_longer_than_its_cap():
    import msgpack
    import zmq

    from robocasa_shift.policies.gr00t import server as launcher_module
    from robocasa_shift.policies.gr00t.server import Gr00tLauncher

    cap = getattr(launcher_module, "MAX_SESSION_ID_CHARS", 128)

    class Model:
        def get_modality_config(self):
            return {}

        def get_action(self, obs):
            return {}

    launcher = Gr00tLauncher(Model(), HOST, 0)
    launcher.start()
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(f"tcp://{HOST}:{launcher.port}")
    try:
        for length in (cap, 2**20):
            sock.send(msgpack.packb({"endpoint": "reset", "session": "s" * length, "data": {"seed": 1}}))
            sock.recv()
    finally:
        sock.close(linger=0)
        launcher.stop()
    assert [len(s) for s in launcher.sessions] == [cap]


def test_a_packed_snapshot_index_with_negative_dimensions_or_void_dtypes_is_refused():
    from robocasa_shift.arrays import text_array
    from robocasa_shift.branching.snapshot import SnapshotError, unpack

    blob = np.arange(16, dtype=np.uint8)
    for row in (["x", "|u1", [-1], 0, -1], ["x", "|V8", [1], 0, 8], ["x", "|u1", [2.0], 0, 2],
                ["x", "|u1", [True], 0, 1]):
        with pytest.raises(SnapshotError, match="malformed packed state"):
            unpack(text_array(json.dumps([row])), blob, "forged")
    assert unpack(text_array(json.dumps([["x", "|u1", [2, 4], 8, 8]])), blob, "ok")["x"].shape == (2, 4)


def test_a_manifest_may_not_choose_which_environment_variable_a_trusted_re_run_sends():
    from robocasa_shift.engine.replay import replay_policy_options

    manifest = {"policy": {"name": "gr00t"}, "policy_options": {"host": "10.9.8.7", "api_token": "env:HOME",
                                                                "endpoint": "ws://u:<redacted>@h/"}}
    with pytest.raises(PolicyOptionError, match="api_token.*endpoint|endpoint.*api_token"):
        replay_policy_options(manifest, trust_run_dir=True)
    mine = {"api_token": "env:MY_GR00T_TOKEN", "endpoint": "ws://h/"}
    assert replay_policy_options(manifest, mine, trust_run_dir=True) == {"host": "10.9.8.7", **mine}


def test_temporary_files_of_killed_writers_are_removed_when_the_directory_is_next_opened(mine):
    folder = mine["run"] / "records" / "formal" / "Reach"
    dead_pid = 4_194_304 + 4242  # above any Linux pid_max: no such process
    orphans = [folder / f".0000__clean__r0.json.{dead_pid}.tmp", folder / f".x.json.{dead_pid}.0badc0de.tmp"]
    live = folder / f".0001__clean__r0.json.{os.getpid()}.tmp"  # a write in progress in a live process
    for path in (*orphans, live):
        path.write_bytes(b"half a rec")
    with RunStore(mine["run"]):
        pass
    assert not any(p.exists() for p in orphans) and live.exists()


def test_validate_stages_writes_demonstrations_through_the_run_directory_writer_and_refuses_a_planted_link(tmp_path):
    from robocasa_shift.checks.validation import validate_stages
    from robocasa_shift.core.demos import load_demo
    from robocasa_shift.engine.demo_recorder import record_demo
    from robocasa_shift.errors import RunDirError
    from robocasa_shift.rundir.files import confined
    from robocasa_shift.backends import get_backend
    from robocasa_shift.core import specs
    from robocasa_shift.policies import make_policy

    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    outside.mkdir()
    (run / "demos").symlink_to(outside, target_is_directory=True)
    with pytest.raises(RunDirError, match="symbolic link"):
        validate_stages(run, ["Reach"], backend="fake", n_demos=1)
    assert not list(outside.rglob("*"))
    env, key = get_backend("fake").make("Reach"), RolloutKey("validation", "Reach", 0, "clean")
    args = (env, make_policy("fake-expert"), key, specs.load_protocol(), specs.load_stage_spec("fake", "Reach"), "fake")
    with confined(run), pytest.raises(RunDirError, match="symbolic link"):
        record_demo(*args, run / "demos")  # inside confined(): the same writer, the same refusal
    assert not list(outside.rglob("*"))
    (run / "demos").unlink()
    record, path = record_demo(*args, run / "demos", root=run)
    demo = load_demo(path)
    assert demo["meta"]["steps"] == record.steps and len(demo["actions"]) == record.steps
    assert len(demo["states"]) == record.steps + 1 and not list(run.rglob("*.tmp"))
