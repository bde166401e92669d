#!/usr/bin/env python3
"""The checks behind integration/scripts/check-deploy.sh (which installs this script's
dependencies in a venv, renders every kustomization under deploy/ with `kubectl kustomize`
and then runs this). Offline: no cluster, no network.

  check_deploy.py --repo ROOT --rendered DIR [--kubernetes-version 1.33.0]

DIR holds the rendered kustomizations and index.tsv ("<kustomization dir>\t<file>" lines).
Every check appends to a list of errors; the script exits 1 if any, after printing them all.
Before the real checks, self-tests feed each check a broken input (a bogus metric name, an
unknown field, Requires=, an extra RBAC verb, an unknown config key) and fail the run if
the check does not catch it: a check that cannot fail checks nothing.
"""

import argparse
import copy
import json
import os
import re
import sys
from pathlib import Path

import jsonschema
import yaml

import kubernetes_validate.utils as kv

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

IMAGE = "ghcr.io/qoslet/qoslet:0.1.0"
NAMESPACE = "qoslet-system"

# ---------------------------------------------------------------------------------------
# Reading qoslet's Rust sources: string literals of non-test code
# ---------------------------------------------------------------------------------------


def rust_files(repo):
    """Non-test Rust sources: no target/, integration/, tests/ or benches/ directories,
    no tests.rs, no src/bin/ (benchmarks), and each file cut at its inline test module."""
    for path in sorted(repo.rglob("*.rs")):
        rel = path.relative_to(repo).parts
        if rel[0] in ("target", "integration") or "tests" in rel or "benches" in rel:
            continue
        if path.name == "tests.rs" or (len(rel) > 2 and rel[-2] == "bin"):
            continue
        text = path.read_text(encoding="utf-8")
        cut = re.search(r"^#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod \w+\s*\{", text, re.M)
        if cut:
            text = text[: cut.start()]
        yield path, text


def string_literals(src):
    """The contents of the string literals of Rust source `src` (comments, char literals and
    lifetimes skipped; raw and byte strings included; escapes left as written)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', src[i:]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            hashes = len(re.match(r"r(#*)", src[i:]).group(1))
            start = i + 2 + hashes
            end = src.find('"' + "#" * hashes, start)
            out.append(src[start:end])
            i = end + 1 + hashes
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(src[i + 1 : j])
            i = j + 1
        elif c == "'":
            if src.startswith("\\", i + 1):  # '\n', '\'', '\u{..}'
                j = src.find("'", i + 3)
                i = j + 1
            elif i + 2 < n and src[i + 2] == "'":  # 'x'
                i += 3
            else:  # a lifetime
                i += 1
        else:
            i += 1
    return out


def exported_metrics(repo):
    """The metric names qoslet exports, and the label names its samples carry.

    Names: every `qoslet_...` word in a string literal of non-test code. Words ending in
    `_` are prefixes (`qoslet_pod_`, `qoslet_container_`): metrics/src/prom.rs builds
    `{prefix}{suffix}` from its per-cgroup families, whose suffixes are the first string
    of each tuple ending in a unit (`_total`, `_bytes`, `_cores`, `_seconds`) plus the
    `{prefix}...` names it formats. Labels: the first string of a (label, value) pair whose
    value is not a string literal, e.g. `("reason", m.as_str())`, or that opens a label
    slice, e.g. `&[("result", "sent")]`."""
    names, prefixes, labels, suffixes = set(), set(), set(), set()
    for path, text in rust_files(repo):
        for lit in string_literals(text):
            for word in re.findall(r"(?<![A-Za-z0-9_])qoslet_[a-z0-9_]*", lit):
                (prefixes if word.endswith("_") else names).add(word)
        labels.update(re.findall(r'\(\s*"([a-z_][a-z0-9_]*)"\s*,\s*(?=[^"\s])', text))
        labels.update(re.findall(r'&\[\s*\(\s*"([a-z_][a-z0-9_]*)"\s*,', text))  # &[("result", "sent")]
        if path.parts[-3:] == ("metrics", "src", "prom.rs"):
            for s in re.findall(r'\(\s*"([a-z][a-z0-9_]*)"\s*,', text):
                if re.search(r"_(total|bytes|cores|seconds)$", s) and not s.startswith("qoslet_"):
                    suffixes.add(s)
            for lit in string_literals(text):
                suffixes.update(re.findall(r"\{prefix\}([a-z][a-z0-9_]*)", lit))
    names |= {p + s for p in prefixes for s in suffixes}
    return names, prefixes, suffixes, labels


# Samples every working extractor must find: if one is missing, the extraction broke (a
# refactor of prom.rs, a new way of naming metrics) and the dashboard check would be
# comparing against the wrong set.
SENTINEL_METRICS = {
    "qoslet_node_cpu_usage_cores",
    "qoslet_pod_cpu_usage_cores",
    "qoslet_container_memory_working_set_bytes",
    "qoslet_pod_pressure_stalled_seconds_total",
    "qoslet_pod_io_read_bytes_total",
    "qoslet_evictions_total",
    "qoslet_front_calls_total",
    "qoslet_engine_tick_seconds",
    "qoslet_policy_source_state",
    "qoslet_metrics_stale",
    "qoslet_nri_events_total",
}

# Labels Prometheus adds to every target: prometheus-scrape.yaml and servicemonitor.yaml set
# node and instance (job comes from the job name).
TARGET_LABELS = {"node", "instance", "job", "__name__"}

# ---------------------------------------------------------------------------------------
# PromQL: metric and label names of a query
# ---------------------------------------------------------------------------------------

PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "atan2", "inf", "nan", "start", "end",
}


def promql_names(expr):
    """(metric names, label names) used by a PromQL expression with Grafana variables."""
    labels = set()
    e = re.sub(r"\$\{[^}]*\}|\$__\w+|\$\w+", "", expr)  # Grafana variables
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', e)  # string literals
    for block in re.findall(r"\{([^}]*)\}", e):  # label matchers
        labels.update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", block))
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges and subqueries
    for kw in ("by", "without", "on", "ignoring", "group_left", "group_right"):
        for block in re.findall(r"\b%s\s*\(([^)]*)\)" % kw, e):
            labels.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", block))
        e = re.sub(r"\b%s\s*\([^)]*\)" % kw, " ", e)
    metrics = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)", e):
        word = m.group(1)
        if word.lower() in PROMQL_KEYWORDS:
            continue
        if re.match(r"\s*\(", e[m.end():]):  # a function or an aggregation
            continue
        metrics.add(word)
    return metrics, labels


def dashboard_queries(dash):
    """(where, expr, legendFormat) of every panel target and templating query."""
    out = []

    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash.get("panels", [])):
        for t in p.get("targets", []):
            out.append((f"panel {p.get('title')!r} target {t.get('refId')}", t.get("expr", ""), t.get("legendFormat", "")))
        if p.get("type") != "row" and not p.get("targets"):
            out.append((f"panel {p.get('title')!r}", "", ""))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v.get("query")
            q = q.get("query", "") if isinstance(q, dict) else (q or "")
            m = re.fullmatch(r"\s*label_values\(\s*(.*)\s*,\s*([A-Za-z_]\w*)\s*\)\s*", q)
            if m:
                out.append((f"variable {v['name']}", m.group(1), "{{%s}}" % m.group(2)))
            else:
                out.append((f"variable {v['name']}", q, ""))
    return out


def check_dashboard(dash, exported, labels):
    errors = []
    known_labels = labels | TARGET_LABELS
    queries = dashboard_queries(dash)
    if not queries:
        errors.append("the dashboard has no queries")
    for where, expr, legend in queries:
        if not expr.strip():
            errors.append(f"{where}: no query")
            continue
        metrics, used_labels = promql_names(expr)
        used_labels |= set(re.findall(r"\{\{\s*([A-Za-z_]\w*)\s*\}\}", legend))
        if not any(m.startswith("qoslet_") for m in metrics):
            errors.append(f"{where}: names no qoslet metric: {expr}")
        for m in sorted(metrics - exported):
            errors.append(f"{where}: metric {m} is not exported by qoslet")
        for label in sorted(used_labels - known_labels):
            errors.append(f"{where}: label {label} is on no qoslet sample nor target")
    return errors


def check_dashboard_layout(dash):
    errors, cells = [], {}
    for p in dash.get("panels", []):
        g = p.get("gridPos", {})
        if g.get("x", 0) + g.get("w", 0) > 24:
            errors.append(f"panel {p.get('title')!r} is wider than the grid")
        for y in range(g.get("y", 0), g.get("y", 0) + g.get("h", 0)):
            for x in range(g.get("x", 0), g.get("x", 0) + g.get("w", 0)):
                if (x, y) in cells:
                    errors.append(f"panel {p.get('title')!r} overlaps {cells[(x, y)]!r}")
                    break
                cells[(x, y)] = p.get("title")
    ids = [p.get("id") for p in dash.get("panels", [])]
    if len(ids) != len(set(ids)):
        errors.append("panel ids are not unique")
    return errors


# ---------------------------------------------------------------------------------------
# Kubernetes objects
# ---------------------------------------------------------------------------------------

# monitoring.coreos.com/v1 ServiceMonitor: the fields of prometheus-operator's CRD
# (monitoring.coreos.com_servicemonitors.yaml, operator v0.84) that a qoslet ServiceMonitor
# may use, strict (additionalProperties: false): a subset, written here because
# kubernetes-validate has Kubernetes' own schemas only.
_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
_RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "action": {"enum": [
            "replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod",
            "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep",
            "lowercase", "Lowercase", "uppercase", "Uppercase", "keepequal", "KeepEqual",
            "dropequal", "DropEqual"]},
        "modulus": {"type": "integer"},
        "regex": {"type": "string"},
        "replacement": {"type": "string"},
        "separator": {"type": "string"},
        "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": _LABEL_NAME}},
        "targetLabel": {"type": "string"},
    },
}
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["key", "operator"],
            "properties": {"key": {"type": "string"}, "operator": {"type": "string"},
                           "values": {"type": "array", "items": {"type": "string"}}}}},
    },
}
SERVICEMONITOR_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object", "additionalProperties": False, "required": ["name", "namespace"],
            "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                           "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                           "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                    "any": {"type": "boolean"},
                    "matchNames": {"type": "array", "items": {"type": "string"}}}},
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "sampleLimit": {"type": "integer"},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "port": {"type": "string"},
                        "targetPort": {"type": ["string", "integer"]},
                        "path": {"type": "string"},
                        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                        "params": {"type": "object"},
                        "interval": {"type": "string", "pattern": _DURATION},
                        "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                        "honorLabels": {"type": "boolean"},
                        "honorTimestamps": {"type": "boolean"},
                        "followRedirects": {"type": "boolean"},
                        "enableHttp2": {"type": "boolean"},
                        "filterRunning": {"type": "boolean"},
                        "relabelings": {"type": "array", "items": _RELABEL},
                        "metricRelabelings": {"type": "array", "items": _RELABEL},
                    }}},
            },
        },
    },
}
OWN_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICEMONITOR_SCHEMA}

# Custom kinds with neither a schema here nor their CRD in the same render: skipped with a
# note, each for a stated reason. Anything else without a schema is an error.
SKIP_KINDS = {
    ("slo.koordinator.sh/v1alpha1", "NodeSLO"): "a custom resource (its CRD: deploy/kubernetes/crds, from `qoslet crd`)",
    ("slo.koordinator.sh/v1alpha1", "NodeMetric"): "a custom resource (its CRD: deploy/kubernetes/crds, from `qoslet crd`)",
}


def strict_crd_schema(schema):
    """A CRD's openAPIV3Schema made strict: objects with properties take no others (as the
    API server prunes them), unless x-kubernetes-preserve-unknown-fields."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
                node["properties"].setdefault("apiVersion", {"type": "string"})
                node["properties"].setdefault("kind", {"type": "string"})
                node["properties"].setdefault("metadata", {"type": "object"})
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    return s


def validate_objects(objs, version, notes):
    """Every object against Kubernetes `version`'s schemas, strict (kubernetes-validate's
    own validate(), as `kubernetes-validate --strict` runs it)."""
    errors = []
    crds = {}
    for o in objs:
        if o.get("kind") == "CustomResourceDefinition":
            spec = o.get("spec", {})
            for v in spec.get("versions", []):
                key = (f"{spec.get('group')}/{v.get('name')}", spec.get("names", {}).get("kind"))
                crds[key] = strict_crd_schema(v.get("schema", {}).get("openAPIV3Schema", {}))
    for o in objs:
        key = (o.get("apiVersion"), o.get("kind"))
        name = f"{o.get('kind')}/{o.get('metadata', {}).get('name')}"
        if key in OWN_SCHEMAS or key in crds:
            schema = OWN_SCHEMAS.get(key) or crds[key]
            try:
                jsonschema.validate(o, schema)
            except jsonschema.ValidationError as e:
                errors.append(f"{name}: {'.'.join(map(str, e.path))}: {e.message}")
            continue
        try:
            kv.validate(o, version, strict=True)
        except kv.ValidationError as e:
            errors.append(f"{name}: {'.'.join(map(str, e.path))}: {e.message}")
        except kv.SchemaNotFoundError:
            if key in SKIP_KINDS:
                notes.append(f"{name} ({key[0]}) not validated: {SKIP_KINDS[key]}")
            else:
                errors.append(f"{name}: no schema for {key[0]} {key[1]} in Kubernetes {version}, "
                              "none in check_deploy.py (OWN_SCHEMAS) and no CRD in the render")
    return errors


# The ClusterRole, rule by rule: (apiGroup, resource) -> verbs. Exactly these: a rule or a
# verb more (or fewer) fails the check, so widening qoslet's rights is a visible change here.
EXPECTED_RULES = {
    ("", "pods"): {"list", "watch"},
    ("", "nodes"): {"list", "watch"},
    ("slo.koordinator.sh", "nodeslos"): {"list", "watch"},
    ("slo.koordinator.sh", "nodemetrics"): {"get", "create"},
    ("slo.koordinator.sh", "nodemetrics/status"): {"update"},
    ("", "pods/eviction"): {"create"},
    ("", "events"): {"create"},
}


# components/colocation (kubernetes.batchResources): exactly these on top of the ClusterRole.
COLOCATION_RULES = {("", "nodes/status"): {"patch"}}
SLO_CONFIG_RULES = [{"apiGroups": [""], "resources": ["configmaps"],
                     "resourceNames": ["slo-controller-config"], "verbs": ["list", "watch"]}]
SLO_CONFIG_NAMESPACE = "koordinator-system"


def rules_of(role, allowed_keys=("apiGroups", "resources", "verbs")):
    errors, got = [], {}
    for rule in role.get("rules", []):
        if set(rule) - set(allowed_keys):
            errors.append(f"{role['kind']} {role['metadata']['name']}: rule with {sorted(set(rule) - set(allowed_keys))}: {rule}")
        for g in rule.get("apiGroups", []):
            for r in rule.get("resources", []):
                got.setdefault((g, r), set()).update(rule.get("verbs", []))
    return errors, got


def compare_rules(role, expected):
    errors, got = rules_of(role)
    for key in sorted(set(got) | set(expected)):
        want, have = expected.get(key, set()), got.get(key, set())
        if want != have:
            errors.append(f"{role['kind']} {role['metadata']['name']}: {key[0] or 'core'}/{key[1]}: verbs {sorted(have)}, expected {sorted(want)}")
    return errors


def check_rbac(objs):
    errors = []
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objs if o.get("kind") in ("ClusterRole", "Role")}
    colocation = ("ClusterRole", "qoslet-colocation") in roles or ("Role", "qoslet-slo-config") in roles
    want = {("ClusterRole", "qoslet")} | ({("ClusterRole", "qoslet-colocation"), ("Role", "qoslet-slo-config")} if colocation else set())
    if set(roles) != want:
        return [f"expected roles {sorted(want)}, found {sorted(roles)}"]
    errors += compare_rules(roles[("ClusterRole", "qoslet")], EXPECTED_RULES)
    subject = [{"kind": "ServiceAccount", "name": "qoslet", "namespace": NAMESPACE}]
    binds = [o for o in objs if o.get("kind") in ("ClusterRoleBinding", "RoleBinding")]
    bound = {(b["kind"], b["metadata"]["name"], b["metadata"].get("namespace"), b["roleRef"]["kind"], b["roleRef"]["name"])
             for b in binds if b.get("subjects") == subject}
    want_binds = {("ClusterRoleBinding", "qoslet", None, "ClusterRole", "qoslet")}
    if colocation:
        errors += compare_rules(roles[("ClusterRole", "qoslet-colocation")], COLOCATION_RULES)
        slo = roles[("Role", "qoslet-slo-config")]
        if slo["metadata"].get("namespace") != SLO_CONFIG_NAMESPACE or slo.get("rules") != SLO_CONFIG_RULES:
            errors.append(f"Role qoslet-slo-config: expected {SLO_CONFIG_RULES} in {SLO_CONFIG_NAMESPACE}, found "
                          f"{slo.get('rules')} in {slo['metadata'].get('namespace')}")
        want_binds |= {("ClusterRoleBinding", "qoslet-colocation", None, "ClusterRole", "qoslet-colocation"),
                       ("RoleBinding", "qoslet-slo-config", SLO_CONFIG_NAMESPACE, "Role", "qoslet-slo-config")}
    if len(binds) != len(want_binds) or bound != want_binds:
        errors.append(f"expected bindings {sorted(want_binds, key=str)} to ServiceAccount {NAMESPACE}/qoslet, found {binds}")
    return errors


# Each DaemonSet's container security: the capabilities added, whether privileged.
EXPECTED_SECURITY = {
    "qoslet": {"add": ["SYS_RESOURCE"], "privileged": False},
    "qoslet-installer": {"add": None, "privileged": True},
}


def check_workloads(objs, where):
    errors = []
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
    cms = by_kind.get("ConfigMap", {})
    for ds in by_kind.get("DaemonSet", {}).values():
        name = ds["metadata"]["name"]
        spec = ds["spec"]["template"]["spec"]
        if ds["metadata"].get("namespace") != NAMESPACE:
            errors.append(f"{where}: DaemonSet {name} is not in {NAMESPACE}")
        if spec.get("serviceAccountName") != "qoslet" or "qoslet" not in by_kind.get("ServiceAccount", {}):
            errors.append(f"{where}: DaemonSet {name} does not run as the qoslet ServiceAccount of this render")
        if spec.get("priorityClassName") != "system-node-critical":
            errors.append(f"{where}: DaemonSet {name}: priorityClassName is not system-node-critical")
        if {"operator": "Exists"} not in spec.get("tolerations", []):
            errors.append(f"{where}: DaemonSet {name} does not tolerate every taint")
        for v in spec.get("volumes", []):
            cm = v.get("configMap", {}).get("name")
            if cm and cm not in cms:
                errors.append(f"{where}: DaemonSet {name}: volume {v['name']} names ConfigMap {cm}, not in the render")
            for src in v.get("projected", {}).get("sources", []):
                cm = src.get("configMap", {}).get("name")
                if cm and cm != "kube-root-ca.crt" and cm not in cms:
                    errors.append(f"{where}: DaemonSet {name}: projected ConfigMap {cm} not in the render")
        want = EXPECTED_SECURITY.get(name)
        if want is None:
            errors.append(f"{where}: DaemonSet {name}: no expected security context in check_deploy.py")
            continue
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            sc = c.get("securityContext", {})
            if c.get("image") != IMAGE:
                errors.append(f"{where}: {name}/{c['name']}: image {c.get('image')}, expected {IMAGE} (kustomize images:)")
            # qoslet's image has the binary at /usr/bin/qoslet and nothing else to run
            # (integration/image/build.sh): both DaemonSets run it
            cmd = (c.get("command") or ["/usr/bin/qoslet"])[0]
            if cmd != "/usr/bin/qoslet":
                errors.append(f"{where}: {name}/{c['name']}: runs {cmd}, not the image's /usr/bin/qoslet")
            probe = (c.get("readinessProbe") or {}).get("exec", {}).get("command")
            if probe and probe[0] != "/usr/bin/qoslet":
                errors.append(f"{where}: {name}/{c['name']}: readiness runs {probe[0]}, not the image's /usr/bin/qoslet")
            if sc.get("readOnlyRootFilesystem") is not True:
                errors.append(f"{where}: {name}/{c['name']}: readOnlyRootFilesystem is not true")
            if bool(sc.get("privileged")) != want["privileged"]:
                errors.append(f"{where}: {name}/{c['name']}: privileged is {sc.get('privileged')}, expected {want['privileged']}")
            if want["add"] is not None:
                caps = sc.get("capabilities", {})
                if caps.get("drop") != ["ALL"] or sorted(caps.get("add", [])) != sorted(want["add"]):
                    errors.append(f"{where}: {name}/{c['name']}: capabilities {caps}, expected drop [ALL] add {want['add']}")
                if sc.get("allowPrivilegeEscalation") is not False:
                    errors.append(f"{where}: {name}/{c['name']}: allowPrivilegeEscalation is not false")
            for r in ("requests", "limits"):
                if not {"cpu", "memory"} <= set(c.get("resources", {}).get(r, {})):
                    errors.append(f"{where}: {name}/{c['name']}: no cpu and memory {r}")
            if not c.get("readinessProbe"):
                errors.append(f"{where}: {name}/{c['name']}: no readinessProbe")
    return errors


# The scheduler extender's ClusterRole: read only, only what its cache holds.
EXTENDER_RULES = {
    ("", "nodes"): {"get", "list", "watch"},
    ("", "pods"): {"get", "list", "watch"},
    ("slo.koordinator.sh", "nodemetrics"): {"get", "list", "watch"},
}
# kube-scheduler's Extender (kube-scheduler/config/v1/types.go), every field it has
EXTENDER_FIELDS = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb",
                   "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources",
                   "ignorable"}


def check_extender(objs, repo):
    errors = []
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
    name = "qoslet-scheduler-extender"
    roles = by_kind.get("ClusterRole", {})
    if set(roles) != {name} or by_kind.get("Role"):
        errors.append(f"roles {sorted(roles)}: expected exactly ClusterRole {name}")
    else:
        errors += compare_rules(roles[name], EXTENDER_RULES)
    binds = by_kind.get("ClusterRoleBinding", {})
    b = binds.get(name, {})
    if set(binds) != {name} or by_kind.get("RoleBinding") or b.get("roleRef", {}).get("name") != name \
            or b.get("subjects") != [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]:
        errors.append(f"bindings {sorted(binds)}: expected ClusterRoleBinding {name} of its ServiceAccount only")
    deps = by_kind.get("Deployment", {})
    if set(deps) != {name}:
        return errors + [f"deployments {sorted(deps)}: expected {name}"]
    d = deps[name]
    spec = d["spec"]["template"]["spec"]
    if d["metadata"].get("namespace") != NAMESPACE:
        errors.append(f"Deployment {name} is not in {NAMESPACE}")
    if spec.get("serviceAccountName") != name or name not in by_kind.get("ServiceAccount", {}):
        errors.append(f"Deployment {name} does not run as its own ServiceAccount")
    if spec.get("hostNetwork") or spec.get("hostPID") or any("hostPath" in v for v in spec.get("volumes", [])):
        errors.append(f"Deployment {name} uses the host: it needs nothing of it")
    if spec.get("securityContext", {}).get("runAsNonRoot") is not True:
        errors.append(f"Deployment {name}: runAsNonRoot is not true")
    port = None
    for c in spec.get("containers", []):
        sc = c.get("securityContext", {})
        if c.get("image") != IMAGE or (c.get("command") or [None])[0] != "/usr/bin/qoslet":
            errors.append(f"{name}/{c['name']}: image {c.get('image')} command {c.get('command')}")
        if (c.get("args") or [None])[0] != "scheduler-extender":
            errors.append(f"{name}/{c['name']}: does not run `qoslet scheduler-extender`")
        if sc.get("readOnlyRootFilesystem") is not True or sc.get("allowPrivilegeEscalation") is not False \
                or sc.get("capabilities") != {"drop": ["ALL"]} or sc.get("privileged"):
            errors.append(f"{name}/{c['name']}: security context {sc}: expected read-only root, no escalation, drop ALL, add none")
        if (c.get("readinessProbe") or {}).get("httpGet", {}).get("path") != "/healthz":
            errors.append(f"{name}/{c['name']}: readiness is not GET /healthz (not ready while a watch is stale)")
        for r in ("requests", "limits"):
            if not {"cpu", "memory"} <= set(c.get("resources", {}).get(r, {})):
                errors.append(f"{name}/{c['name']}: no cpu and memory {r}")
        for a in c.get("args", []):
            if a.startswith("--listen="):
                port = int(a.rsplit(":", 1)[1])
    svc = by_kind.get("Service", {}).get(name, {})
    if [p.get("port") for p in svc.get("spec", {}).get("ports", [])] != [port]:
        errors.append(f"Service {name} does not serve the port the extender listens on ({port})")
    # the extenders entry kube-scheduler reads
    cfg = yaml.safe_load((repo / "deploy/kubernetes/scheduler-extender/kube-scheduler-config.yaml").read_text())
    errors += check_extenders_entry(cfg, port)
    return errors


def check_extenders_entry(cfg, port):
    errors = []
    if cfg.get("apiVersion") != "kubescheduler.config.k8s.io/v1" or cfg.get("kind") != "KubeSchedulerConfiguration":
        errors.append("kube-scheduler-config.yaml is not a kubescheduler.config.k8s.io/v1 KubeSchedulerConfiguration")
    ext = cfg.get("extenders") or []
    if len(ext) != 1:
        return errors + ["kube-scheduler-config.yaml: expected one extenders entry"]
    e = ext[0]
    unknown = set(e) - EXTENDER_FIELDS
    if unknown:
        errors.append(f"extenders entry: unknown fields {sorted(unknown)} (kube-scheduler refuses them)")
    want = {"filterVerb": "filter", "prioritizeVerb": "prioritize", "nodeCacheCapable": True, "ignorable": True}
    for k, v in want.items():
        if e.get(k) != v:
            errors.append(f"extenders entry: {k} is {e.get(k)!r}, expected {v!r}")
    if not isinstance(e.get("weight"), int) or e["weight"] <= 0:
        errors.append("extenders entry: weight must be > 0 with a prioritizeVerb (validateExtenders)")
    if not str(e.get("urlPrefix", "")).startswith("http://") or not str(e.get("urlPrefix")).endswith(f":{port}"):
        errors.append(f"extenders entry: urlPrefix {e.get('urlPrefix')!r} does not name the extender's port {port}")
    if e.get("bindVerb") or e.get("managedResources"):
        errors.append("extenders entry: the extender neither binds nor manages resources")
    return errors


def config_of(objs):
    """The qoslet.yaml of the render's qoslet-config ConfigMap."""
    for o in objs:
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("qoslet-config"):
            return o["data"]["qoslet.yaml"]
    return None


# ---------------------------------------------------------------------------------------
# qoslet's config files: every key must be one qoslet knows (it refuses unknown keys)
# ---------------------------------------------------------------------------------------

# Maps whose keys are not checked: kubelet's signal names (data, not keys), and policy:,
# which takes any Koordinator NodeSLO spec leniently (fields qoslet does not implement are
# set aside with a warning, never refused: docs/configuration.md).
FREE_FORM = {"evictionHard", "evictionSoft", "evictionSoftGracePeriod", "evictionMinimumReclaim", "policy"}


def rust_config_keys(repo):
    """Every camelCase name a serde field of non-test code could have: field names turned
    camelCase, plus every `rename`/`alias` given."""
    keys = set()
    for _, text in rust_files(repo):
        for f in re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?([a-z_][a-z0-9_]*)\s*:\s*[A-Za-z&(\[]", text, re.M):
            parts = f.split("_")
            keys.add(parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:]))
        keys.update(re.findall(r'(?:rename|alias)\s*=\s*"([^"]*)"', text))
    return keys


def check_config_keys(cfg, known, where):
    errors = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                p = f"{path}.{k}" if path else str(k)
                if str(k) not in known:
                    errors.append(f"{where}: key {p} is not a qoslet config key (qoslet refuses unknown keys)")
                if str(k) not in FREE_FORM:
                    walk(v, p)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(cfg, "")
    return errors


def flatten(cfg, path=""):
    out = {}
    if isinstance(cfg, dict):
        for k, v in cfg.items():
            out.update(flatten(v, f"{path}.{k}" if path else k))
    else:
        out[path] = cfg
    return out


# The proxy overlay's config may differ from base's in these keys only.
PROXY_ONLY_DIFFERENCES = {"metricsListen", "resctrlRoot", "kubernetes.kubeconfig"}


def check_mode_configs(base_cfg, proxy_cfg):
    errors = []
    b, p = flatten(base_cfg), flatten(proxy_cfg)
    for key in sorted(set(b) | set(p)):
        if b.get(key) != p.get(key) and key not in PROXY_ONLY_DIFFERENCES:
            errors.append(f"proxy/qoslet.yaml differs from base/qoslet.yaml in {key} ({b.get(key)!r} vs {p.get(key)!r}); "
                          f"only {sorted(PROXY_ONLY_DIFFERENCES)} may")
    if base_cfg.get("kubernetes", {}).get("enable") is not True:
        errors.append("base/qoslet.yaml: kubernetes.enable is not true")
    if base_cfg.get("metricsListen") != "0.0.0.0:9316":
        errors.append("base/qoslet.yaml: metricsListen is not 0.0.0.0:9316 (the pod's network: probes and Prometheus)")
    if proxy_cfg.get("metricsListen") != "${HOST_IP}:9316":
        errors.append("proxy/qoslet.yaml: metricsListen is not ${HOST_IP}:9316 (the installer fills in the node IP)")
    if proxy_cfg.get("kubernetes", {}).get("kubeconfig") != "/var/lib/qoslet/kube/kubeconfig":
        errors.append("proxy/qoslet.yaml: kubernetes.kubeconfig is not the installer's /var/lib/qoslet/kube/kubeconfig")
    return errors


# ---------------------------------------------------------------------------------------
# systemd, kubelet and containerd snippets
# ---------------------------------------------------------------------------------------


def unit_directives(text):
    out = []
    section = None
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(("#", ";")):
            continue
        if s.startswith("["):
            section = s
            continue
        k, _, v = s.partition("=")
        out.append((section, k.strip(), v.strip()))
    return out


def check_kubelet_dropin(text, where):
    errors = []
    d = unit_directives(text)
    have = {(s, k): v for s, k, v in d}
    for k in ("Wants", "After"):
        if "qoslet.service" not in have.get(("[Unit]", k), "").split():
            errors.append(f"{where}: no {k}=qoslet.service in [Unit]")
    for s, k, v in d:
        if k in ("Requires", "Requisite", "BindsTo", "PartOf") and "qoslet.service" in v.split():
            errors.append(f"{where}: {k}=qoslet.service: a restart or stop of qoslet would restart or stop kubelet (use Wants=)")
        if "container-runtime-endpoint" in v:
            errors.append(f"{where}: sets the deprecated --container-runtime-endpoint flag (use containerRuntimeEndpoint in KubeletConfiguration)")
    return errors


def check_snippets(repo):
    errors = []
    deploy = repo / "deploy"
    errors += check_kubelet_dropin((deploy / "kubelet-drop-in.conf").read_text(), "deploy/kubelet-drop-in.conf")
    unit = dict(((s, k), v) for s, k, v in unit_directives((deploy / "systemd/qoslet.service").read_text()))
    if not unit.get(("[Service]", "ExecStart"), "").startswith("/usr/local/bin/qoslet proxy"):
        errors.append("deploy/systemd/qoslet.service: ExecStart is not /usr/local/bin/qoslet proxy ...")
    frag = yaml.safe_load((deploy / "kubelet-config.d/50-qoslet.conf").read_text())
    if frag != {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
                "containerRuntimeEndpoint": "unix:///run/qoslet/qoslet.sock"}:
        errors.append(f"deploy/kubelet-config.d/50-qoslet.conf: not the one-key KubeletConfiguration fragment: {frag}")
    nri = tomllib.loads((deploy / "kubernetes/nri/containerd-nri.toml").read_text())
    sec = nri.get("plugins", {}).get("io.containerd.nri.v1.nri", {})
    want = {"disable": False, "socket_path": "/var/run/nri/nri.sock",
            "plugin_registration_timeout": "5s", "plugin_request_timeout": "2s"}
    for k, v in want.items():
        if sec.get(k) != v:
            errors.append(f"deploy/kubernetes/nri/containerd-nri.toml: {k} = {sec.get(k)!r}, expected {v!r}")
    scrape = yaml.safe_load((deploy / "monitoring/prometheus-scrape.yaml").read_text())
    jobs = scrape.get("scrape_configs", [])
    if [j.get("job_name") for j in jobs] != ["qoslet"]:
        errors.append("deploy/monitoring/prometheus-scrape.yaml: expected one scrape job, qoslet")
    for j in jobs:
        for r in j.get("relabel_configs", []):
            try:
                re.compile(r.get("regex", "(.*)"))
            except re.error as e:
                errors.append(f"prometheus-scrape.yaml: relabel regex {r.get('regex')!r}: {e}")
            targets = r.get("target_label")
            if targets in ("namespace", "pod", "container"):
                errors.append(f"prometheus-scrape.yaml: target label {targets} would clash with qoslet's own labels")
    return errors


# ---------------------------------------------------------------------------------------


def self_tests(exported, labels, dash, objs_nri, version, config_keys, base_cfg, objs_colocation=(), objs_extender=(), repo=None):
    """Each check must fail on a broken input."""
    errors = []

    bad = copy.deepcopy(dash)
    for p in bad["panels"]:
        if p.get("targets"):
            p["targets"][0]["expr"] = p["targets"][0]["expr"].replace("qoslet_", "qoslet_bogus_", 1)
            break
    if not any("qoslet_bogus_" in e for e in check_dashboard(bad, exported, labels)):
        errors.append("self-test: a bogus metric name in the dashboard was not caught")
    bad = copy.deepcopy(dash)
    bad["panels"][1]["targets"].append({"expr": "up", "refId": "Z"})
    if not check_dashboard(bad, exported, labels):
        errors.append("self-test: a query naming no qoslet metric was not caught")
    bad = copy.deepcopy(dash)
    bad["panels"][1]["targets"][0]["legendFormat"] = "{{bogus_label}}"
    if not check_dashboard(bad, exported, labels):
        errors.append("self-test: an unknown label in a legend was not caught")

    ds = copy.deepcopy(next(o for o in objs_nri if o["kind"] == "DaemonSet"))
    ds["spec"]["template"]["spec"]["containers"][0]["bogusField"] = True
    if not validate_objects([ds], version, []):
        errors.append("self-test: kubernetes-validate --strict accepted an unknown field")
    sm = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "x", "namespace": "y"},
          "spec": {"selector": {}, "endpoints": [{"port": "metrics", "bogus": 1}]}}
    if not validate_objects([sm], version, []):
        errors.append("self-test: the ServiceMonitor schema accepted an unknown field")
    if not validate_objects([{"apiVersion": "example.com/v1", "kind": "Unknown", "metadata": {"name": "x"}}], version, []):
        errors.append("self-test: an object of a kind without a schema was accepted")

    if not check_kubelet_dropin("[Unit]\nRequires=qoslet.service\nAfter=qoslet.service\n", "test"):
        errors.append("self-test: a kubelet drop-in with Requires= was accepted")
    if not check_kubelet_dropin("[Unit]\nAfter=qoslet.service\n", "test"):
        errors.append("self-test: a kubelet drop-in without Wants= was accepted")

    objs = copy.deepcopy(objs_nri)
    next(o for o in objs if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["command"] = [
        "/usr/local/bin/qoslet"]
    if not any("not the image's /usr/bin/qoslet" in e for e in check_workloads(objs, "test")):
        errors.append("self-test: an NRI DaemonSet running a path the image lacks was accepted")

    objs = copy.deepcopy(objs_nri)
    next(o for o in objs if o["kind"] == "ClusterRole")["rules"][0]["verbs"].append("delete")
    if not check_rbac(objs):
        errors.append("self-test: an extra RBAC verb was accepted")

    if objs_extender:
        objs = copy.deepcopy(list(objs_extender))
        next(o for o in objs if o["kind"] == "ClusterRole")["rules"][0]["verbs"].append("update")
        if not check_extender(objs, repo):
            errors.append("self-test: a write verb in the scheduler extender's ClusterRole was accepted")
        objs = copy.deepcopy(list(objs_extender))
        next(o for o in objs if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0][
            "securityContext"]["capabilities"]["add"] = ["NET_ADMIN"]
        if not check_extender(objs, repo):
            errors.append("self-test: a capability added to the scheduler extender was accepted")
        for bad in ({"ignorable": False}, {"nodeCacheCapable": False}, {"bogus": 1}, {"weight": 0},
                    {"urlPrefix": "http://x:1"}):
            cfg = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                   "extenders": [{"urlPrefix": "http://CLUSTER_IP:10262", "filterVerb": "filter",
                                  "prioritizeVerb": "prioritize", "weight": 1, "nodeCacheCapable": True,
                                  "ignorable": True, **bad}]}
            if not check_extenders_entry(cfg, 10262):
                errors.append(f"self-test: an extenders entry with {bad} was accepted")
    else:
        errors.append("self-test: deploy/kubernetes/scheduler-extender was not rendered")

    # components/colocation: its rules exactly, its Role where the ConfigMap is
    if objs_colocation:
        if check_rbac(list(objs_colocation)):
            errors.append("self-test: the colocation example's RBAC is refused as it is")
        for what, mutate in (
            ("an extra verb on nodes/status",
             lambda objs: next(o for o in objs if o["metadata"]["name"] == "qoslet-colocation"
                               and o["kind"] == "ClusterRole")["rules"][0]["verbs"].append("update")),
            ("the ConfigMap Role without resourceNames",
             lambda objs: next(o for o in objs if o["kind"] == "Role")["rules"][0].pop("resourceNames")),
            ("the ConfigMap Role moved to qoslet-system",
             lambda objs: next(o for o in objs if o["kind"] == "Role")["metadata"].update(namespace=NAMESPACE)),
        ):
            objs = copy.deepcopy(list(objs_colocation))
            mutate(objs)
            if not check_rbac(objs):
                errors.append(f"self-test: {what} was accepted")
    else:
        errors.append("self-test: deploy/kubernetes/examples/colocation was not rendered")

    if not check_config_keys(dict(base_cfg, createNodeMetrics=True), config_keys, "test"):
        errors.append("self-test: an unknown config key was accepted")
    return errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True, type=Path)
    ap.add_argument("--rendered", required=True, type=Path)
    ap.add_argument("--kubernetes-version", default="1.33.0")
    a = ap.parse_args()
    repo, version = a.repo.resolve(), a.kubernetes_version
    errors, notes = [], []

    def section(title, errs):
        print(f"--- {title}: {'ok' if not errs else f'{len(errs)} error(s)'}")
        for e in errs:
            print(f"    {e}")
        errors.extend(errs)

    renders = {}
    for line in (a.rendered / "index.tsv").read_text().splitlines():
        d, f = line.split("\t")
        renders[d] = [o for o in yaml.safe_load_all((a.rendered / f).read_text()) if o]

    # 1. every rendered object against Kubernetes' schemas, strict
    for d, objs in renders.items():
        errs = validate_objects(objs, version, notes)
        section(f"{d}: {len(objs)} objects, Kubernetes {version} schemas (strict)", errs)
    for n in notes:
        print(f"    note: {n}")

    # 2. least privilege, workloads, configs
    nri, proxy = renders["deploy/kubernetes/nri"], renders["deploy/kubernetes/proxy"]
    for d, objs in renders.items():
        if d == "deploy/kubernetes/crds":
            kinds = sorted({o.get("kind") for o in objs})
            section(f"{d}: only CustomResourceDefinitions (applied where missing)",
                    [] if kinds == ["CustomResourceDefinition"] else [f"unexpected kinds {kinds}"])
        elif d == "deploy/kubernetes/scheduler-extender":
            section(f"{d}: read-only RBAC, the Deployment, kube-scheduler's extenders entry",
                    check_extender(objs, repo))
        elif d.startswith("deploy/kubernetes/"):
            section(f"{d}: RBAC exactly as documented", check_rbac(objs))
            section(f"{d}: DaemonSets", check_workloads(objs, d))
    for comp in sorted((repo / "deploy").rglob("kustomization.yaml")):
        k = yaml.safe_load(comp.read_text())
        if k.get("kind") == "Component":
            users = [d for d in renders if any((repo / d / c).resolve() == comp.parent.resolve()
                                               for c in yaml.safe_load((repo / d / "kustomization.yaml").read_text()).get("components", []))]
            section(f"component {comp.parent.relative_to(repo)} rendered through {users}",
                    [] if users else ["no kustomization uses it: it is never rendered nor validated"])

    config_keys = rust_config_keys(repo)
    base_cfg = yaml.safe_load(config_of(nri))
    proxy_cfg = yaml.safe_load(config_of(proxy))
    errs = []
    for where, cfg in (("base/qoslet.yaml", base_cfg), ("proxy/qoslet.yaml", proxy_cfg),
                       ("deploy/qoslet.yaml", yaml.safe_load((repo / "deploy/qoslet.yaml").read_text()))):
        errs += check_config_keys(cfg, config_keys, where)
    errs += check_mode_configs(base_cfg, proxy_cfg)
    section("qoslet config files: keys qoslet knows; proxy differs from base only where it must", errs)

    # 3. snippets: kubelet drop-in (Wants=, not Requires=), copies, KubeletConfiguration, NRI, scrape config
    section("systemd, kubelet, containerd and Prometheus snippets", check_snippets(repo))

    # 4. the dashboard against the metrics qoslet exports
    exported, prefixes, suffixes, labels = exported_metrics(repo)
    errs = [f"metric {m} not found in the Rust sources: the extraction in check_deploy.py is broken"
            for m in sorted(SENTINEL_METRICS - exported)]
    print(f"    {len(exported)} metric names exported ({len(prefixes)} prefixes x {len(suffixes)} suffixes among them), "
          f"{len(labels)} label names")
    dash = json.loads((repo / "deploy/monitoring/grafana-dashboard.json").read_text())
    errs += check_dashboard(dash, exported, labels) + check_dashboard_layout(dash)
    cm = next((o for o in renders.get("deploy/monitoring", []) if o["kind"] == "ConfigMap"), None)
    if cm is None or json.loads(cm["data"]["qoslet.json"]) != dash:
        errs.append("deploy/monitoring's dashboard ConfigMap does not hold grafana-dashboard.json")
    section(f"grafana dashboard: {len(dashboard_queries(dash))} queries name only exported metrics and labels", errs)

    # 5. the proxy installer is `qoslet install` (src/install.rs): its fake-host tests are
    #    Rust unit tests, and the VM suite runs it on a real systemd node

    # 6. each check catches what it is for
    section("self-tests: every check fails on a broken input",
            self_tests(exported, labels, dash, nri, version, config_keys, base_cfg,
                       renders.get("deploy/kubernetes/examples/colocation", ()),
                       renders.get("deploy/kubernetes/scheduler-extender", ()), repo))

    if errors:
        print(f"check-deploy: {len(errors)} error(s)")
        return 1
    print("check-deploy: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
