"""The ``vla-eval`` policy: a client of a vla-eval model server; ``wire`` (its protocol), ``client``."""
