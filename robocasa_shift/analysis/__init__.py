"""Measures, comparisons and reports over a table of records; importable without a simulator."""
