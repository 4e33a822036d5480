"""The demo that `make run` shows: task handlers and a producer that keeps enqueuing."""
