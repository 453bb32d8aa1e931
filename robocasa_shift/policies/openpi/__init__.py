"""The ``openpi`` policy: a client of an openpi websocket policy server, and a serving shim for it.

``wire`` (openpi's msgpack-numpy, read safely), ``client`` (``OpenpiPolicy``) and ``server`` (the serving
shim and its command line: ``python -m robocasa_shift.policies.openpi serve``).
"""
