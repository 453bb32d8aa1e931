"""A generated stand-in for RoboCasa's kitchen assets: primitive geometry under the names RoboCasa reads.

RoboCasa's kitchens need ~10 GB of meshes and textures that cannot be downloaded everywhere. This
module writes a *stand-in kit* instead: a directory that ``ROBOCASA_ASSETS_PATH`` can name, built
only from RoboCasa's installed package - its bundled layouts, styles, fixture registries and
procedural XML are copied, and every fixture the registries list and every object category of the
default registries (objaverse, lightwheel) is generated as boxes and cylinders, with the joints,
sites and regions RoboCasa's fixture classes look up, flat-colour textures, and sizes from the
registries (invented, and said so, where they have none). Nothing in it comes from an asset pack.

What the kit can show: that kitchens build, reset, step, pair, snapshot and perturb through the
harness exactly as they would with real assets (code paths, reproducibility, counters,
predicates, base placement). What it cannot: anything about RoboCasa's numbers - its images are
flat colours (policies trained on RoboCasa's renders are out of distribution), its physics uses
primitive shapes with invented masses and sizes.

Honesty: every file carries :data:`MARKER` (an XML or YAML comment, a PNG text chunk, an OBJ
comment) and the kit root holds :data:`MANIFEST` with the kit's format version, the RoboCasa
version it was generated from, each file's SHA-256 and the kit's content hash. The bytes are
deterministic: two builds from one RoboCasa version are identical, file for file.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import stat
import struct
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import yaml

from robocasa_shift.errors import BackendUnavailable
from robocasa_shift.rundir.files import UnsafeFile, atomic_write_bytes, atomic_write_text, inside, read_bytes

KIT_KIND = "standin"
# Bump when the generator's output changes: the version is part of every record made on a kit.
KIT_FORMAT_VERSION = 1
MANIFEST = "STANDIN-KIT.json"
MARKER = "robocasa-shift STAND-IN KIT: generated primitive geometry, not a RoboCasa asset"
BANNER = "STAND-IN KIT - not RoboCasa results"
# What the kit copies from RoboCasa's bundled assets (the rest of the bundle - download links, dataset
# metadata - is not read by environments).
BUNDLED = ("arenas", "scenes", "fixtures")
# Object registries the kitchens sample from by default (Kitchen.__init__: obj_registries).
OBJECT_REGISTRIES = ("objaverse", "lightwheel")
# Instances generated per object category: RoboCasa's "target" split takes the last
# n - max(n - 5, ceil(n / 2)) instances, so 4 gives 2 target instances (1 would give none).
INSTANCES_PER_CATEGORY = 4
# MJCFObject writes a transient copy of a model next to it while loading (<time>_<pid>.xml).
_TRANSIENT = re.compile(r"(^|/)\d+_\d+_\d+\.xml$")
# A kit is read as a shared directory is (it may come from someone else): its manifest and every file it lists
# are regular files inside the kit, reached without a link, read up to these caps (the kit: 2,857 files, a
# manifest of about 350 kB, no file over 1 MB).
MAX_MANIFEST_BYTES = 16 * 2**20
MAX_KIT_FILES = 100_000
MAX_KIT_FILE_BYTES = 64 * 2**20
_SHA256 = re.compile(r"[0-9a-f]{64}")


class KitError(BackendUnavailable):
    """A stand-in kit that is incomplete, altered, or not a kit at all."""


# ---------------------------------------------------------------------------- reading a kit


def kit_manifest(root: str | os.PathLike) -> Optional[Dict[str, Any]]:
    """The stand-in manifest at ``root``, checked, or None when ``root`` is not a stand-in kit.

    Raises:
        KitError: a manifest that is not a regular file inside ``root``, is over :data:`MAX_MANIFEST_BYTES`, is
            not JSON, or whose fields are not a kit's (a file name outside the kit, more than :data:`MAX_KIT_FILES`
            files, a hash that is not a SHA-256).
    """
    path = Path(root) / MANIFEST
    if not os.path.lexists(path):
        return None
    try:
        manifest = json.loads(read_bytes(path, root, MAX_MANIFEST_BYTES, "stand-in kit manifest").decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise KitError(f"{path} is not a readable stand-in kit manifest ({getattr(exc, 'strerror', None) or exc})") \
            from None
    if not isinstance(manifest, dict) or manifest.get("kind") != KIT_KIND:
        raise KitError(f"{path} does not describe a stand-in kit")
    files = manifest.get("files")
    problem = None
    if not isinstance(files, dict) or len(files) > MAX_KIT_FILES:
        problem = f"'files' is not a map of at most {MAX_KIT_FILES} file names to SHA-256 hashes"
    elif not (isinstance(manifest.get("sha256"), str) and _SHA256.fullmatch(manifest["sha256"])):
        problem = "'sha256' is not a SHA-256"
    elif type(manifest.get("version")) is not int or type(manifest.get("n_files")) is not int:
        problem = "'version' and 'n_files' are not integers"
    else:
        for rel, digest in files.items():
            try:
                inside(root, rel, "file")
            except UnsafeFile:
                problem = f"file name {str(rel)[:200]!r} is not a relative path inside the kit"
                break
            if rel == MANIFEST or not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
                problem = f"the entry of {rel[:200]!r} is not a file of the kit with its SHA-256"
                break
    if problem:
        raise KitError(f"{path}: {problem}; not a stand-in kit this project built (rebuild it with "
                       f"`robocasa-shift standin-kit build DIR`)")
    return manifest


def content_hash(files: Dict[str, str]) -> str:
    """The kit's content hash: SHA-256 over ``path sha256`` lines, sorted by path."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(f"{rel} {files[rel]}\n".encode())
    return h.hexdigest()


def verify_kit(root: str | os.PathLike) -> Dict[str, Any]:
    """Check every file the manifest lists against its SHA-256, and the content hash; return the manifest.

    Raises:
        KitError: no manifest, a missing or altered file, or a content hash that does not add up.
    """
    root = Path(root)
    manifest = kit_manifest(root)
    if manifest is None:
        raise KitError(f"{root} holds no {MANIFEST}: not a stand-in kit")
    files = manifest.get("files") or {}
    if content_hash(files) != manifest.get("sha256"):
        raise KitError(f"{root / MANIFEST}: its file list does not give its content hash {manifest.get('sha256')}")
    for rel, digest in sorted(files.items()):
        path = root / rel
        try:  # a regular file inside the kit, reached without a link, never blocking, capped
            data = read_bytes(path, root, MAX_KIT_FILE_BYTES, "stand-in kit file")
        except FileNotFoundError:
            raise KitError(f"stand-in kit {root} is incomplete: {rel} is missing; rebuild it with "
                           f"`robocasa-shift standin-kit build {root}`") from None
        except OSError as exc:
            raise KitError(f"stand-in kit {root}: {rel} cannot be read ({exc.strerror or exc}); rebuild it with "
                           f"`robocasa-shift standin-kit build {root}`") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise KitError(f"stand-in kit {root} was altered: {rel} differs from its manifest; rebuild it with "
                           f"`robocasa-shift standin-kit build {root}`")
    return manifest


def describe(manifest: Dict[str, Any]) -> Dict[str, Any]:
    """What records and manifests carry of a kit: kind, format version, RoboCasa version, content hash."""
    return {"kind": KIT_KIND, "version": manifest.get("version"), "robocasa_version": manifest.get("robocasa_version"),
            "sha256": manifest.get("sha256")}


# ---------------------------------------------------------------------------- writing files


def _f(x: float) -> str:
    """A number as MJCF text: fixed precision, no exponent, no trailing zeros (deterministic)."""
    text = f"{float(x):.6f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _v(values: Iterable[float]) -> str:
    return " ".join(_f(x) for x in values)


def _png(rgb: Tuple[int, int, int], size: int = 16) -> bytes:
    """A flat-colour RGB PNG carrying the marker in a text chunk (zlib level 9: the same bytes every build)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * size
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0))
            + chunk(b"tEXt", b"Comment\x00" + MARKER.encode()) + chunk(b"IDAT", zlib.compress(row * size, 9))
            + chunk(b"IEND", b""))


def _mark_png(data: bytes) -> bytes:
    """An existing PNG with the marker chunk inserted after its header (pixels untouched)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    ihdr_end = 8 + 8 + struct.unpack(">I", data[8:12])[0] + 4
    text = b"Comment\x00" + MARKER.encode()
    chunk = struct.pack(">I", len(text)) + b"tEXt" + text + struct.pack(">I", zlib.crc32(b"tEXt" + text) & 0xFFFFFFFF)
    return data[:ihdr_end] + chunk + data[ihdr_end:]


def _mark_text(rel: str, text: str) -> str:
    """A copied text file with the marker as a comment in its own syntax."""
    if rel.endswith(".xml"):
        if text.startswith("<?xml"):
            head, _, rest = text.partition("?>")
            return f"{head}?>\n<!-- {MARKER} -->{rest}"
        return f"<!-- {MARKER} -->\n{text}"
    if rel.endswith((".yaml", ".yml", ".obj", ".mtl")):
        return f"# {MARKER}\n{text}"
    raise ValueError(f"no comment syntax known for {rel}")


# Flat colours by what a texture's name says it is; anything else gets a muted colour from its name's hash.
_COLOURS = (
    ("dark_gray", (70, 70, 72)), ("light_gray", (190, 190, 192)), ("lighter_gray", (215, 215, 215)),
    ("white", (235, 234, 228)), ("black", (32, 32, 34)), ("gray", (128, 128, 130)), ("grey", (128, 128, 130)),
    ("dark_blue", (40, 55, 95)), ("blue", (70, 95, 150)), ("green", (90, 140, 95)), ("red", (150, 62, 50)),
    ("brick", (150, 70, 55)), ("dark_wood", (92, 62, 42)), ("walnut", (95, 65, 45)), ("wood", (152, 112, 74)),
    ("marble", (218, 216, 210)), ("metal", (172, 172, 178)), ("steel", (168, 170, 176)), ("brass", (181, 150, 80)),
    ("tile", (150, 148, 140)), ("concrete", (140, 138, 134)), ("ceramic", (240, 240, 240)),
)


def texture_colour(name: str) -> Tuple[int, int, int]:
    """The flat colour a texture of this name gets (deterministic)."""
    low = name.lower()
    for key, rgb in _COLOURS:
        if key in low:
            return rgb
    digest = hashlib.sha256(low.encode()).digest()
    return tuple(90 + digest[i] % 110 for i in range(3))  # type: ignore[return-value]


# ---------------------------------------------------------------------------- MJCF building blocks


def _geom(name: Optional[str], kind: str, pos: Sequence[float], size: Sequence[float], rgba: Sequence[float],
          group: int = 0, collide: bool = True, extra: str = "") -> str:
    """A geom; a colliding one (group 0, which robosuite does not render) comes with a visual twin (group 1)."""
    name_attr = f' name="{name}"' if name else ""
    contact = "" if collide else ' contype="0" conaffinity="0"'
    geom = (f'<geom{name_attr} type="{kind}" pos="{_v(pos)}" size="{_v(size)}" rgba="{_v(rgba)}" '
            f'group="{group}"{contact}{extra}/>')
    if group != 0:
        return geom
    twin = f' name="{name}_visual"' if name else ""
    return geom + (f'<geom{twin} type="{kind}" pos="{_v(pos)}" size="{_v(size)}" rgba="{_v(rgba)}" group="1" '
                   f'contype="0" conaffinity="0" mass="0"{extra}/>')


def _box(name, pos, half, rgba, **kw) -> str:
    return _geom(name, "box", pos, half, rgba, **kw)


def _region(name: str, pos: Sequence[float], half: Sequence[float]) -> str:
    """An interior or bounding region: RoboCasa reads its box; it neither collides nor shows."""
    return _box(f"reg_{name}", pos, half, (0.5, 0.5, 0.5, 0), group=1, collide=False)


def _site(name: str, pos: Sequence[float], size: Sequence[float] = (0.005,), rgba=(1, 0, 0, 0), kind: str = "sphere") -> str:
    return f'<site name="{name}" type="{kind}" pos="{_v(pos)}" size="{_v(size)}" rgba="{_v(rgba)}"/>'


def _hinge(name: str, axis: Sequence[float], rng: Sequence[float], pos=(0, 0, 0), damping: float = 1.0,
           extra: str = "") -> str:
    return (f'<joint name="{name}" type="hinge" pos="{_v(pos)}" axis="{_v(axis)}" range="{_v(rng)}" '
            f'limited="true" damping="{_f(damping)}"{extra}/>')


def _slide(name: str, axis: Sequence[float], rng: Sequence[float], damping: float = 5.0) -> str:
    return (f'<joint name="{name}" type="slide" axis="{_v(axis)}" range="{_v(rng)}" limited="true" '
            f'damping="{_f(damping)}"/>')


def _document(model: str, inner: Sequence[str], outer_sites: Sequence[str], assets: Sequence[str] = ()) -> str:
    """A RoboCasa/robosuite object file: ``<worldbody><body><body name="object">`` with the sites beside it."""
    lines = [f"<!-- {MARKER} -->", f'<mujoco model="{model}">', "  <asset>"]
    lines += [f"    {a}" for a in assets]
    lines += ["  </asset>", "  <worldbody>", "    <body>", '      <body name="object">']
    lines += [f"        {part}" for part in inner]
    lines += ["      </body>"]
    lines += [f"      {site}" for site in outer_sites]
    lines += ["    </body>", "  </worldbody>", "</mujoco>", ""]
    return "\n".join(lines)


def _bbox_sites(half: Sequence[float]) -> List[str]:
    w, d, h = half
    return [_site("bottom_site", (0, 0, -h)), _site("top_site", (0, 0, h)),
            _site("horizontal_radius_site", (w, d, 0))]


def _rgba(rgb: Tuple[int, int, int], alpha: float = 1.0) -> Tuple[float, ...]:
    return tuple(round(c / 255.0, 4) for c in rgb) + (alpha,)


# ---------------------------------------------------------------------------- fixtures

# Sizes (width, depth, height; metres) where a registry gives none: invented, typical of the appliance.
FIXTURE_SIZES: Dict[str, Tuple[float, float, float]] = {
    "sink": (0.62, 0.53, 0.26), "stove": (0.76, 0.66, 0.915), "stove_wide": (0.91, 0.66, 0.915),
    "stovetop": (0.76, 0.55, 0.06), "oven": (0.76, 0.62, 0.74), "microwave": (0.6, 0.4, 0.34),
    "fridge_french_door": (0.85, 0.8, 1.78), "fridge_side_by_side": (0.9, 0.8, 1.78),
    "fridge_bottom_freezer": (0.8, 0.78, 1.75), "dishwasher": (0.65, 0.6, 0.86), "coffee_machine": (0.26, 0.36, 0.35),
    "toaster": (0.28, 0.18, 0.19), "toaster_oven": (0.46, 0.38, 0.28), "blender": (0.17, 0.17, 0.4),
    "blender_lid": (0.12, 0.12, 0.04), "stand_mixer": (0.22, 0.36, 0.36), "electric_kettle": (0.2, 0.15, 0.24),
    "hood": (0.76, 0.5, 0.3), "dish_rack": (0.45, 0.33, 0.18), "stool": (0.4, 0.4, 1.0), "window": (0.9, 0.06, 0.9),
}
DEFAULT_ACCESSORY_SIZE = (0.14, 0.14, 0.22)


def _size_for(kind: str, entry_size: Optional[Sequence[Any]]) -> Tuple[float, float, float]:
    base = list(FIXTURE_SIZES.get(kind, DEFAULT_ACCESSORY_SIZE))
    for i, value in enumerate(entry_size or []):
        if isinstance(value, (int, float)) and value > 0:
            base[i] = float(value)
    return tuple(base)  # type: ignore[return-value]


def _shell(half, wall, rgba, open_side="front", names=("shell",)) -> List[str]:
    """A hollow box with one open side (front: -y), walls ``wall`` thick."""
    w, d, h = half
    t = wall
    parts = [
        _box(f"{names[0]}_back", (0, d - t / 2, 0), (w, t / 2, h), rgba),
        _box(f"{names[0]}_left", (-w + t / 2, 0, 0), (t / 2, d, h), rgba),
        _box(f"{names[0]}_right", (w - t / 2, 0, 0), (t / 2, d, h), rgba),
        _box(f"{names[0]}_top", (0, 0, h - t / 2), (w, d, t / 2), rgba),
        _box(f"{names[0]}_bottom", (0, 0, -h + t / 2), (w, d, t / 2), rgba),
    ]
    if open_side != "front":
        parts.append(_box(f"{names[0]}_front", (0, -d + t / 2, 0), (w, t / 2, h), rgba))
    return parts


def _door(body: str, joint: str, half, rgba, hinge_side: str = "left", axis_kind: str = "vertical",
          handle: bool = True, z_center: float = 0.0) -> str:
    """A door body over the open front (-y), hinged on a side (vertical axis) or at the bottom."""
    w, d, h = half
    th = 0.015
    h -= 0.004  # a gap to the next door or the shell: doors never touch at rest
    w -= 0.004
    if axis_kind == "vertical":
        sx = -1 if hinge_side == "left" else 1
        pos = (sx * w, -d - th - 0.003, z_center)
        axis = (0, 0, -sx)
        geom_pos = (-sx * w, 0, 0)
        handle_pos = (-sx * (2 * w - 0.05), -0.03, 0)
        handle_half = (0.01, 0.02, min(0.12, h * 0.6))
        rng = (0, 1.7)
    else:  # hinged at the bottom edge, opens down towards the robot
        pos = (0, -d - th - 0.003, -h)
        axis = (1, 0, 0)
        geom_pos = (0, 0, h)
        handle_pos = (0, -0.03, 2 * h - 0.05)
        handle_half = (min(0.2, w * 0.6), 0.02, 0.01)
        rng = (0, 1.5)
    parts = [_hinge(joint, axis, rng, damping=2.0), _box(f"{body}", geom_pos, (w, th, h), rgba)]
    if handle:
        parts.append(_box(f"{body}_handle", handle_pos, handle_half, (0.75, 0.75, 0.78, 1)))
    return f'<body name="{body}_body" pos="{_v(pos)}">' + "".join(parts) + "</body>"


def _fixture_sink(model: str, size, rgb) -> str:
    """A sink basin that fills the counter's opening, a faucet with a rotating spout and a lever handle on its rim.

    RoboCasa reads: ``handle_joint`` in a body under the object (water runs for 0.40 < q < pi; range 0-0.52 as
    on real sinks), ``spout_joint`` (left / center / right by angle), ``handle_temp_joint``, the ``water`` site in
    the spout's body (its radius and half-height set the stream), region ``reg_basin``.
    """
    w, d, h = (s / 2 for s in size)
    steel = (0.72, 0.73, 0.76, 1)
    t = 0.02
    deck = 0.1  # faucet deck behind the basin
    basin_d = d - deck / 2  # basin half-depth (y from -d to d - deck)
    bcy = -deck / 2
    parts = [
        _region("main", (0, 0, 0), (w, d, h)),
        _box("basin_floor", (0, bcy, -h + t / 2), (w, basin_d, t / 2), steel),
        _box("basin_front", (0, -d + t / 2, 0), (w, t / 2, h), steel),
        _box("basin_left", (-w + t / 2, bcy, 0), (t / 2, basin_d, h), steel),
        _box("basin_right", (w - t / 2, bcy, 0), (t / 2, basin_d, h), steel),
        _box("basin_back", (0, d - deck - t / 2, 0), (w, t / 2, h), steel),
        _box("deck", (0, d - deck / 2, h - 0.015), (w, deck / 2, 0.015), steel),
        _region("basin", (0, bcy, t / 2), (w - t - 0.01, basin_d - t - 0.01, h - t / 2 - 0.01)),
    ]
    column_h = 0.24
    cy = d - deck / 2
    parts.append(_geom("faucet_column", "cylinder", (0, cy, h + column_h / 2), (0.02, column_h / 2), steel))
    spout_len = min(0.24, d + basin_d - 0.08)
    spout = [
        _hinge("spout_joint", (0, 0, 1), (-1.57, 1.57), damping=1.5, extra=' frictionloss="0.3"'),
        _box("spout", (0, -spout_len / 2, 0), (0.018, spout_len / 2, 0.015), steel),
        _box("spout_tip", (0, -spout_len + 0.015, -0.03), (0.018, 0.015, 0.03), steel),
        _site("water", (0, -spout_len + 0.015, -0.06 - 0.16), (0.025, 0.16), rgba=(0.6, 0.8, 1.0, 0), kind="cylinder"),
    ]
    parts.append(f'<body name="spout_body" pos="{_v((0, cy, h + column_h + 0.015))}">' + "".join(spout) + "</body>")
    handle = [
        _hinge("handle_joint", (-1, 0, 0), (0, 0.52), damping=1.0, extra=' frictionloss="0.4"'),
        _hinge("handle_temp_joint", (0, 0, 1), (-0.6, 0.6), damping=1.0, extra=' frictionloss="0.4"'),
        _geom("handle", "capsule", (0, 0, 0.06), (0.012, 0.05), (0.85, 0.85, 0.88, 1)),
    ]
    # the lever stands on the sink's right rim near the front, within the robot's reach and clear of the spout's
    # swing; pushed away from the robot it runs the water
    parts.append(f'<body name="handle_body" pos="{_v((w - t / 2, -d + 0.12, h + 0.005))}">' + "".join(handle) + "</body>")
    return _document(model, parts, _bbox_sites((w, d, h)))


_STOVE_LOCS_STANDARD = ("rear_left", "rear_right", "front_left", "front_right")
_STOVE_LOCS_WIDE = ("rear_left", "rear_center", "rear_right", "front_left", "front_center", "front_right")


def _fixture_stove(model: str, size, rgb, wide: bool = False, top_only: bool = False) -> str:
    w, d, h = (s / 2 for s in size)
    body = _rgba(rgb)
    parts = [_region("main", (0, 0, 0), (w, d, h)), _box("body", (0, 0, 0), (w, d, h), body)]
    locs = _STOVE_LOCS_WIDE if wide else _STOVE_LOCS_STANDARD
    xs = {"left": -w * 0.55, "center": 0.0, "right": w * 0.55}
    for loc in locs:
        row, col = loc.split("_")
        y = d * (0.35 if row == "rear" else -0.35)
        parts.append(_site(f"burner_on_{loc}", (xs[col], y, h + 0.003), (0.09, 0.002), rgba=(1, 0.3, 0, 0),
                           kind="cylinder"))
        parts.append(_site(f"burner_{loc}_place_site", (xs[col], y, h + 0.01)))
        knob_pos = (xs[col] * 0.8 + (0.04 if row == "rear" else -0.04), -d - 0.02, h - 0.05) if not top_only else \
            (xs[col] * 0.8 + (0.04 if row == "rear" else -0.04), -d + 0.04, h + 0.015)
        knob_axis = (0, 1, 0) if not top_only else (0, 0, 1)
        knob = [_hinge(f"knob_{loc}_joint", knob_axis, (-6.2832, 6.2832), damping=0.5),
                _geom(f"knob_{loc}", "cylinder", (0, 0, 0), (0.018, 0.012), (0.2, 0.2, 0.2, 1),
                      extra=' euler="1.5708 0 0"' if not top_only else "")]
        parts.append(f'<body name="knob_{loc}_body" pos="{_v(knob_pos)}">' + "".join(knob) + "</body>")
    return _document(model, parts, _bbox_sites((w, d, h)))


def _fixture_appliance(model: str, size, rgb, kind: str) -> str:
    """A hollow appliance with a door and the joints, regions, buttons and sites its RoboCasa class reads."""
    w, d, h = (s / 2 for s in size)
    body = _rgba(rgb)
    wall = 0.02
    parts = [_region("main", (0, 0, 0), (w, d, h))]
    inner = (w - wall - 0.01, d - wall - 0.01, h - wall - 0.01)
    if kind == "microwave":
        parts += _shell((w, d, h), wall, body)
        parts.append(_door("door", "microjoint", (w, d, h), (0.15, 0.15, 0.17, 1), hinge_side="left"))
        parts.append(_region("tray", (0, 0, -h + wall + 0.06), (inner[0] * 0.8, inner[1] * 0.8, 0.05)))
        parts.append(_box("start_button", (w * 0.8, -d - 0.005, 0.05), (0.02, 0.005, 0.015), (0.1, 0.6, 0.1, 1)))
        parts.append(_box("stop_button", (w * 0.8, -d - 0.005, -0.02), (0.02, 0.005, 0.015), (0.6, 0.1, 0.1, 1)))
    elif kind.startswith("fridge"):
        parts += _shell((w, d, h), wall, body)
        split = -h + 2 * h * 0.32  # freezer below, fridge above
        parts.append(_box("divider", (0, 0, split), (w, d, wall / 2), body))
        parts.append(_door("fridge_door", "fridge_door_joint", (w, d, (h - split) / 2), body, z_center=(h + split) / 2))
        parts.append(_door("freezer_door", "freezer_door_joint", (w, d, (split + h) / 2), body,
                           z_center=(split - h) / 2))
        for i, frac in enumerate((0.02, 0.36, 0.68)):
            z0 = split + wall + frac * (h - split)
            parts.append(_box(f"fridge_shelf{i}", (0, 0, z0 - 0.006), (inner[0], inner[1], 0.006), (0.9, 0.9, 0.92, 1)))
            parts.append(_region(f"fridge_shelf{i}", (0, 0, z0 + 0.11), (inner[0], inner[1], 0.11)))
        parts.append(_region("freezer_shelf0", (0, 0, -h + wall + 0.12), (inner[0], inner[1], 0.11)))
    elif kind in ("oven", "toaster_oven", "dishwasher"):
        parts += _shell((w, d, h), wall, body)
        parts.append(_door("door", "door_joint", (w, d, h), (0.15, 0.15, 0.17, 1), axis_kind="bottom"))
        racks = ("rack0", "rack1") if kind != "toaster_oven" else ("rack0",)
        for i, rack in enumerate(racks):
            z = -h + wall + (0.15 + 0.45 * i) * (2 * h - 2 * wall)
            rack_parts = [_slide(f"{rack}_joint", (0, -1, 0), (0, 0.3)),
                          _box(f"{rack}_plate", (0, 0, 0), (inner[0], inner[1], 0.005), (0.6, 0.6, 0.62, 1)),
                          _region(rack, (0, 0, 0.07), (inner[0] * 0.9, inner[1] * 0.9, 0.06))]
            parts.append(f'<body name="{rack}_body" pos="{_v((0, 0, z))}">' + "".join(rack_parts) + "</body>")
        if kind == "oven":
            for knob in ("knob_time_joint", "knob_temp_joint"):
                x = w * (0.6 if "time" in knob else 0.8)
                kb = [_hinge(knob, (0, 1, 0), (0, 4.7), damping=0.5),
                      _geom(None, "cylinder", (0, 0, 0), (0.018, 0.012), (0.2, 0.2, 0.2, 1), extra=' euler="1.5708 0 0"')]
                parts.append(f'<body name="{knob[:-6]}_body" pos="{_v((x, -d - 0.03, h - 0.04))}">' + "".join(kb) + "</body>")
        if kind == "toaster_oven":
            for knob in ("knob_doneness_joint", "knob_function_joint", "knob_temp_joint", "knob_time_joint"):
                kb = [_hinge(knob, (0, 1, 0), (0, 4.7), damping=0.5),
                      _geom(None, "cylinder", (0, 0, 0), (0.015, 0.01), (0.2, 0.2, 0.2, 1), extra=' euler="1.5708 0 0"')]
                i = ("doneness", "function", "temp", "time").index(knob.split("_")[1])
                parts.append(f'<body name="{knob[:-6]}_body" pos="{_v((w * 0.85, -d - 0.03, h * (0.6 - 0.4 * i)))}">'
                             + "".join(kb) + "</body>")
    else:
        raise ValueError(kind)
    return _document(model, parts, _bbox_sites((w, d, h)))


def _fixture_solid(model: str, size, rgb, kind: str) -> str:
    """A solid box with whatever named parts its RoboCasa class looks up."""
    w, d, h = (s / 2 for s in size)
    body = _rgba(rgb)
    parts = [_region("main", (0, 0, 0), (w, d, h)), _box("body", (0, 0, 0), (w, d, h), body)]
    outer = _bbox_sites((w, d, h))
    if kind == "coffee_machine":
        # the body is an arch: the dispenser site sits in the gap under the spout
        parts = [_region("main", (0, 0, 0), (w, d, h)),
                 _box("body_back", (0, d * 0.4, 0), (w, d * 0.6, h), body),
                 _box("body_top", (0, -d * 0.6, h * 0.6), (w, d * 0.4, h * 0.4), body),
                 _box("body_base", (0, -d * 0.6, -h + 0.01), (w, d * 0.4, 0.01), body),
                 _box("start_button", (w * 0.5, -d - 0.004, h * 0.75), (0.015, 0.004, 0.015), (0.1, 0.6, 0.1, 1)),
                 _site("receptacle_place_site", (0, -d * 0.55, -h + 0.02)),
                 _site("coffee_liquid", (0, -d * 0.55, 0), (0.008, 0.1), rgba=(0.35, 0.2, 0.1, 0), kind="cylinder")]
    elif kind == "toaster":
        parts = [_region("main", (0, 0, 0), (w, d, h))]
        for side, x in (("slotL", -w * 0.5), ("slotR", w * 0.5)):
            # the slot region reaches above the toaster: bread stands out of a toaster's slot
            parts.append(_box(f"{side}_floor", (x, 0, h * 0.1), (w * 0.4, d * 0.8, 0.004), body))
            parts.append(_region(side, (x, 0, h * 0.1 + 0.085), (w * 0.12, d * 0.8, 0.08)))
        parts += [_box("wall_front", (0, -d + 0.01, 0), (w, 0.01, h), body),
                  _box("wall_back", (0, d - 0.01, 0), (w, 0.01, h), body),
                  _box("wall_left", (-w + 0.01, 0, 0), (0.01, d, h), body),
                  _box("wall_right", (w - 0.01, 0, 0), (0.01, d, h), body),
                  _box("wall_mid", (0, 0, 0), (0.01, d, h), body),
                  _box("floor", (0, 0, -h + 0.01), (w, d, 0.01), body)]
        lever = [_slide("lever_joint", (0, 0, -1), (0, h * 0.8)),
                 _box("lever", (0, 0, 0), (0.02, 0.015, 0.008), (0.2, 0.2, 0.2, 1))]
        parts.append(f'<body name="lever_body" pos="{_v((w - 0.03, -d - 0.015, h * 0.8))}">' + "".join(lever) + "</body>")
        btn = [_slide("button_cancel_joint", (0, 1, 0), (0, 0.005)),
               _box("button_cancel", (0, 0, 0), (0.01, 0.005, 0.008), (0.6, 0.1, 0.1, 1))]
        parts.append(f'<body name="button_body" pos="{_v((w - 0.03, -d - 0.006, -h * 0.3))}">' + "".join(btn) + "</body>")
        knob = [_hinge("knob_doneness_joint", (0, 1, 0), (0, 4.7), damping=0.3),
                _geom(None, "cylinder", (0, 0, 0), (0.012, 0.008), (0.2, 0.2, 0.2, 1), extra=' euler="1.5708 0 0"')]
        parts.append(f'<body name="knob_body" pos="{_v((w - 0.03, -d - 0.008, 0))}">' + "".join(knob) + "</body>")
    elif kind == "blender":
        parts.append(_box("power_button", (0, -d - 0.004, -h * 0.7), (0.015, 0.004, 0.01), (0.1, 0.6, 0.1, 1)))
        outer.append(_site("anchor_site", (0, 0, h)))
    elif kind == "stand_mixer":
        parts.append(_region("bowl", (0, -d * 0.3, -h * 0.3), (w * 0.6, d * 0.4, h * 0.3)))
        for joint in ("button_head_lock_joint", "bowl_joint", "knob_speed_joint", "head_joint"):
            jb = [_hinge(joint, (1, 0, 0), (0, 0.5), damping=1.0), _box(None, (0, 0, 0), (0.01, 0.01, 0.01), body)]
            parts.append(f'<body name="{joint[:-6]}_body" pos="{_v((w * 0.8, 0, h * 0.5))}">' + "".join(jb) + "</body>")
    elif kind == "electric_kettle":
        for joint, axis in (("lid_joint", (1, 0, 0)), ("switch_joint", (1, 0, 0)), ("button_lid_joint", (0, 0, 1))):
            jb = [_hinge(joint, axis, (0, 1.2), damping=1.0), _box(None, (0, 0, 0), (0.01, 0.01, 0.01), body)]
            parts.append(f'<body name="{joint[:-6]}_body" pos="{_v((0, 0, h))}">' + "".join(jb) + "</body>")
    elif kind == "dish_rack":
        parts = [_region("main", (0, 0, 0), (w, d, h)), _box("base", (0, 0, -h + 0.01), (w, d, 0.01), body),
                 _region("int_0", (0, 0, 0.01), (w * 0.8, d * 0.8, h - 0.02))]
    return _document(model, parts, outer)


def _panel(model: str, kind: str) -> str:
    """A cabinet door panel or handle: texture ``tex``, material ``mat``, region ``reg_main`` (scaled by RoboCasa)."""
    rel_tex = "TEX"  # replaced by the caller with a path relative to the model's folder
    if kind == "panel":
        half = (0.25, 0.01, 0.35)
        body = _box("door", (0, 0, 0), half, (1, 1, 1, 1), extra=' material="mat"')
    else:
        half = (0.008, 0.015, 0.06)
        body = _box("handle", (0, 0, 0), half, (1, 1, 1, 1), extra=' material="mat"')
    parts = [_region("main", (0, 0, 0), half), body]
    assets = [f'<texture name="tex" type="2d" file="{rel_tex}"/>', '<material name="mat" texture="tex"/>']
    return _document(model, parts, _bbox_sites(half), assets)


def _fixture_xml(kind: str, model: str, size, rgb) -> str:
    if kind == "sink":
        return _fixture_sink(model, size, rgb)
    if kind in ("stove", "stove_wide"):
        return _fixture_stove(model, size, rgb, wide=kind == "stove_wide")
    if kind == "stovetop":
        return _fixture_stove(model, size, rgb, top_only=True)
    if kind in ("microwave", "oven", "toaster_oven", "dishwasher") or kind.startswith("fridge"):
        return _fixture_appliance(model, size, rgb, kind)
    return _fixture_solid(model, size, rgb, kind)


# ---------------------------------------------------------------------------- objects

# Shapes and sizes (width, depth, height; metres) of object categories. Invented: RoboCasa gives each
# category only a scale for its meshes, so these are typical sizes, small enough for a Panda gripper
# where the task grasps the object. A model's size is this divided by the category's scale.
OBJECT_SHAPES: Dict[str, Tuple[str, Tuple[float, float, float]]] = {
    "lettuce": ("box", (0.05, 0.05, 0.07)), "colander": ("container", (0.2, 0.2, 0.07)),
    "plate": ("plate", (0.22, 0.22, 0.02)), "bowl": ("container", (0.15, 0.15, 0.065)),
    "pan": ("pan", (0.24, 0.24, 0.045)), "pot": ("container", (0.22, 0.22, 0.12)),
    "saucepan": ("pan", (0.18, 0.18, 0.08)), "sponge": ("box", (0.085, 0.055, 0.03)),
    "mug": ("cylinder", (0.08, 0.08, 0.095)), "cup": ("cylinder", (0.07, 0.07, 0.09)),
    "glass_cup": ("cylinder", (0.07, 0.07, 0.1)), "kettle_non_electric": ("cylinder", (0.17, 0.17, 0.19)),
    "tupperware": ("container", (0.16, 0.12, 0.07)), "cutting_board": ("box", (0.32, 0.22, 0.02)),
    "straw": ("box", (0.2, 0.01, 0.01)), "knife": ("box", (0.22, 0.025, 0.015)),
    "spatula": ("box", (0.28, 0.06, 0.015)), "bread": ("box", (0.12, 0.08, 0.06)),
    "tray": ("plate", (0.3, 0.22, 0.02)), "chicken_drumstick": ("box", (0.12, 0.05, 0.04)),
    "steak": ("box", (0.14, 0.09, 0.025)), "sandwich_bread": ("box", (0.11, 0.11, 0.015)),
}
_TYPE_SIZES = {"fruit": (0.07, 0.07, 0.07), "vegetable": (0.06, 0.06, 0.07), "meat": (0.11, 0.07, 0.03),
               "drink": (0.06, 0.06, 0.14), "condiment": (0.05, 0.05, 0.14), "bread_food": (0.11, 0.07, 0.06),
               "sweets": (0.07, 0.05, 0.04), "packaged_food": (0.1, 0.06, 0.12), "dairy": (0.07, 0.07, 0.12),
               "receptacle": (0.16, 0.16, 0.07), "tool": (0.18, 0.03, 0.02), "utensil": (0.18, 0.03, 0.02)}
_DEFAULT_OBJECT = ("box", (0.07, 0.07, 0.08))


def _object_shape(category: str, types: Sequence[str]) -> Tuple[str, Tuple[float, float, float]]:
    if category in OBJECT_SHAPES:
        return OBJECT_SHAPES[category]
    for t in types:
        if t in _TYPE_SIZES:
            return ("container" if t == "receptacle" else "box", _TYPE_SIZES[t])
    return _DEFAULT_OBJECT


def _object_xml(model: str, shape: str, size: Sequence[float], rgb) -> str:
    """A free object: its collision geoms (group 0, coloured), and ``reg_bbox`` (group 1) its bounding box."""
    w, d, h = (s / 2 for s in size)
    colour = _rgba(rgb)
    parts = [_region("bbox", (0, 0, 0), (w, d, h))]
    if shape == "box":
        parts.append(_box("body", (0, 0, 0), (w, d, h), colour))
    elif shape == "cylinder":
        parts.append(_geom("body", "cylinder", (0, 0, 0), (min(w, d), h), colour))
    elif shape == "plate":
        parts.append(_geom("body", "cylinder", (0, 0, 0), (min(w, d), h), colour))
    elif shape in ("container", "pan"):
        t = max(0.004, min(w, d) * 0.06)
        r = min(w, d)
        if shape == "pan":
            r = r * 0.75  # the handle takes the rest of the bounding box
        parts.append(_geom("bottom", "cylinder", (0, 0, -h + t / 2), (r, t / 2), colour))
        n = 12
        for i in range(n):
            a = 2 * math.pi * i / n
            chord = r * math.tan(math.pi / n) + t / 2
            parts.append(_box(f"wall{i}", (r * math.cos(a), r * math.sin(a), 0), (t / 2, chord, h), colour,
                              extra=f' euler="0 0 {_f(a)}"'))
        if shape == "pan":
            hl = min(w, d) - r
            parts.append(_box("handle", (r + hl / 2, 0, h * 0.6), (hl / 2, 0.012, 0.008), (0.15, 0.15, 0.15, 1)))
    else:
        raise ValueError(shape)
    return _document(model, parts, _bbox_sites((w, d, h)), [f'<material name="{model}_mat" rgba="{_v(colour)}"/>'])


def _load_object_categories() -> Dict[str, Dict[str, Any]]:
    """RoboCasa's OBJ_CATEGORIES as written in its source (the package mutates its copy on import)."""
    import robocasa

    path = Path(robocasa.__file__).parent / "models" / "objects" / "kitchen_objects.py"
    spec = importlib.util.spec_from_file_location("_standin_kitchen_objects", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.OBJ_CATEGORIES


def _object_files(categories: Dict[str, Dict[str, Any]]) -> Dict[str, str]:
    """Relative path -> model XML for every category of the default registries, INSTANCES_PER_CATEGORY each."""
    out: Dict[str, str] = {}
    for name in sorted(categories):
        cat = categories[name]
        types = cat.get("types") or ()
        types = (types,) if isinstance(types, str) else tuple(types)
        for registry in OBJECT_REGISTRIES:
            reg = cat.get(registry)
            if reg is None:
                continue
            scale = reg.get("scale", 1.0)
            scales = (scale,) * 3 if isinstance(scale, (int, float)) else tuple(scale)
            folders = reg.get("model_folders") or [f"{registry}/{name}"]
            shape, target = _object_shape(name, types)
            for folder in folders:
                for i in range(INSTANCES_PER_CATEGORY):
                    grow = 1.0 + 0.08 * (i - 1.5) / 1.5  # instances differ a little in size (nested bowls)
                    size = tuple(t * grow / s for t, s in zip(target, scales))
                    model = f"{name}_standin{i}"
                    rgb = texture_colour(f"{name}{i}")
                    if reg.get("is_auxiliary_obj"):
                        rel = f"objects/{folder}/{name}_host{i}/{model}/model.xml"
                    else:
                        rel = f"objects/{folder}/{model}/model.xml"
                    kind = "box" if reg.get("is_auxiliary_obj") else shape
                    out[rel] = _object_xml(model, kind, size, rgb)
                    # tasks that stand an object up load model_upright.xml beside model.xml
                    upright = (size[2], size[1], size[0]) if size[0] > 2 * size[2] else size
                    out[rel.replace("model.xml", "model_upright.xml")] = _object_xml(model, kind, upright, rgb)
    return out


# ---------------------------------------------------------------------------- the kit


def package_assets() -> Path:
    """RoboCasa's bundled asset folder, whatever ROBOCASA_ASSETS_PATH says."""
    spec = importlib.util.find_spec("robocasa")
    if spec is None or not spec.origin:
        raise BackendUnavailable("robocasa is not installed here: the stand-in kit is generated from RoboCasa's "
                                 "installed package (run `make setup-robocasa` and use .venv-robocasa)")
    return Path(spec.origin).parent / "models" / "assets"


def _textures_referenced(package: Path) -> List[str]:
    """Every ``textures/...png`` RoboCasa's package names (registries, styles, procedural XML, code)."""
    found = set()
    for path in sorted(package.parent.parent.rglob("*")):
        if path.suffix in (".py", ".yaml", ".xml") and path.is_file():
            found.update(re.findall(r"textures/[A-Za-z0-9_/.\-]+?\.png", path.read_text(errors="replace")))
    return sorted(found)


def _registry_fixtures(package: Path) -> Dict[str, Tuple[str, Any]]:
    """Model path (``.../model.xml``) -> (registry kind, size) for every ``xml`` entry of every fixture registry."""
    out: Dict[str, Tuple[str, Any]] = {}
    for path in sorted((package / "fixtures" / "fixture_registry").glob("*.yaml")):
        entries = yaml.safe_load(path.read_text()) or {}
        default = entries.get("default") or {}
        for key in sorted(entries):
            entry = entries[key] or {}
            if not isinstance(entry, dict) or "xml" not in entry:
                continue
            xml = entry["xml"]
            rel = xml if xml.endswith(".xml") else f"{xml}/model.xml"
            if (package / rel).exists():
                continue  # bundled (outlets, light switches): copied as they are
            out.setdefault(rel, (path.stem, entry.get("size", default.get("size"))))
    return out


def _panel_and_handle_paths() -> Dict[str, str]:
    """Model path -> "panel" or "handle" for the visual-mesh door panels and handles RoboCasa's code names."""
    from robocasa.models.fixtures import cabinet_panels, cabinets

    out = {rel: "panel" for rel in cabinets.VISUAL_MESH_PANEL_PATH_REG.values()}
    for reg in (cabinet_panels.VISUAL_MESH_ELONGATED_HANDLE_REG, cabinet_panels.VISUAL_MESH_KNOB_HANDLE_REG):
        out.update({rel: "handle" for rel in reg.values()})
    return out


def generate() -> Dict[str, bytes]:
    """Every file of the kit (relative path -> bytes), the manifest excepted.

    Raises:
        BackendUnavailable: RoboCasa's code is not installed (the kit is generated from it).
    """
    if importlib.util.find_spec("robocasa") is None:  # the kit is generated from RoboCasa's own package
        raise BackendUnavailable(f"the stand-in kit is generated from RoboCasa's code, which is not installed in "
                                 f"{sys.executable}: run `make setup-robocasa`, then `.venv-robocasa/bin/robocasa-shift "
                                 f"standin-kit build DIR`")
    import robocasa

    package = package_assets()
    files: Dict[str, bytes] = {}
    for top in BUNDLED:
        for path in sorted((package / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(package).as_posix()
            data = path.read_bytes()
            files[rel] = _mark_png(data) if rel.endswith(".png") else _mark_text(rel, data.decode()).encode()
    for rel in _textures_referenced(package):
        files[rel] = _png(texture_colour(rel))
    for rel, (kind, size) in _registry_fixtures(package).items():
        model = Path(rel).parent.name
        size = _size_for(kind, size)
        text = _fixture_xml(kind, model, size, texture_colour(model))
        if rel.startswith("objects/"):
            # a fixture kept among the objects (glass cups, stools, dish racks) is also sampled as an object of its
            # category, which reads its bounding box from reg_bbox
            half = tuple(x / 2 for x in size)
            text = text.replace('<body name="object">', '<body name="object">\n        ' + _region("bbox", (0, 0, 0), half), 1)
        files[rel] = text.encode()
    for rel, kind in _panel_and_handle_paths().items():
        text = _panel(Path(rel).parent.name, kind)
        tex = os.path.relpath("textures/flat/gray.png", Path(rel).parent.as_posix())
        files[rel] = text.replace('file="TEX"', f'file="{tex}"').encode()
    files.setdefault("textures/flat/gray.png", _png(texture_colour("textures/flat/gray.png")))
    for rel, text in _object_files(_load_object_categories()).items():
        files[rel] = text.encode()
    del robocasa
    return files


def _robocasa_version() -> str:
    import robocasa

    return getattr(robocasa, "__version__", "unknown")


def build_kit(out_dir: str | os.PathLike) -> Dict[str, Any]:
    """Write a stand-in kit into ``out_dir`` (replacing another kit there; an identical one is left as it is);
    return its manifest.

    Raises:
        KitError: ``out_dir`` exists, is not empty and is not a stand-in kit (nothing is overwritten).
        BackendUnavailable: RoboCasa's code is not installed (the kit is generated from it).
    """
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and kit_manifest(out) is None:
        raise KitError(f"{out} exists and is not a stand-in kit; choose an empty or new directory")
    files = generate()
    digests = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
    manifest = {
        "kind": KIT_KIND,
        "marker": MARKER,
        "version": KIT_FORMAT_VERSION,
        "robocasa_version": _robocasa_version(),
        "generated_from": "the installed robocasa package: its bundled layouts, styles, fixture registries and "
                          "procedural XML (copied, marked); fixtures and objects generated as primitive shapes",
        "what_it_shows": "code paths, reproducibility, pairing, snapshots, counters, predicates, perturbation hooks "
                         "and base placement of RoboCasa's kitchens; NOT RoboCasa's success rates or images",
        "n_files": len(files),
        "sha256": content_hash(digests),
        "files": dict(sorted(digests.items())),
    }
    try:
        existing = verify_kit(out)
        if existing["sha256"] == manifest["sha256"]:
            return existing  # already this kit, byte for byte: left as it is (processes may be reading it)
    except KitError:
        pass
    old_files = _replaceable(out)  # before anything is written: a folder with other content is refused
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        # the confined writer: a path with ".." or an absolute one (from a registry) is refused, never followed out
        for rel in sorted(files):
            atomic_write_bytes(staging / rel, files[rel], root=staging)
        atomic_write_text(staging / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n", root=staging)
        retired = None
        if os.path.lexists(out):  # swapped, never deleted whole: the old kit moves aside, the new one in
            retired = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.rename(out, retired)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if retired is not None:
        _remove_listed(retired, old_files)
    return manifest


def _replaceable(out: Path) -> List[str]:
    """The files of the kit at ``out`` that a rebuild may delete; [] when ``out`` is absent or empty.

    A file is the kit's when its manifest lists it (or it is MuJoCo's transient copy of a model) and it is a
    regular file that still has its listed SHA-256 or carries :data:`MARKER`: a manifest planted in a folder
    cannot make a rebuild delete the files beside it.

    Raises:
        KitError: ``out`` holds anything else - another file, a link, a FIFO, a folder no listed file is in -
            or is not a kit at all. Nothing is deleted then.
    """
    if not os.path.lexists(out):
        return []
    if out.is_symlink() or not out.is_dir():
        raise KitError(f"{out} is not a folder; choose an empty or new directory")
    if not any(out.iterdir()):
        return []
    manifest = kit_manifest(out)
    if manifest is None:
        raise KitError(f"{out} exists and is not a stand-in kit; choose an empty or new directory")
    listed = manifest["files"]
    folders = {parent.as_posix() for rel in listed for parent in Path(rel).parents}
    found: List[str] = []
    for here, dirs, names in os.walk(out, followlinks=False):
        for name in dirs + names:
            path = Path(here) / name
            rel = path.relative_to(out).as_posix()
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode) and rel in folders:
                continue
            ours = rel == MANIFEST
            if not ours and stat.S_ISREG(mode) and (rel in listed or _TRANSIENT.search(rel)):
                try:
                    data = read_bytes(path, out, MAX_KIT_FILE_BYTES, "stand-in kit file")
                except OSError:
                    data = b""
                ours = hashlib.sha256(data).hexdigest() == listed.get(rel) or MARKER.encode() in data
            if not ours:
                raise KitError(f"{out} holds {rel[:200]}, which is not a file of its kit (listed in its manifest, "
                               f"with its hash or the kit's marker): nothing was replaced; move it out of the kit, or "
                               f"build into an empty or new directory")
            found.append(rel)
            if len(found) > MAX_KIT_FILES + 1:
                raise KitError(f"{out} holds more than {MAX_KIT_FILES} files: not a stand-in kit")
    return found


def _remove_listed(folder: Path, files: Iterable[str]) -> None:
    """Delete the regular files ``files`` below ``folder`` (never through a link), then the folders they leave
    empty: nothing else is ever deleted."""
    files = set(files)
    walked = list(os.walk(folder, followlinks=False))
    for here, _, names in walked:
        for name in names:
            path = Path(here) / name
            with contextlib.suppress(OSError):
                if path.relative_to(folder).as_posix() in files and stat.S_ISREG(os.lstat(path).st_mode):
                    os.unlink(path)
    for here, _, _ in reversed(walked):  # deepest folders first
        with contextlib.suppress(OSError):
            os.rmdir(here)


__all__ = ["BANNER", "KIT_FORMAT_VERSION", "KIT_KIND", "KitError", "MANIFEST", "MARKER", "build_kit", "content_hash",
           "describe", "generate", "kit_manifest", "package_assets", "texture_colour", "verify_kit"]
