"""Raw SQS ceilings against the run's own LocalStack: bare boto3 SendMessageBatch, and a
bare ReceiveMessage + DeleteMessageBatch cycle, each with one caller and with several in
parallel (tock's timer sends 8 batches at once; consumers run several receivers)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config

from bench.profiles import Profile
from bench.progress import Progress
from bench.results import Results
from bench.stats import rate
from shared.runtime.settings import TimerSettings

SEND_PARALLEL: int = TimerSettings.model_fields["send_concurrency"].default
"""Matches the timer's default send_concurrency."""
CYCLE_PARALLEL = 4
# A body the size of tock's message: {"v":1,"job":N,"token":UUID,"kind":"bench.noop"}.
BODY = '{"v":1,"job":123456,"token":"' + str(uuid.UUID(int=0)) + '","kind":"bench.noop"}'


def _client() -> Any:
    return boto3.client("sqs", config=Config(max_pool_connections=50,
                                             retries={"mode": "standard", "max_attempts": 3}))


def measure(queue_prefix: str, profile: Profile, results: Results, progress: Progress) -> None:
    """Record the raw SQS ceilings in `results` (group `raw-sqs`)."""
    client = _client()
    url = client.create_queue(QueueName=f"{queue_prefix}raw",
                              Attributes={"VisibilityTimeout": "60"})["QueueUrl"]
    send_rates = {}
    for threads in (1, SEND_PARALLEL):
        send_rates[threads] = _parallel(threads, profile.raw_seconds, lambda c: _send(c, url))
        results.raw(f"raw.sqs.send_t{threads}", "raw-sqs",
                    f"bare SendMessageBatch (10 per call), {threads} caller(s)",
                    send_rates[threads], "msgs/s")
        progress.say(f"  bare SendMessageBatch x{threads}: {send_rates[threads]:,.0f} msgs/s")
    results.raw("raw.sqs.send", "raw-sqs", "bare SendMessageBatch ceiling (best of the above)",
                max(send_rates.values()), "msgs/s")
    cycle_rates = {}
    for threads in (1, CYCLE_PARALLEL):
        cycle_rates[threads] = _parallel(threads, profile.raw_seconds,
                                         lambda c: _cycle(c, url))
        results.raw(f"raw.sqs.cycle_t{threads}", "raw-sqs",
                    f"bare Receive + DeleteMessageBatch cycle, {threads} caller(s)",
                    cycle_rates[threads], "msgs/s")
        progress.say(f"  bare receive+delete x{threads}: {cycle_rates[threads]:,.0f} msgs/s")
    results.raw("raw.sqs.cycle", "raw-sqs", "bare Receive + Delete cycle ceiling (best)",
                max(cycle_rates.values()), "msgs/s")
    # Per message, the whole path costs a send and a receive+delete: the SQS-only ceiling of
    # a pipeline that does both on the same server.
    path = 1.0 / (1.0 / max(send_rates.values()) + 1.0 / max(cycle_rates.values()))
    results.raw("raw.sqs.path", "raw-sqs", "bare send + receive + delete per message",
                path, "msgs/s", note="1 / (1/send + 1/cycle)")
    client.delete_queue(QueueUrl=url)


def _send(client: Any, url: str) -> int:
    client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "MessageBody": BODY} for i in range(10)])
    return 10


def _cycle(client: Any, url: str) -> int:
    got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                 VisibilityTimeout=60).get("Messages", [])
    if not got:
        return -1  # drained: stop this caller
    client.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)])
    return len(got)


def _parallel(threads: int, seconds: float, step: Callable[[Any], int]) -> float:
    """Run `step` in `threads` callers (one boto3 client each) for `seconds`; messages/s."""
    clients = [_client() for _ in range(threads)]
    counts = [0] * threads
    ends = [0.0] * threads
    start_gate = threading.Event()
    start = 0.0

    def caller(index: int) -> None:
        start_gate.wait()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            n = step(clients[index])
            if n < 0:
                break  # drained; the empty poll's wait is not counted
            counts[index] += n
            ends[index] = time.perf_counter()

    workers = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    start = time.perf_counter()
    start_gate.set()
    for w in workers:
        w.join()
    return rate(sum(counts), max(ends) - start)
