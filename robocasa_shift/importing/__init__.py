"""Other harnesses' results read into run directories of this one (``robocasa-shift import-results``)."""
