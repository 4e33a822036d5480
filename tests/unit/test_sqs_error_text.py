"""SQS error texts keep their reason in a log line: the receipt handle SQS quotes before
the reason is cut short wherever a botocore error becomes text (`TransportError` messages
and per-entry failures), so the human format's 120-character cut no longer leaves only
the handle (the audit saw `error="Value OGM3Mjk5NjgtMmY2NS00...`)."""

from __future__ import annotations

import logging
import os

import pytest
from botocore.exceptions import ClientError

from shared.core.errors import ConfigError, TransportError
from shared.runtime.logs import HumanFormatter
from shared.transport.sqs import SqsTransport, shorten_handles

# A receipt handle and the error LocalStack gave for it (after the message was deleted).
HANDLE = ("OTEzZDMyMDktMWYzZS00ZDhmLWIwYzItZTc5MzViZTI5YzhhIGFybjphd3M6c3FzOnVzLWVhc3QtMTow"
          "MDAwMDAwMDAwMDA6cHJvYmUtcSBjZTQ1MzFlNC03YWZkLTQ2ZmItOGVlYS03OGMxY2QwYjBjZjIgMTc5"
          "NjQ3MzMzMy4yNDA1NzY3")
REASON = "Reason: Message does not exist or is not available for visibility timeout change."
LOCALSTACK = f"Value {HANDLE} for parameter ReceiptHandle is invalid. {REASON}"
# Real SQS's handles are base64 with + / and = padding.
AWS_HANDLE = ("AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a+IBWoz/JEbtGFMHaBtaaP8hHgmq4nTrWjn3d8ZaTvNgoI0"
              "Yhwr5aUdb45WYaT5W1Y1Qz9SuSkWeHR4bbaJQKUAaX6hnfq7pwmOM1ddCG8NHhD/3nG7vIyuWdIpMK"
              "kIBBYcUaZ0KMoeaA==")


def test_a_receipt_handle_is_cut_to_its_first_characters() -> None:
    assert shorten_handles(LOCALSTACK) == (
        f"Value {HANDLE[:12]}... for parameter ReceiptHandle is invalid. {REASON}")
    quoted = f'The input receipt handle "{AWS_HANDLE}" is not a valid receipt handle.'
    assert shorten_handles(quoted) == (
        f'The input receipt handle "{AWS_HANDLE[:12]}..." is not a valid receipt handle.')


@pytest.mark.parametrize("text", [
    "SQS queue 'tock-default' for tock queue 'default' does not exist",
    "Could not connect to the endpoint URL: "
    "\"http://localhost.localstack.cloud:4566/000000000000/t1a2b3c4d-default\"",
    "job 123 is dispatched with another dispatch token 0f8fad5b-d9cb-469f-a165-70867728950e",
])
def test_other_texts_are_left_alone(text: str) -> None:
    assert shorten_handles(text) == text


class RefusingClient:
    """Answers ChangeMessageVisibilityBatch as LocalStack does for a deleted message, and
    ChangeMessageVisibility (not batched) with the same error for the whole call."""

    def get_queue_url(self, QueueName: str) -> dict[str, str]:
        return {"QueueUrl": f"http://sqs.local/000000000000/{QueueName}"}

    def change_message_visibility_batch(self, **_: object) -> dict[str, object]:
        return {"Successful": [], "Failed": [
            {"Id": "0", "SenderFault": True, "Code": "InvalidParameterValueException",
             "Message": LOCALSTACK}]}

    def delete_message_batch(self, **_: object) -> dict[str, object]:
        raise ClientError({"Error": {"Code": "InvalidParameterValue", "Message": LOCALSTACK}},
                          "DeleteMessageBatch")


def test_entry_failures_and_call_errors_keep_the_reason() -> None:
    transport = SqsTransport("tock-", client=RefusingClient())  # type: ignore[arg-type]
    [failure] = transport.change_visibility_batch("default", [HANDLE], 30)
    assert failure.message.endswith(REASON) and HANDLE not in failure.message
    with pytest.raises(TransportError) as caught:
        transport.delete_batch("default", [HANDLE])
    assert str(caught.value) == (f"SQS DeleteMessageBatch failed: InvalidParameterValue: "
                                 f"Value {HANDLE[:12]}... for parameter ReceiptHandle is "
                                 f"invalid. {REASON}")


def test_a_human_log_line_shows_why() -> None:
    """The line the audit saw, now: the reason is within the field's 120 characters."""
    transport = SqsTransport("tock-", client=RefusingClient())  # type: ignore[arg-type]
    [failure] = transport.change_visibility_batch("default", [HANDLE], 30)
    record = logging.LogRecord("tock.consumer", logging.WARNING, "", 0,
                               "visibility_extend_failed", (), None)
    record.event = "visibility_extend_failed"
    record.fields = {"queue": "default", "entries": 1, "code": failure.code,
                     "error": failure.message}
    line = HumanFormatter("consumer-1").format(record)
    assert "Reason: Message does not exist" in line


@pytest.fixture
def aws_env(monkeypatch):
    """No AWS configuration but what the test sets."""
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL",
                 "AWS_ENDPOINT_URL_SQS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    return monkeypatch


def test_no_region_is_a_config_error_naming_the_variable(aws_env) -> None:
    with pytest.raises(ConfigError) as refused:
        SqsTransport()
    assert str(refused.value).startswith("AWS_DEFAULT_REGION: no AWS region is configured")
    assert "AWS_REGION" in str(refused.value)


@pytest.mark.parametrize("endpoint", [None, "http://127.0.0.1:4566"])
def test_an_empty_region_is_a_config_error_saying_so(aws_env, endpoint) -> None:
    # boto3 took "" as the region: without an endpoint it then refused the URL it built
    # (blamed on the config file's endpoint_url), with one it signed for region "".
    aws_env.setenv("AWS_DEFAULT_REGION", " ")
    if endpoint:
        aws_env.setenv("AWS_ENDPOINT_URL_SQS", endpoint)
    with pytest.raises(ConfigError) as refused:
        SqsTransport()
    assert str(refused.value).startswith("AWS_DEFAULT_REGION is set but empty")


@pytest.mark.parametrize(("variable", "url", "says"), [
    ("AWS_ENDPOINT_URL_SQS", "not-a-url", "not a URL"),
    ("AWS_ENDPOINT_URL_SQS", "http://me:pw@[::1", "Invalid IPv6 URL"),
    ("AWS_ENDPOINT_URL_SQS", "ftp://127.0.0.1:4566", "not an http:// or https:// URL"),
    ("AWS_ENDPOINT_URL_SQS", "http://127.0.0.1:99999", "Port out of range"),
    ("AWS_ENDPOINT_URL", "localhost:4566", "not a URL"),
])
def test_a_malformed_endpoint_is_a_config_error_naming_the_variable(aws_env, variable, url,
                                                                   says) -> None:
    aws_env.setenv("AWS_DEFAULT_REGION", "us-east-1")
    aws_env.setenv(variable, url)
    with pytest.raises(ConfigError) as refused:
        SqsTransport()
    text = str(refused.value)
    assert text.startswith(f"{variable}=") and says in text
    assert ":pw@" not in text


def test_a_usable_configuration_makes_a_client(aws_env) -> None:
    aws_env.setenv("AWS_DEFAULT_REGION", "us-east-1")
    aws_env.setenv("AWS_ENDPOINT_URL_SQS", "http://127.0.0.1:4566")
    assert SqsTransport().client.meta.endpoint_url == "http://127.0.0.1:4566"
