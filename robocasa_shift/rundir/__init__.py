"""The run directory: the store that reads and writes it, and the writer every file goes through."""
