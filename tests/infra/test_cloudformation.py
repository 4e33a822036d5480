"""infra/cloudformation: cfn-lint clean, the nested SQS stack wired to the root, and the
settings each ECS container gets valid for its process and in agreement (lease,
heartbeat, visibility timeout, stop timeout vs shutdown grace, enforced by the Rules,
dead-letter receive count), and the dead-letter alarm's optional topic."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from consumer.service import LAST_WRITES_SECONDS
from shared.runtime.settings import TimerSettings
from tests.infra.paths import CFN_DIR, QUEUES_TEMPLATE, TOCK_TEMPLATE, load_template
from tests.infra.processes import load_settings, unknown_tock_variables
from timer_service.backlog_metrics import QueueBacklog, datums

ROOT_T = load_template(TOCK_TEMPLATE)
QUEUES_T = load_template(QUEUES_TEMPLATE)
RES: dict[str, Any] = ROOT_T["Resources"]
PARAMS: dict[str, Any] = ROOT_T["Parameters"]
DB_ADDRESS = "tock-db.abc123.us-east-1.rds.amazonaws.com"
LB_DNS_NAME = "internal-tock-Dashb-1A2B3C.us-east-1.elb.amazonaws.com"
PSEUDO = {"AWS::Region": "us-east-1", "AWS::StackName": "tock", "AWS::AccountId": "123456789012"}
CONTAINERS = {"TimerTaskDefinition": "timer", "ConsumerTaskDefinition": "consumer",
              "DashboardTaskDefinition": "dashboard", "MigrateTaskDefinition": "migrate"}


def _container(definition: str) -> dict[str, Any]:
    (container,) = RES[definition]["Properties"]["ContainerDefinitions"]
    return container


def _default(value: Any) -> str:
    """A literal, or the default of the parameter it references."""
    if isinstance(value, dict) and set(value) == {"Ref"}:
        ref = value["Ref"]
        return PSEUDO[ref] if ref in PSEUDO else str(PARAMS[ref]["Default"])
    if isinstance(value, dict) and "Fn::Sub" in value and isinstance(value["Fn::Sub"], str):
        text = value["Fn::Sub"]
        for name, param in PARAMS.items():
            text = text.replace("${" + name + "}", str(param.get("Default", "")))
        for name, pseudo in PSEUDO.items():
            text = text.replace("${" + name + "}", pseudo)
        # A load balancer's DNS name, as CloudFormation fills it in (mixed case), and the
        # database's endpoint.
        text = re.sub(r"\$\{\w+\.DNSName\}", LB_DNS_NAME, text)
        text = text.replace("${Database.Endpoint.Address}", DB_ADDRESS)
        return text.replace("${Database.Endpoint.Port}", "5432")
    return str(value)


def test_cfn_lint_reports_nothing():
    cli = Path(sys.executable).parent / "cfn-lint"
    templates = sorted(str(p) for p in CFN_DIR.glob("*.yaml"))
    done = subprocess.run([str(cli), *templates], check=False, capture_output=True, text=True,
                          timeout=300)
    # Exit code is a bitmask: 2 errors, 4 warnings, 8 informational. Any of them fails.
    assert done.returncode == 0, done.stdout + done.stderr


def test_nested_queue_stack_gets_parameters_it_declares_with_matching_defaults():
    nested = RES["QueueStack"]["Properties"]
    assert nested["TemplateURL"] == QUEUES_TEMPLATE.name
    passed = nested["Parameters"]
    assert set(passed) <= set(QUEUES_T["Parameters"])
    for name, value in passed.items():
        assert _default(value) == str(QUEUES_T["Parameters"][name]["Default"]), name
    outputs = set(QUEUES_T["Outputs"])
    used = {v["Fn::GetAtt"][1].removeprefix("Outputs.") for v in _getatts(ROOT_T)
            if v["Fn::GetAtt"][0] == "QueueStack"}
    assert used and used <= outputs


def _getatts(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        found = [node] if "Fn::GetAtt" in node else []
        return found + [g for v in node.values() for g in _getatts(v)]
    if isinstance(node, list):
        return [g for v in node for g in _getatts(v)]
    return []


@pytest.mark.parametrize(("definition", "process"), sorted(CONTAINERS.items()))
def test_each_container_gets_valid_settings_for_its_process(definition, process, monkeypatch):
    container = _container(definition)
    assert container["Command"][0] == process
    assert container["ReadonlyRootFilesystem"] is True
    env = {e["Name"]: _default(e["Value"]) for e in container["Environment"]}
    assert unknown_tock_variables(process, env) == []
    secrets = {s["Name"] for s in container.get("Secrets", [])}
    # The password reaches libpq as PGPASSWORD; the URL itself carries none.
    assert "PGPASSWORD" in secrets
    if "TOCK_DATABASE_URL" in env:
        userinfo = env["TOCK_DATABASE_URL"].split("//", 1)[1].split("@", 1)[0]
        assert ":" not in userinfo
    if process == "dashboard":
        assert secrets >= {"TOCK_DASHBOARD_OPERATOR_TOKEN", "TOCK_DASHBOARD_VIEWER_TOKEN",
                           "TOCK_DASHBOARD_SECRET_KEY"}
        env.update(TOCK_DASHBOARD_OPERATOR_TOKEN="o" * 32, TOCK_DASHBOARD_VIEWER_TOKEN="v" * 32)
    load_settings(process, env, monkeypatch)


def test_dashboard_answers_to_its_load_balancer_and_host_name(monkeypatch):
    container = _container("DashboardTaskDefinition")
    (allowed,) = [e["Value"] for e in container["Environment"]
                  if e["Name"] == "TOCK_DASHBOARD_ALLOWED_HOSTS"]
    assert allowed == {"Fn::Sub": "${DashboardHostName},${DashboardLoadBalancer.DNSName}"}
    env = {e["Name"]: _default(e["Value"]) for e in container["Environment"]}
    env.update(TOCK_DASHBOARD_OPERATOR_TOKEN="o" * 32, TOCK_DASHBOARD_VIEWER_TOKEN="v" * 32)
    settings = load_settings("dashboard", env, monkeypatch)
    assert settings.dashboard_allowed_hosts == [LB_DNS_NAME.lower()]  # no host name given
    env["TOCK_DASHBOARD_ALLOWED_HOSTS"] = allowed["Fn::Sub"].replace(
        "${DashboardHostName}", "tock.example.com").replace(
        "${DashboardLoadBalancer.DNSName}", LB_DNS_NAME)
    settings = load_settings("dashboard", env, monkeypatch)
    assert settings.host_allowed("tock.example.com") and settings.host_allowed(LB_DNS_NAME)
    pattern = re.compile(PARAMS["DashboardHostName"]["AllowedPattern"])
    assert pattern.fullmatch("") and pattern.fullmatch("tock.example.com")
    assert not pattern.fullmatch("https://tock.example.com")
    # The load balancer checks /healthz by the task's IP: the guard lets probes through.
    assert RES["DashboardTargetGroup"]["Properties"]["HealthCheckPath"] == "/healthz"


def test_consumer_timing_settings_agree(monkeypatch):
    container = _container("ConsumerTaskDefinition")
    env = {e["Name"]: _default(e["Value"]) for e in container["Environment"]}
    settings = load_settings("consumer", env, monkeypatch)
    stop_timeout = int(_default(container["StopTimeout"]))
    assert stop_timeout > settings.shutdown_grace_seconds + LAST_WRITES_SECONDS
    assert settings.heartbeat_seconds * 2 < settings.lease_seconds
    # The queue the stack creates uses the same visibility timeout the consumer asks for.
    assert RES["QueueStack"]["Properties"]["Parameters"]["VisibilityTimeoutSeconds"] == \
        {"Ref": "VisibilityTimeoutSeconds"}
    assert settings.visibility_timeout_seconds == int(PARAMS["VisibilityTimeoutSeconds"]["Default"])
    # The grace must fit under the largest stop timeout Fargate allows.
    assert PARAMS["ShutdownGraceSeconds"]["MaxValue"] < PARAMS["StopTimeoutSeconds"]["MaxValue"]


def test_services_run_two_timers_and_autoscale_consumers_on_the_queue():
    assert RES["TimerService"]["Properties"]["DesiredCount"] == \
        {"Fn::If": ["ServicesRun", {"Ref": "TimerCount"}, 0]}
    assert PARAMS["TimerCount"]["MinValue"] >= 2
    target = RES["ConsumerScalableTarget"]["Properties"]
    assert target["ScalableDimension"] == "ecs:service:DesiredCount"
    assert "ConsumerService.Name" in target["ResourceId"]["Fn::Sub"]
    metrics = RES["ConsumerBacklogScaling"]["Properties"][
        "TargetTrackingScalingPolicyConfiguration"]["CustomizedMetricSpecification"]["Metrics"]
    names = {m["MetricStat"]["Metric"]["MetricName"] for m in metrics if "MetricStat" in m}
    assert {"ApproximateNumberOfMessagesVisible", "Backlog"} <= names
    alarm = RES["ConsumerAgeAlarm"]["Properties"]
    assert alarm["MetricName"] == "ApproximateAgeOfOldestMessage"
    assert alarm["AlarmActions"] == [{"Ref": "ConsumerAgeScaling"}]
    due_alarm = RES["ConsumerDueAgeAlarm"]["Properties"]
    assert due_alarm["MetricName"] == "OldestDueAgeSeconds"
    assert due_alarm["AlarmActions"] == [{"Ref": "ConsumerAgeScaling"}]


def test_scaling_reads_the_backlog_metrics_the_timers_publish(monkeypatch):
    """The namespace, metric names and queue dimension the scaling reads are the ones the
    timer's settings make it publish (timer_service/backlog_metrics.py)."""
    env = {e["Name"]: _default(e["Value"])
           for e in _container("TimerTaskDefinition")["Environment"]}
    settings = load_settings("timer", env, monkeypatch)
    assert isinstance(settings, TimerSettings)
    published = {d["MetricName"] for d in datums([QueueBacklog("q")])}
    metrics = RES["ConsumerBacklogScaling"]["Properties"][
        "TargetTrackingScalingPolicyConfiguration"]["CustomizedMetricSpecification"]["Metrics"]
    (due,) = [m["MetricStat"]["Metric"] for m in metrics
              if m.get("MetricStat", {}).get("Metric", {}).get("MetricName") == "Backlog"]
    alarm = RES["ConsumerDueAgeAlarm"]["Properties"]
    for metric in (due, alarm):
        assert metric["MetricName"] in published
        assert _default(metric["Namespace"]) == settings.cloudwatch_namespace
        (dimension,) = metric["Dimensions"]
        assert dimension["Name"] == "Queue"
        assert [_default(dimension["Value"])] == settings.cloudwatch_queues
    grant = RES["TimerTaskRole"]["Properties"]["Policies"][1]["PolicyDocument"]["Statement"][0]
    assert grant["Action"] == "cloudwatch:PutMetricData"
    assert _default(grant["Condition"]["StringEquals"]["cloudwatch:namespace"]) == \
        settings.cloudwatch_namespace
    for service in ("TimerService", "ConsumerService", "DashboardService"):
        network = RES[service]["Properties"]["NetworkConfiguration"]["AwsvpcConfiguration"]
        assert network["AssignPublicIp"] == "DISABLED"


def test_database_is_private_encrypted_and_its_password_lives_in_secrets_manager():
    db = RES["Database"]["Properties"]
    assert db["PubliclyAccessible"] is False
    assert db["StorageEncrypted"] is True
    assert RES["DatabaseSubnetGroup"]["Properties"]["SubnetIds"] == {"Ref": "PrivateSubnetIds"}
    assert "{{resolve:secretsmanager:${DatabaseSecret}" in db["MasterUserPassword"]["Fn::Sub"]
    assert RES["DatabaseParameters"]["Properties"]["Parameters"]["rds.force_ssl"] == "1"


def test_every_container_logs_to_its_own_group():
    groups = set()
    for definition in CONTAINERS:
        options = _container(definition)["LogConfiguration"]["Options"]
        groups.add(options["awslogs-group"]["Ref"])
    assert len(groups) == len(CONTAINERS)
    assert all(RES[g]["Type"] == "AWS::Logs::LogGroup" for g in groups)


def test_dead_letter_after_is_the_queues_max_receive_count(monkeypatch):
    # The consumer defers a message whose job is not committed yet at most
    # min(5, TOCK_DEAD_LETTER_AFTER) receives; above the queue's maxReceiveCount, such a
    # message would reach the DLQ. The timer reads it too (for a queue it creates).
    redrive = QUEUES_T["Resources"]["Queue"]["Properties"]["RedrivePolicy"]
    assert redrive["maxReceiveCount"] == {"Ref": "MaxReceiveCount"}
    assert RES["QueueStack"]["Properties"]["Parameters"]["MaxReceiveCount"] == \
        {"Ref": "MaxReceiveCount"}
    for definition in ("TimerTaskDefinition", "ConsumerTaskDefinition"):
        env = {e["Name"]: e["Value"] for e in _container(definition)["Environment"]}
        assert env["TOCK_DEAD_LETTER_AFTER"] == {"Ref": "MaxReceiveCount"}, definition
    for definition in CONTAINERS:  # no other value anywhere
        for var in _container(definition)["Environment"]:
            if var["Name"] == "TOCK_DEAD_LETTER_AFTER":
                assert var["Value"] == {"Ref": "MaxReceiveCount"}, definition
    env = {e["Name"]: _default(e["Value"])
           for e in _container("ConsumerTaskDefinition")["Environment"]}
    settings = load_settings("consumer", env, monkeypatch)
    assert settings.dead_letter_after == int(PARAMS["MaxReceiveCount"]["Default"])
    # Every MaxReceiveCount the template takes is a TOCK_DEAD_LETTER_AFTER the processes take.
    for bound in ("MinValue", "MaxValue"):
        env["TOCK_DEAD_LETTER_AFTER"] = str(PARAMS["MaxReceiveCount"][bound])
        load_settings("consumer", env, monkeypatch)


def _rule_value(node: Any, params: dict[str, str]) -> Any:
    """A rule function evaluated as CloudFormation does, on parameter values (strings)."""
    if isinstance(node, list):
        return [_rule_value(v, params) for v in node]
    if not isinstance(node, dict):
        return str(node)
    ((name, args),) = node.items()
    if name == "Ref":
        return params[args]
    values = _rule_value(args, params)
    if name == "Fn::Contains":
        return values[1] in values[0]
    if name == "Fn::Equals":
        return values[0] == values[1]
    if name == "Fn::Not":
        return not values[0]
    if name == "Fn::And":
        return all(values)
    if name == "Fn::Or":
        return any(values)
    raise AssertionError(f"rule function {name} not known to this test")


def _rules_refuse(params: dict[str, str]) -> list[str]:
    """The AssertDescriptions of the rules that would refuse these parameter values."""
    refused = []
    for rule in ROOT_T["Rules"].values():
        if "RuleCondition" in rule and not _rule_value(rule["RuleCondition"], params):
            continue
        refused += [a["AssertDescription"] for a in rule["Assertions"]
                    if not _rule_value(a["Assert"], params)]
    return refused


def test_rules_keep_the_stop_timeout_above_the_shutdown_grace():
    grace, stop = PARAMS["ShutdownGraceSeconds"], PARAMS["StopTimeoutSeconds"]
    defaults = {"ShutdownGraceSeconds": str(grace["Default"]),
                "StopTimeoutSeconds": str(stop["Default"])}
    assert _rules_refuse(defaults) == []
    # Every pair the parameters allow: accepted exactly when the stop timeout reaches the
    # multiple of 10 after the next above the grace, so that the grace and the consumer's
    # last writes after it (LAST_WRITES_SECONDS) end before ECS's SIGKILL.
    for g in range(grace["MinValue"], grace["MaxValue"] + 1):
        for s in range(stop["MinValue"], stop["MaxValue"] + 1):
            refused = _rules_refuse({"ShutdownGraceSeconds": str(g),
                                     "StopTimeoutSeconds": str(s)})
            assert (not refused) == (s >= (g // 10 + 2) * 10), (g, s, refused)
            if refused:
                assert len(refused) == 1 and "StopTimeoutSeconds must be" in refused[0]
            else:
                assert g + LAST_WRITES_SECONDS < s, (g, s)
    assert _rules_refuse({"ShutdownGraceSeconds": "25", "StopTimeoutSeconds": "35"}) == [
        "StopTimeoutSeconds must be 40 or more for a ShutdownGraceSeconds of 20-29."]


def test_dead_letter_alarm_notifies_the_topic_given_and_nobody_by_default():
    topic = PARAMS["AlarmTopicArn"]
    assert topic["Default"] == ""
    pattern = re.compile(topic["AllowedPattern"])
    assert pattern.fullmatch("") and pattern.fullmatch(
        "arn:aws:sns:eu-west-1:123456789012:tock-alerts")
    assert not pattern.fullmatch("tock-alerts")
    assert ROOT_T["Conditions"]["AlarmNotifies"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]}]}
    alarm = RES["DeadLetterAlarm"]["Properties"]
    assert alarm["AlarmActions"] == {
        "Fn::If": ["AlarmNotifies", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}


@pytest.mark.parametrize("definition", sorted(CONTAINERS))
def test_read_only_containers_get_a_writable_tmp(definition):
    # A read-only root with no /tmp leaves Python's tempfile nowhere to write: the
    # consumer's handler-process pool (--isolation process) cannot start its fork server.
    # The Kubernetes pods mount an emptyDir there; here a task volume does it.
    container = _container(definition)
    assert container["ReadonlyRootFilesystem"] is True
    volumes = {v["Name"]: v for v in RES[definition]["Properties"].get("Volumes", [])}
    mounts = {m["ContainerPath"]: m for m in container.get("MountPoints", [])}
    assert "/tmp" in mounts, definition
    assert mounts["/tmp"].get("ReadOnly", False) is False
    volume = volumes[mounts["/tmp"]["SourceVolume"]]
    # Task storage, not a host path (Fargate has none) or a shared file system.
    assert set(volume) == {"Name"}, volume


def test_migrate_task_can_run_a_new_image_before_the_services_roll():
    # run-task cannot override a task definition's image, so a release needs the migrate
    # task definition on the new image while the services still run the old one.
    image = _container("MigrateTaskDefinition")["Image"]
    assert image == {"Fn::If": ["MigrateImageGiven", {"Ref": "MigrateImageUri"},
                                {"Ref": "ImageUri"}]}
    assert PARAMS["MigrateImageUri"]["Default"] == ""
    assert ROOT_T["Conditions"]["MigrateImageGiven"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "MigrateImageUri"}, ""]}]}
    for definition in CONTAINERS:
        if definition != "MigrateTaskDefinition":
            assert _container(definition)["Image"] == {"Ref": "ImageUri"}, definition
    readme = (TOCK_TEMPLATE.parents[2] / "README.md").read_text()
    assert "--parameter-overrides MigrateImageUri=" in readme


def test_consumers_run_under_an_init_process():
    # Handlers may start subprocesses; an orphaned one is reparented to PID 1, which must
    # reap it. Python as PID 1 does not, so ECS puts its init (tini) there.
    assert _container("ConsumerTaskDefinition")["LinuxParameters"] == {"InitProcessEnabled": True}
