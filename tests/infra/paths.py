"""Where the deployment files live, and loaders that read them the way their tools do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]
from cfnlint.decode.cfn_yaml import load as load_cfn_yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[2]
CFN_DIR = ROOT / "infra" / "cloudformation"
TOCK_TEMPLATE = CFN_DIR / "tock.yaml"
QUEUES_TEMPLATE = CFN_DIR / "queues.yaml"
K8S_DIR = ROOT / "infra" / "k8s"
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE_FILE = ROOT / "localstack" / "compose.yaml"
INIT_HOOK = ROOT / "localstack" / "init" / "ready.d" / "create_queues.py"
CHECKOV_VENV = ROOT / ".checkov-venv"


def load_template(path: Path) -> dict[str, Any]:
    """A CloudFormation template as plain data; short-form tags (!Ref, !GetAtt ...) become
    their long forms ({"Ref": ...}, {"Fn::GetAtt": [resource, attribute]})."""
    data: dict[str, Any] = json.loads(json.dumps(load_cfn_yaml(str(path))))
    return data


def load_k8s_documents() -> list[tuple[Path, dict[str, Any]]]:
    """Every Kubernetes object under infra/k8s (kustomization.yaml excepted)."""
    docs: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend((path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc)
    return docs
