"""The IAM roles of infra/cloudformation/tock.yaml grant exactly what each process needs:
the timer may only send to its queue and publish metrics to its stack's CloudWatch namespace,
consumers may only receive, delete and extend visibility on theirs, the dashboard and
migrations get no AWS permissions at all."""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.paths import K8S_DIR, TOCK_TEMPLATE, load_template

TEMPLATE = load_template(TOCK_TEMPLATE)
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
QUEUE_ARN = {"Fn::GetAtt": ["QueueStack", "Outputs.QueueArn"]}

TASK_ROLES = {
    "TimerTaskRole": {"sqs:SendMessage", "sqs:GetQueueUrl", "sqs:GetQueueAttributes",
                      "cloudwatch:PutMetricData"},
    "ConsumerTaskRole": {"sqs:ReceiveMessage", "sqs:DeleteMessage",
                         "sqs:ChangeMessageVisibility", "sqs:GetQueueUrl"},
    "DashboardTaskRole": set(),
    "MigrateTaskRole": set(),
}
TASK_DEFINITIONS = {
    "TimerTaskDefinition": "TimerTaskRole",
    "ConsumerTaskDefinition": "ConsumerTaskRole",
    "DashboardTaskDefinition": "DashboardTaskRole",
    "MigrateTaskDefinition": "MigrateTaskRole",
}


def _statements(role: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for policy in role["Properties"].get("Policies", []):
        statements = policy["PolicyDocument"]["Statement"]
        out.extend(statements if isinstance(statements, list) else [statements])
    return out


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _actions(role: dict[str, Any]) -> set[str]:
    return {a for s in _statements(role) if s["Effect"] == "Allow" for a in _as_list(s["Action"])}


def _roles() -> dict[str, dict[str, Any]]:
    return {name: r for name, r in RESOURCES.items() if r["Type"] == "AWS::IAM::Role"}


@pytest.mark.parametrize("name", sorted(TASK_ROLES))
def test_task_role_grants_exactly_the_listed_actions(name):
    role = RESOURCES[name]
    assert _actions(role) == TASK_ROLES[name]
    assert "ManagedPolicyArns" not in role["Properties"]
    assert "PermissionsBoundary" not in role["Properties"]
    assert all(s["Effect"] == "Allow" and "NotAction" not in s and "NotResource" not in s
               for s in _statements(role))


@pytest.mark.parametrize("name", ["TimerTaskRole", "ConsumerTaskRole"])
def test_queue_permissions_are_scoped_to_the_stacks_queue_only(name):
    for statement in _statements(RESOURCES[name]):
        if any(a.startswith("sqs:") for a in _as_list(statement["Action"])):
            assert _as_list(statement["Resource"]) == [QUEUE_ARN]


def test_metrics_may_go_only_to_the_stacks_own_namespace():
    (grant,) = [s for s in _statements(RESOURCES["TimerTaskRole"])
                if "cloudwatch:PutMetricData" in _as_list(s["Action"])]
    assert _as_list(grant["Action"]) == ["cloudwatch:PutMetricData"]
    assert grant["Condition"] == {"StringEquals": {"cloudwatch:namespace": {
        "Fn::Sub": "tock/${AWS::StackName}"}}}


@pytest.mark.parametrize("name", sorted(TASK_ROLES))
def test_task_roles_trust_only_ecs_tasks_of_this_account(name):
    trust = RESOURCES[name]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert len(trust) == 1
    assert trust[0]["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}
    assert trust[0]["Condition"] == {"StringEquals": {"aws:SourceAccount":
                                                      {"Ref": "AWS::AccountId"}}}


@pytest.mark.parametrize(("definition", "role"), sorted(TASK_DEFINITIONS.items()))
def test_each_process_type_runs_under_its_own_role(definition, role):
    props = RESOURCES[definition]["Properties"]
    assert props["TaskRoleArn"] == {"Fn::GetAtt": [role, "Arn"]}


def test_no_other_role_or_policy_can_touch_sqs():
    for name, role in _roles().items():
        if name in TASK_ROLES:
            continue
        assert not {a for a in _actions(role) if a.lower().startswith("sqs:")}, name
        for arn in role["Properties"].get("ManagedPolicyArns", []):
            assert "SQS" not in str(arn).upper(), (name, arn)
    # Permissions attached from the side would escape the checks above.
    side_policies = {"AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::IAM::RolePolicy",
                     "AWS::SQS::QueuePolicy"}
    assert not [n for n, r in RESOURCES.items() if r["Type"] in side_policies]


def test_no_role_uses_wildcard_actions():
    for name, role in _roles().items():
        assert not [a for a in _actions(role) if "*" in a], name


def test_execution_roles_read_only_the_secrets_their_tasks_inject():
    def secrets_of(role: str) -> list[Any]:
        return [r for s in _statements(RESOURCES[role])
                if "secretsmanager:GetSecretValue" in _as_list(s["Action"])
                for r in _as_list(s["Resource"])]

    assert secrets_of("WorkerExecutionRole") == [{"Ref": "DatabaseSecret"}]
    assert sorted(map(str, secrets_of("DashboardExecutionRole"))) == sorted(
        str({"Ref": n}) for n in ("DatabaseSecret", "DashboardOperatorToken",
                                  "DashboardViewerToken", "DashboardSecretKey"))


def test_kubernetes_service_accounts_comment_names_the_same_actions():
    # infra/k8s/serviceaccounts.yaml tells what to grant the EKS Pod Identity roles.
    header = (K8S_DIR / "serviceaccounts.yaml").read_text().split("apiVersion:", 1)[0]
    text = " ".join(line.lstrip("# ") for line in header.splitlines())
    timer = text.split("timer =", 1)[1].split("consumer =", 1)[0]
    consumer = text.split("consumer =", 1)[1].split("dashboard", 1)[0]
    for role, said in (("TimerTaskRole", timer), ("ConsumerTaskRole", consumer)):
        # On Kubernetes KEDA scales on Prometheus: the timer publishes no CloudWatch metrics.
        for action in (a for a in TASK_ROLES[role] if a.startswith("sqs:")):
            assert action.removeprefix("sqs:") in said, (role, action)
