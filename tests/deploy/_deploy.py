"""Shared readers for the deploy tests: the compose file, the Dockerfile and the Helm chart."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CHART = DEPLOY / "helm" / "shoal"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
NODE_SERVICES = ("shoal-1", "shoal-2", "shoal-3")
CHAOS_SERVICES = ("shoal-chaos-1", "shoal-chaos-2", "shoal-chaos-3")


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


_INTERPOLATION = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}|\$(\w+)")


class MissingVariable(KeyError):
    pass


def interpolate(value: str, env: dict[str, str]) -> str:
    """docker compose's variable substitution: ``${X}``, ``$X``, ``${X:-default}``, ``${X-default}``,
    ``${X:?error}`` and ``${X?error}`` (``$$`` is a literal ``$``)."""
    parts = value.split("$$")

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3) or ""
        present = name in env
        set_nonempty = bool(env.get(name))
        if op in (":-", "-"):
            use_default = not set_nonempty if op == ":-" else not present
            return arg if use_default else env[name]
        if op in (":?", "?"):
            if not set_nonempty if op == ":?" else not present:
                raise MissingVariable(f"{name}: {arg}")
            return env[name]
        return env.get(name, "")

    return "$".join(_INTERPOLATION.sub(sub, p) for p in parts)


def service_env(service: dict[str, Any], variables: dict[str, str]) -> dict[str, str]:
    """A service's ``environment`` (mapping or list form) after substitution, as strings."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) if "=" in item else (item, variables.get(item, "")) for item in raw)
    out = {}
    for key, value in raw.items():
        if value is None:
            value = variables.get(key, "")
        elif isinstance(value, bool):
            value = "true" if value else "false"
        out[key] = interpolate(str(value), variables)
    return out


def dockerfile_instructions(text: str | None = None) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined, comments dropped."""
    text = (DEPLOY / "Dockerfile").read_text() if text is None else text
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def exec_form(args: str) -> list[str]:
    """CMD/ENTRYPOINT/HEALTHCHECK CMD arguments as an argv (JSON exec form, else /bin/sh -c)."""
    args = args.strip()
    if args.startswith("["):
        return list(json.loads(args))
    return ["/bin/sh", "-c", args]


def final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def image_argv(instructions: list[tuple[str, str]], command: list[str] | None) -> list[str]:
    """What a container of the final stage runs: ENTRYPOINT + (compose/k8s command or CMD)."""
    stage = final_stage(instructions)
    entry = [exec_form(a) for w, a in stage if w == "ENTRYPOINT"]
    cmd = [exec_form(a) for w, a in stage if w == "CMD"]
    return (entry[-1] if entry else []) + (command if command is not None else (cmd[-1] if cmd else []))


def healthcheck_argv(instructions: list[tuple[str, str]]) -> list[str]:
    (args,) = [a for w, a in final_stage(instructions) if w == "HEALTHCHECK"]
    cmd = re.split(r"\bCMD\b", args, maxsplit=1)[1]
    return exec_form(cmd)


def compose_test_argv(test: list[str] | str) -> list[str]:
    """A compose healthcheck ``test`` as an argv."""
    if isinstance(test, str):
        return ["/bin/sh", "-c", test]
    kind, *rest = test
    if kind == "CMD":
        return rest
    if kind == "CMD-SHELL":
        return ["/bin/sh", "-c", rest[0]]
    raise ValueError(f"healthcheck test {test!r}")


def dashboard_metric_names() -> set[str]:
    """Metric names the Grafana dashboard queries."""
    dashboard = json.loads((DEPLOY / "grafana/dashboards/shoal.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return {m for e in exprs for m in re.findall(r"\bshoal_[a-z_]+", e)}


# --- alert rules ---------------------------------------------------------------------------------

ALERT_RULES_FILE = DEPLOY / "prometheus" / "alerts.yml"
#: PromQL's binary operators and modifiers, which look like metric names in an expression.
_PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "group_left", "group_right", "inf", "nan"}


def alert_rules() -> list[dict[str, Any]]:
    """Every rule of deploy/prometheus/alerts.yml, over its groups."""
    doc = yaml.safe_load(ALERT_RULES_FILE.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its words, less label matchers, strings, ranges,
    grouping clauses, functions and aggregations (a word before a parenthesis) and operators."""
    bare = re.sub(r'\{[^}]*\}|"[^"]*"|\[[^\]]*\]', " ", expr)
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", bare)
    words = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", bare))
    return words - _PROMQL_WORDS


def alert_metric_names() -> set[str]:
    """The node's metrics the alert rules use (``up``, Prometheus's own, left out)."""
    return {name for rule in alert_rules() for name in promql_metric_names(rule["expr"])} - {"up"}


def exposition_names(text: str) -> set[str]:
    """Every sample name the families of a /prometheus exposition declare (``# TYPE`` lines, so
    families without samples count): a counter's ``_total`` (which prometheus-client's ``# TYPE``
    line already carries), a histogram's ``_bucket``, ``_sum`` and ``_count``, any other's own name."""
    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\w+) (\w+)$", text, re.M):
        if kind == "counter":
            names.add(name if name.endswith("_total") else f"{name}_total")
        elif kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    return names


# --- Helm --------------------------------------------------------------------------------------

def chart_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def chart_schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


def template_texts() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((CHART / "templates").iterdir()) if p.is_file()}


def values_paths_used(text: str) -> set[str]:
    return set(re.findall(r"\$?\.Values\.([A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*)", text))


def lookup(values: dict[str, Any], path: str) -> tuple[bool, Any]:
    node: Any = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def go_value(value: Any) -> str:
    """How Go's ``%v`` prints a value: an int as digits, a float64 (every number read from
    values.yaml, in Helm) in %g style, so 67108864.0 prints as ``6.7108864e+07``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value == 0:
            return "0"
        exp = math.floor(math.log10(abs(value)))
        if exp < -4 or exp >= 6:  # strconv 'g' with the shortest precision switches at 1e6
            for digits in range(17):
                text = f"{value:.{digits}e}"
                if float(text) == value:
                    return text
        return repr(value).removesuffix(".0")
    return str(value)


_CONDITION = re.compile(r'^\s*\{\{-?\s*(if|else if|else|end|with|range)\b\s*(.*?)\s*-?\}\}\s*$')


_VALUE = r"\.Values\.[\w.]+"
_SIMPLE_CONDITION = re.compile(rf'(?:not )?{_VALUE}|(?:eq|ne) {_VALUE} "[^"]*"')


def _condition(expr: str, values: dict[str, Any]) -> bool | None:
    """Helm's truth of ``.Values.a``, ``not .Values.a``, ``eq``/``ne .Values.a "literal"``; None
    for any other condition."""
    if not _SIMPLE_CONDITION.fullmatch(expr):
        return None

    def value(path: str) -> Any:
        found, v = lookup(values, path[len(".Values."):])
        assert found, f"{path} is not in values.yaml"
        return v

    op, _, rest = expr.partition(" ")
    if op == "not":
        return not value(rest)
    if op in ("eq", "ne"):
        path, _, literal = rest.partition(" ")
        return (value(path) == literal.strip('"')) == (op == "eq")
    return bool(value(expr))


def resolve_conditionals(text: str, values: dict[str, Any]) -> str:
    """``text`` with its line-level ``if``/``else if``/``else``/``end`` blocks resolved against ``values``.

    Only whole-line actions on simple conditions are resolved (see :func:`_condition`); other
    ``if`` blocks and ``with``/``range`` blocks are kept as they are, so the result is still a
    template for everything else.
    """
    out: list[str] = []
    # One entry per open block: None for a kept block; else [taking now, some branch taken].
    stack: list[list[bool] | None] = []
    for line in text.splitlines():
        m = _CONDITION.match(line)
        active = all(s is None or s[0] for s in stack)
        if not m:
            if active:
                out.append(line)
            continue
        action, expr = m.groups()
        condition = _condition(expr, values) if action in ("if", "else if") else None
        if action in ("with", "range") or (action == "if" and condition is None):
            stack.append(None)
            if active:
                out.append(line)
        elif action == "if":
            taken = active and bool(condition)
            stack.append([taken, taken])
        elif action in ("else if", "else"):
            top = stack[-1]
            if top is None:
                if active:
                    out.append(line)
                continue
            assert action == "else" or condition is not None, f"the test cannot resolve {line!r}"
            outer = all(s is None or s[0] for s in stack[:-1])
            taken = outer and not top[1] and (action == "else" or bool(condition))
            top[0], top[1] = taken, top[1] or taken
        else:  # end
            if stack.pop() is None and all(s is None or s[0] for s in stack):
                out.append(line)
    assert not stack, "unbalanced blocks"
    return "\n".join(out) + "\n"


_ACTION = re.compile(r"\{\{-?\s*(if|with|range|define|block|end)\b")


def define_body(helpers: str, name: str) -> str:
    """The text between ``{{- define "name" -}}`` and its own ``{{- end -}}`` in ``helpers``."""
    start = helpers.index(f'{{{{- define "{name}" -}}}}')
    body_start = helpers.index("\n", start) + 1
    depth = 1
    for m in _ACTION.finditer(helpers, body_start):
        depth += -1 if m.group(1) == "end" else 1
        if depth == 0:
            return helpers[body_start:helpers.rindex("\n", body_start, m.start()) + 1]
    raise AssertionError(f"define {name!r} is not closed")


def chart_env_text(helpers: str) -> str:
    """The ``shoal.env`` helper (every container's environment) as a template with an ``env:`` key."""
    body = define_body(helpers, "shoal.env")
    return "env:\n" + "".join(f"  {line}\n" for line in body.splitlines())


def expand_dependent_vars(env: dict[str, str]) -> dict[str, str]:
    """The kubelet's ``$(VAR)`` expansion: a reference to a variable defined earlier in the list is
    replaced by its value (``$$`` is a literal ``$``); an unknown reference stays as written."""
    out: dict[str, str] = {}
    for name, value in env.items():
        out[name] = re.sub(r"\$\$|\$\((\w+)\)",
                           lambda m: "$" if m.group(0) == "$$" else out.get(m.group(1), m.group(0)), value)
    return out


def render_env_block(statefulset: str, values: dict[str, Any], includes: dict[str, str]) -> list[dict[str, Any]]:
    """The container ``env`` list of a template (the StatefulSet's, or :func:`chart_env_text`),
    rendered with a small evaluator.

    Its ``if`` blocks are resolved first (:func:`resolve_conditionals`). It understands the
    pipelines the env block uses — ``.Values.a.b``, ``include "name" .`` and a
    quoted literal, piped through ``int``, ``int64`` and ``quote`` — and numbers behave as in Helm
    (float64, so ``67108864 | quote`` would be ``"6.7108864e+07"``). Anything else fails the test
    with a request to extend the evaluator.
    """
    lines = resolve_conditionals(statefulset, values).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "env:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = []
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        block.append(line)

    def evaluate(expr: str) -> str:
        stages = [s.strip() for s in expr.strip().lstrip("-").rstrip("-").split("|")]
        head = stages[0]
        value: Any
        if head.startswith(".Values."):
            found, value = lookup(values, head[len(".Values."):])
            assert found, f"{head} is not in values.yaml"
            value = float(value) if isinstance(value, int) and not isinstance(value, bool) else value
        elif m := re.fullmatch(r'include "([\w.]+)" \.', head):
            assert m.group(1) in includes, f"the test's env evaluator has no value for include {m.group(1)!r}"
            value = includes[m.group(1)]
        elif m := re.fullmatch(r'"([^"]*)"', head):
            value = m.group(1)
        else:
            raise AssertionError(f"the test's env evaluator does not know {head!r}: extend render_env_block")
        for fn in stages[1:]:
            if fn in ("int", "int64"):
                value = int(float(value))
            elif fn == "quote":
                value = json.dumps(go_value(value))
            else:
                raise AssertionError(f"the test's env evaluator does not know | {fn}: extend render_env_block")
        return go_value(value) if not isinstance(value, str) else value

    rendered = re.sub(r"\{\{(.*?)\}\}", lambda m: evaluate(m.group(1)), "\n".join(block))
    env = yaml.safe_load(rendered)
    assert isinstance(env, list)
    return env


# --- the chart's pods ------------------------------------------------------------------------

def bootstrap_count(values: dict[str, Any]) -> int:
    """shoal.bootstrapReplicas on a first install: initialReplicas, else replicas."""
    return values["initialReplicas"] or values["replicas"]


def rendered_env(values: dict[str, Any], release: str = "shoal", namespace: str = "queues") -> list[dict[str, Any]]:
    """Every container's env (the shoal.env helper); the helpers it includes as _helpers.tpl defines
    them (checked separately), on a first install."""
    full = release if "shoal" in release else f"{release}-shoal"
    domain = f"{full}-peers.{namespace}.svc.{values['clusterDomain']}"
    first = range(bootstrap_count(values))
    secret_name = values["cluster"]["existingSecret"] or full
    return render_env_block(chart_env_text(template_texts()["_helpers.tpl"]), values,
                            {"shoal.peers": ",".join(f"{full}-{i}={full}-{i}.{domain}" for i in first),
                             "shoal.bootstrapNodes": ",".join(f"{full}-{i}" for i in first),
                             "shoal.podDomain": domain, "shoal.secretName": secret_name,
                             "shoal.identityName": f"{full}-identity"})


#: The identity ConfigMap as the chart writes it on install (identity.yaml; the id is random there).
IDENTITY = {"cluster-id": "shoal-k8s0generated0", "bootstrap-replicas": "3"}


def pod_env(values: dict[str, Any], ordinal: int, secret: dict[str, str],
             identity: dict[str, str] = IDENTITY) -> dict[str, str]:
    """What the kubelet gives pod <ordinal>: plain values (``$(VAR)`` references expanded), the pod
    name, the Secret's and the identity ConfigMap's keys."""
    env = {}
    for item in rendered_env(values):
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "metadata.name"
            env[item["name"]] = f"shoal-{ordinal}"
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            assert ref["name"] == "shoal-identity" and not ref.get("optional")
            env[item["name"]] = identity[ref["key"]]
        else:
            ref = source["secretKeyRef"]
            if ref["key"] in secret:
                env[item["name"]] = secret[ref["key"]]
            else:
                assert ref.get("optional"), f"{item['name']}: key {ref['key']} missing and not optional"
    return expand_dependent_vars(env)


def shell_join(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


# --- a small renderer for the chart's simpler templates ----------------------------------------

_TEMPLATE_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)


def render_template(text: str, values: dict[str, Any], includes: dict[str, str]) -> str:
    """``text`` rendered as Helm would, for templates made of the constructs this knows.

    Go's whitespace trimming (``{{-``, ``-}}``); ``if``/``with``/``end`` blocks on ``.Values``
    paths (a ``with`` sets the dot); pipelines whose head is ``.Values.a.b``, ``.``,
    ``include "name" .`` (from ``includes``), ``.Files.Get "path"`` (a file of the chart) or a
    quoted literal, through ``nindent N``, ``indent N``, ``toYaml`` and ``quote``. Anything else
    fails the test with a request to extend the renderer.
    """
    # (literal text, action) pairs, the trims applied to the text around each action.
    parts: list[list[str]] = []
    pos = 0
    trim_next = False
    for m in _TEMPLATE_ACTION.finditer(text):
        literal = text[pos:m.start()]
        literal = literal.lstrip() if trim_next else literal
        parts.append([literal.rstrip() if m.group(1) else literal, m.group(2)])
        trim_next, pos = bool(m.group(3)), m.end()
    tail = text[pos:].lstrip() if trim_next else text[pos:]

    def value_of(head: str, dot: Any) -> Any:
        if head == ".":
            return dot
        if head.startswith(".Values."):
            found, value = lookup(values, head[len(".Values."):])
            assert found, f"{head} is not in values.yaml"
            return value
        if m := re.fullmatch(r'include "([\w.]+)" \.', head):
            assert m.group(1) in includes, f"the renderer has no value for include {m.group(1)!r}"
            return includes[m.group(1)]
        if m := re.fullmatch(r'\.Files\.Get "([^"]+)"', head):
            return (CHART / m.group(1)).read_text()
        if m := re.fullmatch(r'"([^"]*)"', head):
            return m.group(1)
        raise AssertionError(f"the renderer does not know {head!r}: extend render_template")

    def evaluate(pipeline: str, dot: Any) -> str:
        head, *stages = [s.strip() for s in pipeline.split("|")]
        if m := re.fullmatch(r"(toYaml|quote) (.+)", head):  # `fn x` is `x | fn`
            head, stages = m.group(2), [m.group(1), *stages]
        value = value_of(head, dot)
        for stage in stages:
            fn, *args = stage.split()
            if fn in ("nindent", "indent"):
                indented = "\n".join(" " * int(args[0]) + line for line in str(value).split("\n"))
                value = "\n" + indented if fn == "nindent" else indented
            elif fn == "toYaml":
                value = yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip("\n")
            elif fn == "quote":
                value = json.dumps(go_value(value))
            else:
                raise AssertionError(f"the renderer does not know | {fn}: extend render_template")
        return value if isinstance(value, str) else go_value(value)

    def block(i: int, dot: Any, emit: bool) -> tuple[str, int]:
        """Render parts from ``i`` up to the ``end`` closing the block (or the end); (output, next index)."""
        out: list[str] = []
        while i < len(parts):
            literal, action = parts[i]
            if emit:
                out.append(literal)
            i += 1
            word, _, rest = action.partition(" ")
            if word == "end":
                return "".join(out), i
            if word in ("if", "with"):
                cond = value_of(rest, dot)
                body, i = block(i, cond if word == "with" else dot, emit and bool(cond))
                out.append(body)
            elif action.startswith("/*"):
                continue
            elif emit:
                out.append(evaluate(action, dot))
        return "".join(out), i

    rendered, end = block(0, None, True)
    assert end == len(parts), "an `end` without its block"
    return rendered + tail
