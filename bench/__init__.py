"""tock's benchmarks: `python -m bench --profile quick|full` (`make bench`, `make bench-full`).

Every figure is measured next to a raw ceiling (bare Postgres statements, bare boto3 SQS
calls) on the same services in the same run, and reported as a ratio to it.
"""
