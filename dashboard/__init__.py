"""tock's operator dashboard and HTTP API: `python -m dashboard`."""
