"""MuJoCo frames exactly as ``mjr_render`` draws them, drawing less: geoms that cannot show are left out.

On a software renderer a frame's cost is its triangles: a 128 px frame of the embedded scenes
spends nearly all of its time transforming the vertices of meshes (the mobile base alone has
110,000 triangles), most of which cover no pixel. Two kinds of geoms are left out of a frame,
for that frame only, each by a conservative test that can only keep a geom too many:

- **out of view**: its bounding box lies wholly outside one of the camera frustum's side planes,
  or behind the camera (:func:`geoms_outside_view`);
- **hidden**: a heavy mesh (at least ``HEAVY_FACES`` triangles) that was hidden in this camera's
  previous frame is left out, and the frame proves it: its bounding polytope (26 planes around its
  vertices, :class:`Slabs`) must be behind the frame's own depth, by ``DEPTH_MARGIN_M``, on every
  pixel ray that meets it. Every fragment the mesh would have drawn then
  loses the depth test to a fragment already there, whatever the drawing order, so leaving it out
  changed no pixel; a mesh that fails the proof is drawn and the frame drawn again. MuJoCo draws
  transparent geoms without writing depth, so the depth read back is the opaque scene's. A drawn
  heavy mesh that the same test finds behind the rest is left out of the next frame (one that
  showed after all, only after ``SHOWN_BACKOFF`` frames).

Neither holds where something off-screen or hidden casts a shadow or shows in a reflection:
render profiles with either never cull. tests/test_rendering.py compares culled and full frames
pixel for pixel over tasks, conditions, cameras, sizes and moving robots.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

PLANE_GEOM = 0  # mjtGeom.mjGEOM_PLANE: unbounded, never culled
MESH_GEOM = 7  # mjtGeom.mjGEOM_MESH
GEOM_OBJECT = 5  # mjtObj.mjOBJ_GEOM
# meshes worth proving hidden: a proof costs about 0.1 ms, a thousand triangles about as much to draw, and most
# meshes looked at are not hidden (measured: 5000 beat 1000 and 20000 on the robosuite and LIBERO scenes)
HEAVY_FACES = 5000
# how much nearer than a box's nearest corner the opaque scene must be (float depth resolves microns here)
DEPTH_MARGIN_M = 2e-3
DISCOVER_EVERY = 4
# a mesh that showed after all is not left out of that camera's next frames for this many (a redraw costs a frame)
SHOWN_BACKOFF = 16
# how much wider than the mesh its bounding polytope is: room for the rounding of the projection and rasterizer
INFLATE_M = 5e-3


def make_current(ctx) -> None:
    """Make a robosuite render context's GL context current, with desktop OpenGL as EGL's bound API.

    robosuite's EGL contexts call ``eglReleaseThread`` when one is created or freed, which leaves no
    context current and resets the thread's API to OpenGL ES: a later render of another live
    environment of the process (one whose context was made earlier) then draws into nothing and reads
    back garbage. Binding the API and the context before every render costs about 10 us. The render
    contexts garbage-collected since the last call are freed first (see :func:`defer_collected_frees`).
    """
    free_collected()
    _bind(ctx.gl_ctx)


def _bind(gl_ctx) -> None:
    if type(gl_ctx).__name__ == "EGLGLContext":
        from mujoco.egl import egl_ext as EGL

        EGL.eglBindAPI(EGL.EGL_OPENGL_API)
    gl_ctx.make_current()


def free(ctx) -> None:
    """Free a render context's GL objects in its own GL context (see :func:`defer_collected_frees`)."""
    _free_gl(ctx.con, ctx.gl_ctx)
    ctx.robocasa_shift_freed = True  # its garbage collection finds nothing left to free


def _free_gl(con, gl_ctx) -> None:
    _bind(gl_ctx)
    con.free()
    gl_ctx.free()  # leaves no GL context current: make_current binds the next one


# (MjrContext, GL context) of the render contexts garbage-collected and not yet freed (see defer_collected_frees)
_COLLECTED: List[Tuple[Any, Any]] = []


def defer_collected_frees() -> None:
    """Make a garbage-collected robosuite render context free its GL objects in its own GL context (idempotent).

    robosuite's ``MjRenderContext.__del__`` frees its textures, meshes and framebuffers in whatever GL
    context is current when the garbage collector gets to it: another render context's, whose objects
    carry the same numbers (each GL context numbers its own from 1), so that context drew its next
    frames with those objects gone. Kitchens drop a simulator and its render context (a reference
    cycle) at every reset, so which frames changed depended on when the collector ran. Here ``__del__``
    only hands the context's GL objects over, touching no GL state (it may run inside a render, or on
    another thread); :func:`free_collected` frees them, each in its own context, before the next bind.
    """
    from robosuite.utils.binding_utils import MjRenderContext

    if getattr(MjRenderContext.__del__, "robocasa_shift_deferred", False):
        return

    def collected(ctx) -> None:
        con, gl_ctx = getattr(ctx, "con", None), getattr(ctx, "gl_ctx", None)
        if con is not None and gl_ctx is not None and not getattr(ctx, "robocasa_shift_freed", False):
            _COLLECTED.append((con, gl_ctx))

    collected.robocasa_shift_deferred = True
    MjRenderContext.__del__ = collected


def free_collected() -> None:
    """Free the GL objects of the render contexts garbage-collected so far, each in its own GL context."""
    while _COLLECTED:
        _free_gl(*_COLLECTED.pop())


class CameraFrame:
    """A GL camera as ``mjr_render`` uses it, for a viewport of ``width`` x ``height`` pixels."""

    def __init__(self, gl_camera, width: int, height: int):
        self.near, self.far = gl_camera.frustum_near, gl_camera.frustum_far
        self.bottom, self.top = gl_camera.frustum_bottom, gl_camera.frustum_top
        half_width = gl_camera.frustum_width or 0.5 * width / height * (self.top - self.bottom)
        self.left, self.right = gl_camera.frustum_center - half_width, gl_camera.frustum_center + half_width
        self.width, self.height = width, height
        self.orthographic = bool(gl_camera.orthographic)
        self.pos = np.asarray(gl_camera.pos, dtype=float)
        forward, up = np.asarray(gl_camera.forward, dtype=float), np.asarray(gl_camera.up, dtype=float)
        side = np.array([forward[1] * up[2] - forward[2] * up[1], forward[2] * up[0] - forward[0] * up[2],
                         forward[0] * up[1] - forward[1] * up[0]])  # forward x up (np.cross costs 80 us)
        self.axes = np.stack([side, up, forward])  # rows: eye-space x (right), y (up), depth along the view

    def depth_from_buffer(self, depth: np.ndarray) -> np.ndarray:
        """Eye-space depth (m) of ``mjr_readPixels`` depth values (0 at the near plane, 1 at the far one)."""
        n, f = self.near, self.far
        return n * f / (f - depth.astype(np.float64) * (f - n))


# 13 directions (axes, face and body diagonals): their 26 planes bound a mesh far tighter than its box
KDOP_DIRECTIONS = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, -1, 0], [1, 0, 1], [1, 0, -1], [0, 1, 1],
                            [0, 1, -1], [1, 1, 1], [1, 1, -1], [1, -1, 1], [-1, 1, 1]], dtype=float)
KDOP_DIRECTIONS /= np.linalg.norm(KDOP_DIRECTIONS, axis=1, keepdims=True)


class Slabs:
    """A convex polytope around a mesh: between two planes along each of ``KDOP_DIRECTIONS`` (in the geom's frame),
    widened by ``INFLATE_M``, so that it holds the mesh with room to spare for rounding."""

    def __init__(self, vertices: np.ndarray, box: np.ndarray):
        proj = vertices @ KDOP_DIRECTIONS.T
        self.high, self.low = proj.max(axis=0) + INFLATE_M, proj.min(axis=0) - INFLATE_M
        signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=float)
        self.box_corners = box[:3] + signs * (box[3:] + INFLATE_M)  # a box holding the polytope (its outline)

    def hidden_behind(self, pos: np.ndarray, rot: np.ndarray, scene_depth: np.ndarray, camera: "CameraFrame") -> bool:
        """Whether the polytope, placed at ``pos`` with rotation ``rot``, is behind ``scene_depth`` (eye-space depth
        per pixel, bottom row first) by ``DEPTH_MARGIN_M`` on every pixel ray that meets it (through the pixel's
        centre, the only point a rasterizer samples without multisampling)."""
        corners = (pos + self.box_corners @ rot.T - camera.pos) @ camera.axes.T  # right, up, depth
        if corners[:, 2].min() <= camera.near:  # reaching the near plane, it projects unboundedly: never hidden
            return False
        # the pixels the outline box can cover (x right, y up from the bottom row; pixel (i, j) centred at j+.5, i+.5)
        x = (corners[:, 0] * camera.near / corners[:, 2] - camera.left) / (camera.right - camera.left) * camera.width
        y = (corners[:, 1] * camera.near / corners[:, 2] - camera.bottom) / (camera.top - camera.bottom) * camera.height
        c0, c1 = max(int(np.floor(x.min())), 0), min(int(np.ceil(x.max())) + 1, camera.width)
        r0, r1 = max(int(np.floor(y.min())), 0), min(int(np.ceil(y.max())) + 1, camera.height)
        if c0 >= c1 or r0 >= r1:
            return True  # off the image: it covers no pixel
        region = scene_depth[r0:r1, c0:c1]
        if (region < corners[:, 2].min() - DEPTH_MARGIN_M).all():
            return True  # everything there is nearer than its nearest corner
        # each pixel's ray eye + z * (xn * right + yn * up + forward) reaches depth z; the polytope is where
        # a . point <= b for all its planes: the ray enters it at the largest lower bound on z, leaves at the least upper
        xn = camera.left + (np.arange(c0, c1) + 0.5) / camera.width * (camera.right - camera.left)
        yn = camera.bottom + (np.arange(r0, r1) + 0.5) / camera.height * (camera.top - camera.bottom)
        normals = np.vstack([KDOP_DIRECTIONS, -KDOP_DIRECTIONS]) @ rot.T  # world
        offsets = np.concatenate([self.high, -self.low]) + normals @ pos - normals @ camera.pos  # b - a . eye
        side, up, forward = camera.axes
        along = (normals @ side)[:, None, None] * xn[None, None, :] / camera.near \
            + (normals @ up)[:, None, None] * yn[None, :, None] / camera.near + (normals @ forward)[:, None, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            bound = offsets[:, None, None] / along
        # (a ray parallel to a plane bounds nothing here: treating it as meeting the polytope only asks for more)
        enter = np.maximum(np.max(bound, axis=0, where=along < 0, initial=-np.inf), camera.near)
        leave = np.min(bound, axis=0, where=along > 0, initial=np.inf)
        meets = enter <= leave
        return bool((region[meets] < enter[meets] - DEPTH_MARGIN_M).all())


def geoms_outside_view(model, data, camera: CameraFrame) -> Optional[np.ndarray]:
    """Which geoms lie wholly outside the camera's view: a boolean mask, or None where this test does not apply.

    Each geom's bounding box (``geom_aabb``, in its own frame) is tested against the four side planes
    through the eye and the camera's own plane, with a margin. Planes (unbounded) are never culled,
    nor is anything under an orthographic camera.
    """
    if camera.orthographic:
        return None
    side, up, forward = camera.axes
    n = camera.near
    # inward normals of the planes through the eye: a point p (from the eye) is in view if n . p >= 0 for each
    normals = np.array([n * side - camera.left * forward, camera.right * forward - n * side,
                        n * up - camera.bottom * forward, camera.top * forward - n * up, forward])
    normals /= np.linalg.norm(normals, axis=1, keepdims=True)
    rot = data.geom_xmat.reshape(-1, 3, 3)  # world = rot @ local, per geom
    box = model.geom_aabb  # centre, then half-sizes, in the geom's frame
    centre = data.geom_xpos + (rot * box[:, None, :3]).sum(axis=2) - camera.pos
    # the box's reach along each normal: the sum over its axes of |n . axis| x half-size (one matrix product for all)
    along_axes = (normals @ rot.transpose(1, 0, 2).reshape(3, -1)).reshape(len(normals), -1, 3)
    reach = (np.abs(along_axes) * box[None, :, 3:]).sum(axis=2).T
    margin = 1e-3 + 1e-2 * reach
    outside = (centre @ normals.T + reach + margin < 0).any(axis=1)
    return outside & (model.geom_type != PLANE_GEOM)


class CulledRenderer:
    """Renders the cameras of a robosuite render context, leaving out the geoms that cannot show (module docstring)."""

    def __init__(self, ctx, model, data):
        import mujoco

        self.ctx, self.model, self.data, self._mj = ctx, model, data, mujoco
        shown = np.asarray(ctx.vopt.geomgroup)
        # a geom group the scene does not show: left-out geoms go there for one render
        self.hidden_group = int(np.flatnonzero(shown == 0)[-1]) if not shown.all() else None
        faces = np.zeros(model.ngeom, dtype=np.int64)
        meshes = model.geom_type == MESH_GEOM
        faces[meshes] = model.mesh_facenum[model.geom_dataid[meshes]]
        self.heavy = faces >= HEAVY_FACES
        self._slabs: Dict[int, Slabs] = {}  # heavy geom -> its bounding polytope
        self._hidden: Dict[Tuple[int, int], np.ndarray] = {}  # (camera, size) -> heavy geoms its last frame hid
        self._frames: Dict[Tuple[int, int], int] = {}  # (camera, size) -> frames drawn
        self._shown_at: Dict[Tuple[int, int], Dict[int, int]] = {}  # (camera, size) -> {geom: frame it showed}
        self.left_out: Optional[np.ndarray] = None  # what the last frame left out (for tests and the bench)
        self.redraws = 0  # frames drawn again because a mesh left out was not hidden after all

    def render(self, camera_id: int, size: int, cull: bool) -> np.ndarray:
        """One RGB frame (uint8, size x size x 3, top row first)."""
        ctx, mj = self.ctx, self._mj
        make_current(ctx)
        self.left_out = None
        if not cull or self.hidden_group is None:
            self._draw(camera_id, size, None)
            return np.ascontiguousarray(ctx.read_pixels(size, size)[::-1])  # OpenGL reads bottom row first
        ctx.cam.type, ctx.cam.fixedcamid = mj.mjtCamera.mjCAMERA_FIXED, camera_id
        mj.mjv_updateScene(self.model, self.data, ctx.vopt, ctx.pert, ctx.cam, mj.mjtCatBit.mjCAT_ALL, ctx.scn)
        # a mono render sees from the average of the two stereo cameras (each is half the eye distance aside)
        camera = CameraFrame(mj.mjv_averageCamera(ctx.scn.camera[0], ctx.scn.camera[1]), size, size)
        outside = geoms_outside_view(self.model, self.data, camera)
        if outside is None:
            self._draw(camera_id, size, None)
            return np.ascontiguousarray(ctx.read_pixels(size, size)[::-1])
        in_view = np.flatnonzero(self.heavy & ~outside & self._shown())
        key = (camera_id, size)
        frame = self._frames[key] = self._frames.get(key, -1) + 1
        shown_at = self._shown_at.setdefault(key, {})
        hidden = np.intersect1d(self._hidden.get(key, in_view[:0]), in_view)
        while True:
            left_out = outside.copy()
            left_out[hidden] = True
            self._draw(camera_id, size, left_out if left_out.any() else None)
            rgb, depth = ctx.read_pixels(size, size, depth=True)
            scene_depth = camera.depth_from_buffer(depth)
            proven = np.array([self._hidden_behind(g, scene_depth, camera) for g in hidden], dtype=bool)
            if proven.all():
                break
            shown_at.update((int(g), frame) for g in hidden[~proven])
            hidden = hidden[proven]  # draw the unproven ones: the others stay proven (depth only comes nearer)
            self.redraws += 1
        # heavy meshes drawn in vain (behind everything else): left out of this camera's next frames (looked for
        # in every DISCOVER_EVERY-th frame of a camera: what hides what changes slowly, and looking costs)
        if frame % DISCOVER_EVERY == 0:
            drawn = [g for g in np.setdiff1d(in_view, hidden)
                     if frame - shown_at.get(int(g), -SHOWN_BACKOFF) >= SHOWN_BACKOFF]
            found = [g for g in drawn if self._hidden_behind(g, scene_depth, camera)]
            hidden = np.union1d(hidden, np.asarray(found, dtype=hidden.dtype))
        self._hidden[key] = hidden
        self.left_out = left_out
        return np.ascontiguousarray(rgb[::-1])

    def _hidden_behind(self, geom: int, scene_depth: np.ndarray, camera: CameraFrame) -> bool:
        if geom not in self._slabs:
            m = self.model
            mesh = m.geom_dataid[geom]
            vertices = m.mesh_vert[m.mesh_vertadr[mesh]:m.mesh_vertadr[mesh] + m.mesh_vertnum[mesh]]
            self._slabs[geom] = Slabs(np.asarray(vertices, dtype=float), m.geom_aabb[geom])
        rot = self.data.geom_xmat[geom].reshape(3, 3)
        return self._slabs[geom].hidden_behind(self.data.geom_xpos[geom], rot, scene_depth, camera)

    def _shown(self) -> np.ndarray:
        return np.asarray(self.ctx.vopt.geomgroup, dtype=bool)[self.model.geom_group]

    def _draw(self, camera_id: int, size: int, leave_out: Optional[np.ndarray]) -> None:
        """``mjr_render`` of the camera, the geoms of ``leave_out`` in the hidden group for the duration."""
        if leave_out is None:
            self.ctx.render(width=size, height=size, camera_id=camera_id)
            return
        groups = self.model.geom_group[leave_out]
        self.model.geom_group[leave_out] = self.hidden_group
        try:
            self.ctx.render(width=size, height=size, camera_id=camera_id)
        finally:
            self.model.geom_group[leave_out] = groups
