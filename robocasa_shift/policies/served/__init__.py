"""One base for every served policy: a protocol writes only its payload and its reply parsing.

``codec`` (msgpack from a peer, bounded before decoding), ``transport`` (connections with a total deadline),
``connection`` (credentials and identities), ``policy`` (the client side: seeding, state, samples,
chunk buffers), ``state`` (sealed session states) and ``serving`` (what the servers share).
"""
