"""infra/k8s: core objects pass kubernetes-validate --strict, the KEDA objects pass their
CRD models (cloudcoil-models-keda), and the manifests keep their promises: hardened pods,
probes on the right ports, secrets by reference, timing settings that agree."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate.utils as kv
import pytest
import yaml
from cloudcoil.models.keda import v1alpha1 as keda

from consumer.service import LAST_WRITES_SECONDS
from dashboard.settings import DashboardSettings
from shared.runtime.settings import ConsumerSettings
from tests.infra.paths import K8S_DIR, QUEUES_TEMPLATE, load_k8s_documents, load_template
from tests.infra.processes import load_settings, unknown_tock_variables

K8S_VERSION = "1.32.0"
DOCS = load_k8s_documents()
KEDA_KINDS = {"ScaledObject": keda.ScaledObject,
              "TriggerAuthentication": keda.TriggerAuthentication}
CORE = [(p, d) for p, d in DOCS if d["kind"] not in KEDA_KINDS]
WORKLOADS = {d["metadata"]["name"]: d for _, d in DOCS if d["kind"] in ("Deployment", "Job")}
CONFIGMAPS = {d["metadata"]["name"]: d["data"] for _, d in DOCS if d["kind"] == "ConfigMap"}


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [d for _, d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _env(workload: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the process sees it; secrets get a stand-in."""
    container = _container(workload)
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(CONFIGMAPS[source["configMapRef"]["name"]])
    for var in container.get("env", []):
        if "value" in var:
            # $(NAME) is a variable defined before, as the kubelet expands it.
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]),
                                      var["value"])
        elif "fieldRef" in var.get("valueFrom", {}):
            env[var["name"]] = "10.0.0.7"  # the pod's IP, say
        else:
            # Secrets get a stand-in of the right form (a Postgres URL for the database).
            env[var["name"]] = "postgresql://stand-in-for-a-secret@db/tock"
    return env


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    on_disk = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == on_disk
    assert {d["metadata"].get("namespace") for _, d in DOCS if d["kind"] != "Namespace"} == \
        {kustomization["namespace"]}


@pytest.mark.parametrize(("path", "doc"), CORE,
                         ids=[f"{p.name}:{d['kind']}/{d['metadata']['name']}" for p, d in CORE])
def test_core_objects_pass_strict_schema_validation(path, doc):
    kv.validate(doc, K8S_VERSION, strict=True)


def test_kubernetes_validate_cli_strict_passes_on_every_file():
    files = [str(p) for p in sorted(K8S_DIR.glob("*.yaml")) if p.name != "kustomization.yaml"]
    cli = Path(sys.executable).parent / "kubernetes-validate"
    done = subprocess.run([str(cli), "--strict", "-k", K8S_VERSION, *files], check=False,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_strict_validation_rejects_an_unknown_field():
    # The check above can fail: a misspelt field is an error, not a warning.
    broken = yaml.safe_load(yaml.safe_dump(WORKLOADS["tock-timer"]))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, K8S_VERSION, strict=True)


def _keda_roundtrip(doc: dict[str, Any]) -> dict[str, Any]:
    model = KEDA_KINDS[doc["kind"]].model_validate(doc)
    dumped: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return dumped


@pytest.mark.parametrize("kind", sorted(KEDA_KINDS))
def test_keda_objects_match_the_crd_models_without_unknown_fields(kind):
    docs = [d for _, d in DOCS if d["kind"] == kind]
    assert docs
    for doc in docs:
        # The models ignore unknown keys, so compare: anything dropped was not in the CRD.
        assert _keda_roundtrip(doc) == doc


def test_keda_model_check_catches_a_misspelt_field():
    scaled = yaml.safe_load(yaml.safe_dump(_one("ScaledObject", "tock-consumer")))
    scaled["spec"]["maxReplicas"] = 5
    assert _keda_roundtrip(scaled) != scaled
    scaled = yaml.safe_load(yaml.safe_dump(_one("ScaledObject", "tock-consumer")))
    scaled["spec"]["minReplicaCount"] = "one"
    with pytest.raises(ValueError, match=r"minReplicaCount|min_replica_count"):
        _keda_roundtrip(scaled)


def test_scaled_object_scales_the_consumers_on_the_sqs_backlog():
    scaled = _one("ScaledObject", "tock-consumer")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "tock-consumer"
    assert "replicas" not in WORKLOADS["tock-consumer"]["spec"]  # the HPA owns the count
    sqs = [t for t in scaled["spec"]["triggers"] if t["type"] == "aws-sqs-queue"]
    assert len(sqs) == 1
    prefix = CONFIGMAPS["tock-common"]["TOCK_QUEUE_PREFIX"]
    queue = json.loads(CONFIGMAPS["tock-consumer"]["TOCK_QUEUES"])[0]
    assert sqs[0]["metadata"]["queueURL"].endswith(f"/{prefix}{queue}")
    auth = _one("TriggerAuthentication", sqs[0]["authenticationRef"]["name"])
    assert auth["spec"]["podIdentity"]["provider"] == "aws"
    assert scaled["spec"]["minReplicaCount"] >= 1


def test_oldest_due_age_component_patch_yields_a_valid_scaled_object():
    component = K8S_DIR / "components" / "oldest-due-age"
    kustomization = yaml.safe_load((component / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    scaled = yaml.safe_load(yaml.safe_dump(_one("ScaledObject", "tock-consumer")))
    for patch in kustomization["patches"]:
        for op in yaml.safe_load((component / patch["path"]).read_text()):
            assert (op["op"], op["path"]) == ("add", "/spec/triggers/-")
            scaled["spec"]["triggers"].append(op["value"])
    assert _keda_roundtrip(scaled) == scaled
    age = scaled["spec"]["triggers"][-1]
    assert age["type"] == "prometheus"
    assert "tock_oldest_due_age_seconds" in age["metadata"]["query"]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_pods_are_hardened(name):
    pod = WORKLOADS[name]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == name
    container = _container(WORKLOADS[name])
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc.get("privileged", False) is False
    for kind in ("requests", "limits"):
        assert set(container["resources"][kind]) == {"cpu", "memory"}


def test_consumer_pods_have_a_pid_1_that_reaps_orphans():
    # A handler's orphaned subprocesses are reparented to PID 1; with a shared process
    # namespace that is the pod's pause process, which reaps them, not Python.
    assert WORKLOADS["tock-consumer"]["spec"]["template"]["spec"]["shareProcessNamespace"] is True


@pytest.mark.parametrize(("name", "port", "ready"), [
    ("tock-timer", 9000, "/readyz"), ("tock-consumer", 9000, "/readyz"),
    # The dashboard's /readyz fails on every replica at once while Postgres is away: as
    # readiness it would empty the Service, and the Ingress would answer for it.
    ("tock-dashboard", 8080, "/healthz"),
])
def test_probes_hit_the_health_endpoints_on_the_served_port(name, port, ready):
    container = _container(WORKLOADS[name])
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", ready)):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert named[get["port"]] == port
    env = _env(WORKLOADS[name])
    served = env.get("TOCK_HEALTH_PORT") or env.get("TOCK_DASHBOARD_PORT")
    assert served == str(port)


@pytest.mark.parametrize(("name", "process", "command"), [
    ("tock-timer", "timer", ["timer"]),
    ("tock-consumer", "consumer", ["consumer", "--tasks", "demo.tasks"]),
    ("tock-dashboard", "dashboard", ["dashboard"]),
    ("tock-migrate", "migrate", ["migrate"]),
])
def test_each_process_gets_valid_settings(name, process, command, monkeypatch):
    assert _container(WORKLOADS[name])["args"] == command
    env = _env(WORKLOADS[name])
    assert unknown_tock_variables(process, env) == []
    env["TOCK_DATABASE_URL"] = "postgresql://tock@db.example:5432/tock"
    if process == "dashboard":
        env.update(TOCK_DASHBOARD_OPERATOR_TOKEN="o" * 32, TOCK_DASHBOARD_VIEWER_TOKEN="v" * 32)
    load_settings(process, env, monkeypatch)


def test_consumer_drains_before_the_kubelet_kills_it(monkeypatch):
    env = _env(WORKLOADS["tock-consumer"])
    settings = load_settings("consumer", env, monkeypatch)
    assert isinstance(settings, ConsumerSettings)
    grace = WORKLOADS["tock-consumer"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # Room for the release of unfinished jobs and the exit after the handler grace.
    assert grace > settings.shutdown_grace_seconds + LAST_WRITES_SECONDS
    assert settings.heartbeat_seconds * 2 < settings.lease_seconds
    assert settings.visibility_timeout_seconds >= settings.lease_seconds


def test_secrets_are_referenced_never_stored():
    assert not [d for _, d in DOCS if d["kind"] == "Secret"]
    refs = set()
    for workload in WORKLOADS.values():
        for var in _container(workload).get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs.add((ref["name"], ref["key"]))
            elif var["name"] in ("TOCK_DATABASE_URL", "TOCK_DASHBOARD_OPERATOR_TOKEN",
                                 "TOCK_DASHBOARD_VIEWER_TOKEN", "TOCK_DASHBOARD_SECRET_KEY",
                                 "TOCK_DASHBOARD_METRICS_TOKEN"):
                pytest.fail(f"{var['name']} must come from a Secret")
    assert refs == {("tock-database", "url"), ("tock-dashboard", "operator-token"),
                    ("tock-dashboard", "viewer-token"), ("tock-dashboard", "secret-key"),
                    ("tock-dashboard", "metrics-token")}


def test_timer_runs_two_replicas_and_every_deployment_has_a_pdb():
    assert WORKLOADS["tock-timer"]["spec"]["replicas"] >= 2
    pdbs = [d for _, d in DOCS if d["kind"] == "PodDisruptionBudget"]
    for name, workload in WORKLOADS.items():
        if workload["kind"] != "Deployment":
            continue
        labels = workload["spec"]["template"]["metadata"]["labels"]
        covering = [p for p in pdbs
                    if p["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(covering) == 1, name


def test_network_policy_denies_by_default_every_tock_pod():
    deny = _one("NetworkPolicy", "tock-default-deny")
    assert set(deny["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny["spec"] and "egress" not in deny["spec"]
    selector = deny["spec"]["podSelector"]["matchLabels"]
    for workload in WORKLOADS.values():
        assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()


def test_dashboard_answers_its_ingress_host_and_prometheus_by_pod_ip(monkeypatch):
    env = _env(WORKLOADS["tock-dashboard"])
    env.update(TOCK_DATABASE_URL="postgresql://tock@db.example:5432/tock",
               TOCK_DASHBOARD_OPERATOR_TOKEN="o" * 32, TOCK_DASHBOARD_VIEWER_TOKEN="v" * 32)
    settings = load_settings("dashboard", env, monkeypatch)
    assert isinstance(settings, DashboardSettings)
    assert settings.host_allowed("tock.example.com") and settings.host_allowed("10.0.0.7")
    assert not settings.host_allowed("localhost.evil.example")
    # /metrics needs a token, which the plain prometheus.io/* annotations cannot send.
    assert not settings.dashboard_metrics_public and settings.dashboard_metrics_token
    annotations = WORKLOADS["tock-dashboard"]["spec"]["template"]["metadata"].get(
        "annotations", {})
    assert "prometheus.io/scrape" not in annotations


def test_dead_letter_after_is_set_for_the_timer_and_consumers(monkeypatch):
    # The queues come from outside (queues.yaml, say): TOCK_DEAD_LETTER_AFTER must equal
    # their maxReceiveCount, so it is set explicitly, to the queue template's default.
    queues = load_template(QUEUES_TEMPLATE)
    max_receive = int(queues["Parameters"]["MaxReceiveCount"]["Default"])
    for name, process in (("tock-timer", "timer"), ("tock-consumer", "consumer")):
        env = _env(WORKLOADS[name])
        assert env["TOCK_DEAD_LETTER_AFTER"] == str(max_receive), name
        env["TOCK_DATABASE_URL"] = "postgresql://tock@db.example:5432/tock"
        assert load_settings(process, env, monkeypatch).dead_letter_after == max_receive
    # Under a comment that says it must equal the queue's maxReceiveCount.
    lines = (K8S_DIR / "configmap.yaml").read_text().splitlines()
    at = next(i for i, x in enumerate(lines) if x.strip().startswith("TOCK_DEAD_LETTER_AFTER:"))
    comment = []
    while lines[at - 1 - len(comment)].strip().startswith("#"):
        comment.append(lines[at - 1 - len(comment)])
    assert "maxReceiveCount" in " ".join(comment)


def test_configmap_comment_lists_every_secret_key_the_manifests_use():
    header = (K8S_DIR / "configmap.yaml").read_text().split("apiVersion:", 1)[0]
    for workload in WORKLOADS.values():
        for var in _container(workload).get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] in header and ref["key"] in header, ref


def test_disruption_budgets_let_a_drain_evict_pods_that_are_not_ready():
    # In an SQS or Postgres outage every replica is not ready; with the default policy
    # (IfHealthyBudget) a node drain would wait for the outage to end.
    for _, pdb in DOCS:
        if pdb["kind"] == "PodDisruptionBudget":
            assert pdb["spec"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow", \
                pdb["metadata"]["name"]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", expr  # the only operator the manifests use
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def _egress_allowed(workload: dict[str, Any], address: str, port: int) -> bool:
    """Whether the NetworkPolicies let the workload's pods open TCP `port` to an IP
    `address` (ipBlock peers only: what pods outside the cluster are reached by)."""
    labels = workload["spec"]["template"]["metadata"]["labels"]
    for _, policy in DOCS:
        if policy["kind"] != "NetworkPolicy" or "Egress" not in policy["spec"]["policyTypes"]:
            continue
        if not _selects(policy["spec"]["podSelector"], labels):
            continue
        for rule in policy["spec"].get("egress", []):
            ports = [(p.get("protocol", "TCP"), p["port"]) for p in rule.get("ports", [])]
            if ports and ("TCP", port) not in ports:
                continue
            for peer in rule.get("to", []):
                block = peer.get("ipBlock")
                if block and ipaddress.ip_address(address) in ipaddress.ip_network(
                        block["cidr"]):
                    return True
    return False


POD_IDENTITY_AGENT = ("169.254.170.23", "fd00:ec2::23")


@pytest.mark.parametrize("name", ["tock-timer", "tock-consumer"])
def test_sqs_callers_may_reach_sqs_and_their_credentials(name):
    # EKS Pod Identity (serviceaccounts.yaml): the SDK fetches the role's credentials
    # from the agent on the node, over plain HTTP on a link-local address.
    workload = WORKLOADS[name]
    assert _egress_allowed(workload, "52.46.128.10", 443), "SQS over HTTPS"
    for agent in POD_IDENTITY_AGENT:
        assert _egress_allowed(workload, agent, 80), agent
    assert _egress_allowed(workload, "10.1.2.3", 5432), "Postgres"


@pytest.mark.parametrize("name", ["tock-dashboard", "tock-migrate"])
def test_processes_without_an_aws_role_reach_postgres_only(name):
    workload = WORKLOADS[name]
    assert _egress_allowed(workload, "10.1.2.3", 5432), "Postgres"
    assert not _egress_allowed(workload, "52.46.128.10", 443)
    assert not _egress_allowed(workload, POD_IDENTITY_AGENT[0], 80)
