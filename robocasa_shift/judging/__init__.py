"""Success judges under shift: a labelled judge benchmark exported from a run, judges, and their scores."""
