"""The report: an HTML page with figures and paired videos, built from a run directory."""
