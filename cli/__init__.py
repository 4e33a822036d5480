"""The `tock` command line."""
