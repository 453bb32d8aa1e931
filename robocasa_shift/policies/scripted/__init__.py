"""Policies written out by hand: the expert and its kitchen plans (``expert``, ``kitchen``, ``phases``), the
random negative control, ``replay`` of recorded demonstrations, and the testing backend's policies (``fake``)."""
