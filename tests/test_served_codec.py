"""Every msgpack a peer sends is bounded before it is decoded: values, depth, bytes (policies.served.codec)."""

import resource
import time

import msgpack
import numpy as np
import pytest

from robocasa_shift.policies.gr00t.wire import packb as gr00t_packb
from robocasa_shift.policies.gr00t.wire import unpackb as gr00t_unpackb
from robocasa_shift.policies.openpi.wire import unpackb as openpi_unpackb
from robocasa_shift.policies.served.codec import MAX_DEPTH, MAX_VALUES, ReplyFormatError, prescan, unpackb
from robocasa_shift.policies.served.connection import content_hash
from robocasa_shift.policies.vla_eval.wire import unpack_message


def empty_lists(n_bytes: int) -> bytes:
    """A msgpack array of empty lists, ``n_bytes`` long: one byte per Python object built."""
    count = n_bytes - 5
    return b"\xdd" + count.to_bytes(4, "big") + b"\x90" * count


def nested(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"  # [[[...[None]...]]]


def test_the_prescan_counts_values_as_msgpack_decodes_them():
    for value in (None, 1, -5, 2**40, 1.5, "text", b"bytes", [1, [2, 3]], {"a": {"b": [1.0, None]}}, []):
        data = msgpack.packb(value, use_bin_type=True)
        assert unpackb(data, None) == msgpack.unpackb(data)
    assert prescan(msgpack.packb({"a": [1, 2]})) == 5  # the map, its key, the list, two items


def test_a_bomb_of_empty_lists_is_refused_in_milliseconds_without_building_it():
    bomb = empty_lists(16 * 2**20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    for decode in (lambda d: unpackb(d, 64 * 2**20), lambda d: openpi_unpackb(d, 64 * 2**20),
                   lambda d: gr00t_unpackb(d, 64 * 2**20), lambda d: unpack_message(d, 64 * 2**20)):
        with pytest.raises(ReplyFormatError, match="values refused"):
            decode(bomb)
    assert time.perf_counter() - start < 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # kB: nothing near 1.8 GB
    # values spread over many small containers count too
    spread = msgpack.packb([[None] * 10] * (MAX_VALUES // 10))
    with pytest.raises(ReplyFormatError, match="values refused"):
        prescan(spread)


def test_nesting_past_the_depth_bound_is_refused_and_just_under_it_decodes():
    assert unpackb(nested(MAX_DEPTH - 1), None) is not None
    for depth in (MAX_DEPTH + 1, 1000, 100_000):
        with pytest.raises(ReplyFormatError, match="deeper than"):
            unpackb(nested(depth), None)


def test_truncated_extra_and_unused_bytes_are_not_msgpack():
    data = msgpack.packb({"actions": [1.0, 2.0]})
    for bad in (data[:-1], data + b"\x00", b"\xc1", b"\xdb\xff\xff\xff\xff", b"\xc6\x00\x00\x10"):
        with pytest.raises(ReplyFormatError, match="not a msgpack message"):
            unpackb(bad, None)


def test_a_modality_config_nested_a_thousand_deep_is_refused_not_a_recursion_error():
    deep = "[" * 1000 + "]" * 1000
    message = msgpack.packb({"config": {"__ModalityConfig_class__": True, "as_json": deep}})
    with pytest.raises(ReplyFormatError, match="nested deeper|not JSON"):
        gr00t_unpackb(message)
    fine = gr00t_unpackb(msgpack.packb({"c": {"__ModalityConfig_class__": True, "as_json": '{"a": [1]}'}}))
    assert content_hash(fine) == content_hash({"c": {"a": [1]}})


def test_an_npy_array_declaring_more_than_its_bytes_is_refused_before_numpy_allocates():
    message = gr00t_packb({"x": np.zeros((4, 3))})
    raw = msgpack.unpackb(message)
    npy = raw["x"]["as_npy"]
    forged = npy.replace(b"(4, 3)", b"(4000000000, 3)")
    raw["x"]["as_npy"] = forged
    with pytest.raises(ReplyFormatError, match="whose data has"):
        gr00t_unpackb(msgpack.packb(raw))
    assert np.array_equal(gr00t_unpackb(message)["x"], np.zeros((4, 3)))
