"""deploy/prometheus/alerts.yml: Shoal's alert rules, their wiring into compose's Prometheus and the
Helm chart's PrometheusRule, and their metrics against what a node exports.

``promtool`` (Debian's ``prometheus`` package; ``scripts/test`` installs it as root with apt) checks
the rules, runs their unit tests (``alerts_test.yml``) and checks compose's Prometheus configuration;
without it only those checks are skipped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from _deploy import (ALERT_RULES_FILE, CHART, DEPLOY, alert_metric_names, alert_rules, chart_schema, chart_values,
                     compose, promql_metric_names, render_template, template_texts)

RULES_FILE = ALERT_RULES_FILE
RULES_TESTS = DEPLOY / "prometheus" / "alerts_test.yml"
CHART_RULES = CHART / "files" / "alerts.yml"
NODE = DEPLOY.parent / "node"
#: The modules that define every family a node exports on /prometheus.
METRIC_SOURCES = ("metrics.py", "collector.py", "guard.py")

needs_promtool = pytest.mark.skipif(
    not shutil.which("promtool"),
    reason="promtool is not installed (Debian's prometheus package: apt-get install -y prometheus; "
           "scripts/test does it when it runs as root with apt); only this check is skipped")


def exported_names() -> set[str]:
    """Every sample name a node's /prometheus can carry, from the families its modules define:
    a counter's ``_total``, a histogram's ``_bucket``/``_sum``/``_count``, a gauge's own name."""
    source = "\n".join((NODE / name).read_text() for name in METRIC_SOURCES)
    names: set[str] = set()
    for kind, name in re.findall(r'\b(\w*(?:Counter|Gauge|Histogram)\w*)\(\s*"(shoal_\w+)"', source):
        if "Counter" in kind:
            names.add(f"{name}_total")
        elif "Histogram" in kind:
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    for name in re.findall(r'_LatencyHistograms\(\s*"(shoal_\w+)"', source):
        names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


# --- the rules themselves --------------------------------------------------------------------------

def test_every_rule_is_an_alert_with_a_duration_severity_and_runbook_hint() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook"} <= set(annotations), rule["alert"]
        anchor = annotations["runbook"].split("#")
        assert anchor[0] == "docs/metrics.md" and (DEPLOY.parent / anchor[0]).exists()
    # What the issue asks to be alerted on, each by a rule of its own.
    assert {"ShoalPartitionWithoutLeader", "ShoalReplicaLagging", "ShoalReplicaUnresponsive",
            "ShoalMemoryNearHighWater", "ShoalMemoryRefusingJobs", "ShoalDiskNearFull", "ShoalDiskFull",
            "ShoalPartitionRefusingWrites", "ShoalDeadLetterQueueGrowing", "ShoalMoveStalled",
            "ShoalNodeDown"} <= set(names)


def test_every_metric_an_alert_uses_is_exported_by_the_node() -> None:
    exported = exported_names()
    assert {"shoal_partition_is_leader", "shoal_memory_refusing", "shoal_commands_total",
            "shoal_command_latency_seconds_bucket", "shoal_move_idle_seconds"} <= exported  # the reader works
    for rule in alert_rules():
        used = promql_metric_names(rule["expr"]) - {"up"}  # Prometheus's own, per target
        assert used, f"{rule['alert']}: no metric found in {rule['expr']!r}"
        assert used <= exported, f"{rule['alert']} uses {sorted(used - exported)}, which no node exports"
    assert alert_metric_names() <= exported


def test_every_alert_is_explained_in_the_docs() -> None:
    docs = (DEPLOY.parent / "docs" / "metrics.md").read_text()
    section = docs[docs.index("## Alerts"):]
    for rule in alert_rules():
        assert f"`{rule['alert']}`" in section, f"docs/metrics.md#alerts does not explain {rule['alert']}"


# --- compose's Prometheus ---------------------------------------------------------------------------

def _rules_mount() -> tuple[str, str]:
    """(source under deploy/, target in the container) of the Prometheus service's rules mount."""
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (rule_file,) = prom["rule_files"]
    target = str(Path("/etc/prometheus") / rule_file)  # relative to the configuration file
    mounts = [m.split(":") for m in compose()["services"]["prometheus"]["volumes"]]
    (source,) = [src for src, dst, *_ in mounts if dst == target]
    return source, target


def test_compose_prometheus_loads_the_rules_file() -> None:
    source, target = _rules_mount()
    assert (DEPLOY / source).resolve() == RULES_FILE
    config_mount = [m for m in compose()["services"]["prometheus"]["volumes"] if m.startswith("./prometheus.yml:")]
    assert config_mount == ["./prometheus.yml:/etc/prometheus/prometheus.yml:ro"]


# --- the Helm chart ---------------------------------------------------------------------------------

def test_the_chart_reads_an_identical_copy_of_thealert_rules() -> None:
    assert CHART_RULES.read_bytes() == RULES_FILE.read_bytes(), \
        "the chart's rules differ: cp deploy/prometheus/alerts.yml deploy/helm/shoal/files/alerts.yml"


#: What the chart's helpers give a release named "shoal" (checked against _helpers.tpl elsewhere).
_INCLUDES = {"shoal.fullname": "shoal",
             "shoal.labels": "app.kubernetes.io/name: shoal\napp.kubernetes.io/instance: shoal"}


def _render_rule(overrides: dict[str, Any]) -> str:
    values = chart_values()
    values["prometheusRule"] = {**values["prometheusRule"], **overrides}
    jsonschema.validate(values, chart_schema())
    return render_template(template_texts()["prometheusrule.yaml"], values, _INCLUDES)


def test_the_prometheus_rule_is_off_by_default() -> None:
    assert chart_values()["prometheusRule"]["enabled"] is False
    assert _render_rule({}).strip() == ""


def test_the_prometheus_rule_renders_the_rules_file_as_its_spec() -> None:
    doc = yaml.safe_load(_render_rule({"enabled": True, "labels": {"release": "prometheus"}}))
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["name"] == "shoal"
    assert doc["metadata"]["labels"] == {"app.kubernetes.io/name": "shoal", "app.kubernetes.io/instance": "shoal",
                                         "release": "prometheus"}
    assert doc["spec"] == yaml.safe_load(RULES_FILE.read_text())
    # The rules' own {{ $labels }} templates reach Prometheus as written: Helm does not render .Files.Get.
    assert "{{ $labels.partition }}" in doc["spec"]["groups"][0]["rules"][2]["annotations"]["summary"]


def test_the_renderer_follows_helm_on_what_the_chart_uses() -> None:
    """The test's renderer itself: trimming, with/if blocks, nindent, toYaml."""
    values = {"a": {"off": False, "labels": {"x": "1"}, "empty": {}, "text": "a: 1\nb: 2\n"}}
    text = ('kind: K\n{{- if .Values.a.off }}\nhidden: 1\n{{- end }}\nmeta:\n  labels:\n'
            '    {{- with .Values.a.labels }}\n    {{- toYaml . | nindent 4 }}\n    {{- end }}\n'
            '    {{- with .Values.a.empty }}\n    y: 2\n    {{- end }}\n'
            'spec:\n  {{- .Values.a.text | nindent 2 }}\n')
    out = render_template(text, values, {})
    assert out.startswith("kind: K\nmeta:\n  labels:\n    x: ")
    assert yaml.safe_load(out) == {"kind": "K", "meta": {"labels": {"x": "1"}}, "spec": {"a": 1, "b": 2}}
    with pytest.raises(AssertionError, match="extend"):
        render_template("{{ .Release.Name }}", values, {})


# --- promtool -----------------------------------------------------------------------------------------

def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


@needs_promtool
def test_promtool_accepts_thealert_rules() -> None:
    result = _promtool("check", "rules", str(RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


@needs_promtool
def test_promtool_unit_tests_of_the_rules_pass() -> None:
    """alerts_test.yml: alerts that fire (and their annotations) and alerts that must not."""
    tested = set(re.findall(r"alertname: (\w+)", RULES_TESTS.read_text()))
    assert {"ShoalPartitionWithoutLeader", "ShoalNodeDown", "ShoalMoveStalled", "ShoalDeadLetterQueueGrowing",
            "ShoalMemoryRefusingJobs"} <= tested
    result = _promtool("test", "rules", str(RULES_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_accepts_compose_prometheus_configuration(tmp_path: Path) -> None:
    """prometheus.yml with the rules where compose mounts them (the token file where the test writes it)."""
    source, target = _rules_mount()
    config = (DEPLOY / "prometheus.yml").read_text()
    assert "/prometheus/shoal-token" in config
    (tmp_path / "shoal-token").write_text("token\n")
    (tmp_path / "prometheus.yml").write_text(config.replace("/prometheus/shoal-token", str(tmp_path / "shoal-token")))
    shutil.copy(DEPLOY / source, tmp_path / Path(target).relative_to("/etc/prometheus"))
    result = _promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr
