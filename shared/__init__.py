"""What every tock process uses: settings, states, schema and SQL, the producer client,
the SQS adapter, errors and logging."""
