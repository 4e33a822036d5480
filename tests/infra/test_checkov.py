"""checkov (offline, --skip-download, from its own venv) over the CloudFormation
templates, the Dockerfile and the Kubernetes manifests: no failed check, and every
skipped check carries its reason next to the resource."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.infra.paths import CFN_DIR, CHECKOV_VENV, DOCKERFILE, K8S_DIR

CHECKOV = CHECKOV_VENV / "bin" / "checkov"
FRAMEWORKS = ["cloudformation", "dockerfile", "kubernetes"]


@pytest.fixture(scope="module")
def reports() -> dict[str, dict[str, Any]]:
    """One checkov run (its start-up dominates) over everything; reports by framework."""
    if not CHECKOV.exists():
        pytest.fail(f"checkov is not installed at {CHECKOV}: run `make checkov-venv` "
                    "(`make test` does it)")
    # Files, not directories: checkov ignores -f when -d is also given.
    files = [DOCKERFILE, *sorted(CFN_DIR.glob("*.yaml")),
             *sorted(p for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml")]
    done = subprocess.run(
        [str(CHECKOV), "--skip-download", "--compact", "-o", "json",
         "--framework", *FRAMEWORKS, "-f", *map(str, files)],
        check=False, capture_output=True, text=True, timeout=300)
    # Exit 1 means failed checks; the JSON says which. Anything else is a crash.
    assert done.returncode in (0, 1), done.stderr[-3000:]
    merged: dict[str, dict[str, Any]] = {}
    for report in _json_documents(done.stdout):
        into = merged.setdefault(report["check_type"], {
            "results": {"failed_checks": [], "skipped_checks": []},
            "summary": {"passed": 0, "parsing_errors": 0, "resource_count": 0}})
        for key in into["results"]:
            into["results"][key] += report["results"].get(key, [])
        for key in into["summary"]:
            into["summary"][key] += report["summary"][key]
    return merged


def _json_documents(text: str) -> list[dict[str, Any]]:
    """checkov prints one JSON document per scanned root, each a report or a list of them."""
    decoder = json.JSONDecoder()
    docs: list[dict[str, Any]] = []
    pos = 0
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
            continue
        value, pos = decoder.raw_decode(text, pos)
        docs.extend(value if isinstance(value, list) else [value])
    return docs


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_checkov_finds_no_failed_check(reports, framework):
    assert framework in reports, f"checkov scanned nothing for {framework}"
    report = reports[framework]
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}"
              for c in report["results"]["failed_checks"]]
    assert failed == []
    summary = report["summary"]
    assert summary["parsing_errors"] == 0
    # It really scanned: a wrong path would pass with nothing checked.
    assert summary["passed"] >= 50 and summary["resource_count"] >= 1


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_skip_states_its_reason(reports, framework):
    for skipped in reports[framework]["results"]["skipped_checks"]:
        reason = skipped["check_result"].get("suppress_comment") or ""
        assert len(reason.strip()) > 20, f"skip without a reason: {skipped['check_id']}"
