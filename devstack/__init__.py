"""Throwaway local services for `make run`, the test suite and the benchmarks.

Nothing here is used in production: it starts a private Postgres cluster and a local
SQS server (LocalStack natively, or moto's server) on free loopback ports, and stops
and removes them afterwards.
"""
