"""What would close each gap, for the report's shortfall section: written from profiling
tock (see the report's "Where the time goes"), keyed by figure-key prefix."""

GAP_NOTES: dict[str, str] = {}
