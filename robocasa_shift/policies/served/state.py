"""Session state on a policy server, sealed so that a blob only goes back where it may.

What the serving side of branching and sampling shares (the GR00T launcher
and the openpi serving shim; the client side is ``served.policy``):

- The state of a session is a handful of plain arrays (the generator's state:
  torch's CPU and CUDA byte states, numpy's MT19937 words, or a JAX key's
  data), packed as a JSON index and their bytes back to back. Only bool,
  integer and float dtypes are packed or unpacked; nothing is pickled.
- ``StateSealer.seal`` wraps them with a header (format, version, the server's
  id, the model's identity hash, the owner tag) and an HMAC-SHA256 tag under the
  server's state key. ``StateSealer.open`` refuses a blob that is too large
  (``MAX_STATE_BYTES``), not msgpack of the expected three fields, sealed by
  another server (another process, or a restarted one without a persistent key),
  altered, made for another model, or owned by another client; only then are its
  arrays decoded.
- The owner: a client sends ``owner_tag(secret)`` when it seeds a session
  (``secret``: the client's ``state_secret`` option, else its API token, else
  none), and only to the server. The server keeps the session's owner binding,
  ``StateSealer.owner_binding(tag)``: an HMAC under the server's own key. A blob
  carries the binding of the session it came from and is applied only to a session
  with the same binding. The binding is not a bearer value (a reset names the tag,
  and the server derives the binding from it: copying a blob's binding into a reset
  binds nothing) and cannot be ground offline from a shared run directory (it
  needs the server's key), so a short token does not leak through a snapshot.
  Clients without any secret share the empty tag: on a launcher without tokens
  they are one principal.
- The blob is deterministic (no time, no session id in it): the same state of
  the same server and model gives the same bytes, so trunk snapshots hash alike.

The server's key is random per process unless given (``--state-key-file``):
a restarted server then has another id and refuses the blobs of its previous
life, which is what "a server whose fingerprint changed is refused" means here.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import math
import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import numpy as np

from robocasa_shift.errors import StateRefused
from robocasa_shift.policies.model_io import NumpySessionRNG, TorchSessionRNG

FORMAT = "robocasa-shift session state"
VERSION = 1
# Bound on one sealed state blob, on the server and on the client: a session's generator states are a few
# kB (torch's CPU state is 5,056 bytes, a CUDA device's 16), so this only stops a peer from making the
# other side allocate or hash without limit.
MAX_STATE_BYTES = 1 << 20
MAX_STATE_ARRAYS = 64
# Bound on the draws one ``sample`` request may ask for (each is a model call).
MAX_SAMPLES = 64
# What a server offers, by name (GR00T: in ``ping``'s ``capabilities``; openpi shim: in its metadata).
SEEDED_RESET = "seeded_reset"
SESSION_STATE = "session_state"
SAMPLE = "sample"
# The session messages of this harness's websocket servers (its openpi serving shim): one key, its data.
SESSION_MESSAGES = {"reset": "__reset__", "get_state": "__get_state__", "set_state": "__set_state__",
                    "sample": "__sample__"}
ARRAY_KINDS = frozenset("biuf")
_OWNER_CONTEXT = b"robocasa-shift session-state owner\0"
_ID_CONTEXT = b"robocasa-shift session-state server id\0"
_TAG_CONTEXT = b"robocasa-shift session-state v1\0"
_BINDING_CONTEXT = b"robocasa-shift session-state owner binding\0"


def owner_tag(secret: Optional[str]) -> str:
    """The owner tag a client sends when it seeds a session: sha256 of its secret (the empty secret: anyone's)."""
    return hashlib.sha256(_OWNER_CONTEXT + (secret or "").encode("utf-8")).hexdigest()


def is_owner_tag(value: Any) -> bool:
    """A 64-character lowercase hex string."""
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


# =========================================================================== arrays


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def pack_state(arrays: Mapping[str, Any]) -> Tuple[list, bytes]:
    """Named numeric arrays as (index rows ``[name, dtype, shape, offset, nbytes]``, their bytes).

    Raises:
        StateRefused: a non-numeric array (object, string, structured) or too many arrays.
    """
    if len(arrays) > MAX_STATE_ARRAYS:
        raise StateRefused(f"{len(arrays)} state arrays; at most {MAX_STATE_ARRAYS}")
    index, chunks, offset = [], [], 0
    for name in sorted(arrays):
        value = np.asarray(arrays[name])
        if value.dtype.kind not in ARRAY_KINDS or value.dtype.fields is not None:
            raise StateRefused(f"state array {name!r} has dtype {value.dtype}; only bool, integer and float arrays")
        data = np.ascontiguousarray(value).tobytes()
        index.append([str(name), value.dtype.str, [int(n) for n in value.shape], offset, len(data)])
        chunks.append(data)
        offset += len(data)
    return index, b"".join(chunks)


def unpack_state(index: Any, data: bytes) -> Dict[str, np.ndarray]:
    """The inverse of :func:`pack_state`, checked row by row (numeric dtypes, exact sizes, inside ``data``).

    Raises:
        StateRefused: a malformed index.
    """
    if not isinstance(index, list) or len(index) > MAX_STATE_ARRAYS:
        raise StateRefused("the state's index is not a list of at most "
                           f"{MAX_STATE_ARRAYS} rows")
    out: Dict[str, np.ndarray] = {}
    for row in index:
        if not (isinstance(row, list) and len(row) == 5):
            raise StateRefused(f"state index row {str(row)[:80]} is not [name, dtype, shape, offset, nbytes]")
        name, dtype_str, shape, offset, nbytes = row
        if not (isinstance(name, str) and len(name) <= 200 and isinstance(dtype_str, str) and len(dtype_str) <= 8
                and isinstance(shape, list) and len(shape) <= 8 and all(_count(n) for n in shape)
                and _count(offset) and _count(nbytes)):
            raise StateRefused(f"state index row {str(row)[:80]}: a name, a dtype, a shape of counts, an offset, a size")
        try:
            dtype = np.dtype(dtype_str)
        except TypeError:
            raise StateRefused(f"state array {name[:80]!r}: unknown dtype {dtype_str!r}") from None
        if dtype.kind not in ARRAY_KINDS or dtype.fields is not None or dtype.subdtype is not None:
            raise StateRefused(f"state array {name[:80]!r}: dtype {dtype_str!r} refused (numeric arrays only)")
        count = math.prod(shape)
        if nbytes != count * dtype.itemsize or offset + nbytes > len(data) or name in out:
            raise StateRefused(f"state array {name[:80]!r}: {nbytes} bytes at {offset} for shape {shape} of "
                               f"{dtype_str} in {len(data)} bytes")
        out[name] = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape).copy()
    return out


# =========================================================================== sealing


def load_state_key(path: Union[str, Path, None]) -> Optional[bytes]:
    """A state key from a file (at least 32 bytes of its content, stripped), or None for no file.

    Raises:
        ValueError: a file with fewer than 32 bytes.
    """
    if path is None:
        return None
    key = Path(path).read_bytes().strip()
    if len(key) < 32:
        raise ValueError(f"{path}: a state key needs at least 32 bytes (e.g. `head -c 32 /dev/urandom | base64 > FILE`)")
    return key


class StateSealer:
    """Seals and opens session-state blobs with a server's key (random per process unless given)."""

    def __init__(self, key: Optional[bytes] = None):
        self._key = bytes(key) if key else os.urandom(32)
        self.server_id = hashlib.sha256(_ID_CONTEXT + self._key).hexdigest()[:32]

    def owner_binding(self, tag: str) -> str:
        """The owner binding of a session seeded with owner ``tag``: keyed by this server, so it can neither be
        ground back to the client's secret nor presented in place of the tag."""
        return hmac.new(self._key, _BINDING_CONTEXT + tag.encode("ascii"), hashlib.sha256).hexdigest()

    def bind(self, data: Mapping[str, Any], what: str) -> str:
        """The owner binding of the owner tag a reset's ``data`` names (none: the empty secret's tag, anyone's).

        Raises:
            ValueError: an ``owner`` that is not a 64-character hex owner tag (``what``: the reset's name).
        """
        owner = data.get("owner", owner_tag(None))
        if not is_owner_tag(owner):
            raise ValueError(f"{what}'s 'owner' must be a 64-character hex owner tag")
        return self.owner_binding(owner)

    def sealed(self, rng: Any, model: str, owner: str) -> Dict[str, Any]:
        """A ``get_state`` reply: the session generator's state sealed for ``model`` and ``owner``, and its identity."""
        return {"blob": self.seal(rng_arrays(rng), model, owner), "rng_fingerprint": rng.fingerprint(),
                "server_id": self.server_id, "model_sha256": model}

    def restored(self, rng: Any, blob: Any, model: str, owner: str) -> Any:
        """A new session generator of ``rng``'s kind holding the state of ``blob`` (checked by :meth:`open` first).

        Raises:
            StateRefused: as :meth:`open`, or a blob of another kind of generator.
        """
        restored = copy_rng(rng)
        restore_rng(restored, self.open(blob, model, owner))
        return restored

    def _tag(self, header: bytes, data: bytes) -> bytes:
        return hmac.new(self._key, _TAG_CONTEXT + len(header).to_bytes(8, "big") + header + data, hashlib.sha256).digest()

    def seal(self, arrays: Mapping[str, Any], model: str, owner: str) -> bytes:
        """The sealed blob of ``arrays`` for ``model`` and the session's owner binding ``owner``."""
        import msgpack

        index, data = pack_state(arrays)
        header = json.dumps({"format": FORMAT, "version": VERSION, "server": self.server_id, "model": model,
                             "owner": owner, "index": index}, sort_keys=True).encode("utf-8")
        blob = msgpack.packb({"header": header, "data": data, "tag": self._tag(header, data)}, use_bin_type=True)
        if len(blob) > MAX_STATE_BYTES:
            raise StateRefused(f"the session's state takes {len(blob):,} bytes, over the limit of {MAX_STATE_BYTES:,}")
        return blob

    def open(self, blob: Any, model: str, owner: str) -> Dict[str, np.ndarray]:
        """The arrays of a blob this server sealed for ``model`` and owner binding ``owner``; anything else is refused.

        Order: the size, the msgpack frame (plain types only), the header's claims (for a precise
        message), the HMAC tag (constant time), the model and the owner; only then the arrays.

        Raises:
            StateRefused: with the reason.
        """
        header, data, tag = read_blob(blob)
        claims = parse_header(header)
        if claims["server"] != self.server_id:
            raise StateRefused(f"the state was sealed by another server (id {claims['server'][:32]}); this one is "
                               f"{self.server_id}: it was recorded against another launcher, or this one restarted "
                               "without --state-key-file")
        if not hmac.compare_digest(tag, self._tag(header, data)):
            raise StateRefused("the state's seal does not match its content: it was altered")
        if claims["model"] != model:
            raise StateRefused(f"the state was recorded with another model (identity {claims['model'][:64]}); this "
                               f"server serves {model}")
        if not hmac.compare_digest(str(claims["owner"]).encode(), str(owner).encode()):
            raise StateRefused("the state belongs to another client (another state_secret or API token) and cannot "
                               "be applied to this session")
        return unpack_state(claims["index"], data)


def read_blob(blob: Any) -> Tuple[bytes, bytes, bytes]:
    """(header, data, tag) of a sealed blob, without checking the seal (the audit reads headers this way).

    Raises:
        StateRefused: too large, or not the msgpack frame ``{"header": bin, "data": bin, "tag": bin(32)}``.
    """
    import msgpack

    if isinstance(blob, (bytearray, memoryview)):
        blob = bytes(blob)
    if not isinstance(blob, bytes):
        raise StateRefused(f"a state blob must be bytes, got {type(blob).__name__}")
    if len(blob) > MAX_STATE_BYTES:
        raise StateRefused(f"a state blob of {len(blob):,} bytes exceeds the limit of {MAX_STATE_BYTES:,}")
    try:
        frame = msgpack.unpackb(blob, raw=False, strict_map_key=True, max_bin_len=MAX_STATE_BYTES,
                                max_str_len=1024, max_array_len=16, max_map_len=8, max_ext_len=0)
    except Exception as exc:
        raise StateRefused(f"not a state blob ({type(exc).__name__})") from None
    if not (isinstance(frame, dict) and set(frame) == {"header", "data", "tag"}
            and all(isinstance(frame[k], bytes) for k in frame) and len(frame["tag"]) == 32):
        raise StateRefused("not a state blob: expected header, data and a 32-byte tag")
    return frame["header"], frame["data"], frame["tag"]


def parse_header(header: bytes) -> Dict[str, Any]:
    """A blob header's fields, type-checked (format, version, server, model, owner, index).

    Raises:
        StateRefused: another format or version, or a malformed field.
    """
    try:
        claims = json.loads(header.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise StateRefused("the state's header is not JSON") from None
    if not isinstance(claims, dict) or claims.get("format") != FORMAT or claims.get("version") != VERSION:
        raise StateRefused(f"the state is not {FORMAT!r} version {VERSION}")
    if not (isinstance(claims.get("server"), str) and isinstance(claims.get("model"), str)
            and isinstance(claims.get("owner"), str) and isinstance(claims.get("index"), list)):
        raise StateRefused("the state's header lacks its server, model, owner or index")
    return claims


def describe_blob(blob: bytes) -> Dict[str, Any]:
    """What a blob's header claims (server, model, owner, array names), without its key: for audits."""
    header, data, _ = read_blob(blob)
    claims = parse_header(header)
    unpack_state(claims["index"], data)  # well-formed arrays
    return {"server": claims["server"], "model": claims["model"], "owner": claims["owner"],
            "arrays": sorted(row[0] for row in claims["index"])}


# =========================================================================== session generators


def sample_request(data: Any, what: str) -> Tuple[Any, int, Optional[int]]:
    """``(obs, n, seed)`` of a ``sample`` request's data: a dict observation, 1 <= n <= ``MAX_SAMPLES``, and a seed
    >= 0 or None (``what``: the request's name in messages).

    Raises:
        ValueError: any of these does not hold.
    """
    if not isinstance(data, dict) or not isinstance(data.get("obs"), dict):
        raise ValueError(f"{what} needs {{'obs': payload, 'n': 1..{MAX_SAMPLES}, 'seed': int or None}} as data")
    n, seed = data.get("n"), data.get("seed")
    if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_SAMPLES):
        raise ValueError(f"{what}'s n must be an integer in 1..{MAX_SAMPLES}")
    if seed is not None and not _count(seed):
        raise ValueError(f"{what}'s seed must be a non-negative integer or None")
    return data["obs"], n, seed



def rng_arrays(rng: Any) -> Dict[str, np.ndarray]:
    """A session generator's state as arrays (``TorchSessionRNG``, ``NumpySessionRNG``, or any generator with
    ``state_arrays()`` and ``load_state_arrays(arrays)``, such as the openpi shim's PRNG key holder)."""
    if hasattr(rng, "state_arrays"):
        return {str(k): np.array(v) for k, v in rng.state_arrays().items()}
    if isinstance(rng, TorchSessionRNG):
        out = {"torch.cpu": rng.cpu_state.numpy().copy()}
        out.update({f"torch.cuda.{d}": s.numpy().copy() for d, s in zip(rng.devices, rng.cuda_states)})
        return out
    if isinstance(rng, NumpySessionRNG):
        kind, keys, pos, has_gauss, cached = rng.state
        return {"numpy.keys": np.asarray(keys, dtype=np.uint32).copy(), "numpy.pos": np.array(pos, dtype=np.int64),
                "numpy.has_gauss": np.array(has_gauss, dtype=np.int64),
                "numpy.cached_gaussian": np.array(cached, dtype=np.float64)}
    raise StateRefused(f"no state arrays for a {type(rng).__name__}")


def restore_rng(rng: Any, arrays: Mapping[str, np.ndarray]) -> None:
    """Set a session generator from :func:`rng_arrays` of the same kind (names, dtypes and sizes checked).

    Raises:
        StateRefused: other names (another kind of generator, other CUDA devices) or other sizes.
    """
    current = rng_arrays(rng)
    if set(arrays) != set(current):
        raise StateRefused(f"the state holds generator arrays {sorted(arrays)}, this session has {sorted(current)} "
                           "(another device set or another kind of generator)")
    for name, value in current.items():
        given = np.asarray(arrays[name])
        if given.dtype != value.dtype or given.shape != value.shape:
            raise StateRefused(f"generator array {name!r}: {given.dtype} {given.shape}, expected {value.dtype} "
                               f"{value.shape}")
    if hasattr(rng, "load_state_arrays"):
        rng.load_state_arrays({k: np.array(v) for k, v in arrays.items()})
    elif isinstance(rng, TorchSessionRNG):
        torch = rng.torch
        rng.cpu_state = torch.from_numpy(np.array(arrays["torch.cpu"], dtype=np.uint8))
        rng.cuda_states = [torch.from_numpy(np.array(arrays[f"torch.cuda.{d}"], dtype=np.uint8)) for d in rng.devices]
    else:
        rng.state = ("MT19937", np.array(arrays["numpy.keys"], dtype=np.uint32), int(arrays["numpy.pos"]),
                     int(arrays["numpy.has_gauss"]), float(arrays["numpy.cached_gaussian"]))


def copy_rng(rng: Any) -> Any:
    """An independent copy of a session generator (drawing from it leaves ``rng`` as it was)."""
    clone = copy.copy(rng)
    restore_rng(clone, rng_arrays(rng))
    return clone


__all__ = ["FORMAT", "MAX_SAMPLES", "MAX_STATE_BYTES", "SAMPLE", "SEEDED_RESET", "SESSION_MESSAGES", "SESSION_STATE",
           "StateRefused", "StateSealer", "copy_rng", "describe_blob", "is_owner_tag", "load_state_key", "owner_tag",
           "pack_state", "parse_header", "read_blob", "restore_rng", "rng_arrays", "sample_request", "unpack_state"]
