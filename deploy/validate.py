#!/usr/bin/python3
"""Offline checks of deploy/ (the deploy_validate test; no cluster, no Docker daemon needed).

1. `kubectl kustomize` builds the base, every overlay under deploy/k8s/overlays, and every
   overlay with each component of deploy/k8s/components it does not use yet. Anything kustomize
   prints on stderr fails the check: a deprecated field (`bases`, `patchesStrategicMerge`, ...)
   must be fixed, not tolerated. Needs kustomize v4+ (kubectl 1.21+); older: skipped (77).
2. Every object is checked against the Kubernetes API schema: the model classes of the
   python3-kubernetes client (Debian package), walked strictly: an unknown field, a wrong type or
   a missing required field is an error. API fields newer than the installed client are added
   in NEWER_FIELDS below (each with the Kubernetes version that introduced it); the
   ServiceMonitor and PrometheusRule (Prometheus Operator CRDs) are checked against
   SERVICE_MONITOR and PROMETHEUS_RULE_SCHEMA.
3. Consistency across objects: selectors match pod labels, referenced ConfigMaps, PVCs and
   container ports exist, probes are native gRPC probes (tandem-health under TLS), the grace
   period outlasts the drain (--drain-timeout-ms), workers point at the router Service, the
   dashboard ConfigMap holds deploy/grafana/tandem-dashboard.json byte for byte, GPUs are
   requested only by the gpu overlay's workers, every HorizontalPodAutoscaler targets a
   Deployment and scales on a metric that a rule of deploy/prometheus-adapter/rules.yaml serves
   from a metric Tandem exports for that role; --api-keys-file comes from the Secret
   tandem-api-keys (the api-keys component); the ServiceMonitor selects the role Services'
   metrics ports under the job rules.yml expects, and every PrometheusRule holds rules.yml's
   groups (the prometheus-operator component).
4. The Helm chart deploy/helm/tandem, rendered by deploy/helm_render.py (and by `helm template`
   where Helm is installed), builds the same objects as kustomize (HELM_CASES), and passes 2
   and 3.
5. yamllint (deploy/yamllint.yaml) over every YAML file under deploy/.
6. deploy/docker/Dockerfile and .dockerignore: Debian has no Dockerfile linter (hadolint is not
   packaged), so check_dockerfile() below checks what a linter would and what this project
   needs (see its docstring).

--self-test: each check rejects what it looks for. --sync-prometheusrule: rewrites the
prometheus-operator component's PrometheusRule from deploy/prometheus/rules.yml.

Exit status: 0 all good, 1 problems (each printed), 77 a tool is missing (skipped).
"""

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(ROOT, "deploy")
K8S = os.path.join(DEPLOY, "k8s")
SKIP = 77

# After SIGTERM, tandem-server drains for up to --drain-timeout-ms (its default is read from
# server/server_config.h), then stops within about a second and says goodbye to the routers:
# the grace period must exceed the drain by this margin.
GRACE_MARGIN_SECONDS = 5


def default_drain_seconds():
    with open(os.path.join(ROOT, "server", "server_config.h"), encoding="utf-8") as f:
        m = re.search(r'int64_t drain_timeout_ms = (\d+);', f.read())
    return int(m.group(1)) / 1000 if m else None
ROUTER_SERVICE = "tandem-router"
PUBLIC_SERVICE = "tandem-api"
GRPC_PORT = 7000          # the router's public gRPC API; a worker's internal port
HTTP_PORT = 8000          # the router's OpenAI-compatible HTTP API
ROUTER_INTERNAL_PORT = 7001
KV_PORT = 7100
SECRET_NAME = "tandem-cluster-secret"
API_KEYS_SECRET = "tandem-api-keys"   # the api-keys component's Secret (key keys.txt)
COMPONENTS = os.path.join(K8S, "components")
HELM_CHART = os.path.join(DEPLOY, "helm", "tandem")
RULES = os.path.join(DEPLOY, "prometheus", "rules.yml")
PROMETHEUS_RULE = os.path.join(COMPONENTS, "prometheus-operator", "prometheusrule.yaml")

# API fields newer than python3-kubernetes 22.6 (Kubernetes 1.22), as {model: {json name: type}},
# and the models they need. Only what the manifests use; each line names its source.
NEWER_FIELDS = {
    # Probe.grpc: GRPCAction, alpha in 1.23, beta (on by default) in 1.24, GA in 1.27.
    "V1Probe": {"grpc": "V1GRPCAction"},
}
NEWER_MODELS = {
    "V1GRPCAction": {"fields": {"port": "int", "service": "str"}, "required": ["port"]},
}

# monitoring.coreos.com/v1 ServiceMonitor: the fields of the Prometheus Operator's CRD that a
# ServiceMonitor like ours can use (spec.endpoints[] abbreviated to its common fields).
SERVICE_MONITOR = {
    "fields": {
        "apiVersion": "str",
        "kind": "str",
        "metadata": "V1ObjectMeta",
        "spec": {
            "fields": {
                "selector": "V1LabelSelector",
                "namespaceSelector": {"fields": {"any": "bool", "matchNames": "list[str]"}},
                "jobLabel": "str",
                "targetLabels": "list[str]",
                "podTargetLabels": "list[str]",
                "sampleLimit": "int",
                "endpoints": [{
                    "fields": {
                        "port": "str", "targetPort": "object", "path": "str", "scheme": "str",
                        "interval": "str", "scrapeTimeout": "str", "honorLabels": "bool",
                        "honorTimestamps": "bool", "params": "dict(str, list[str])",
                        "relabelings": "list[object]", "metricRelabelings": "list[object]",
                    },
                }],
            },
            "required": ["selector", "endpoints"],
        },
    },
    "required": ["apiVersion", "kind", "metadata", "spec"],
}


# monitoring.coreos.com/v1 PrometheusRule: the fields of the Prometheus Operator's CRD (groups
# as in a Prometheus rule file, plus the operator's own group fields).
PROMETHEUS_RULE_SCHEMA = {
    "fields": {
        "apiVersion": "str",
        "kind": "str",
        "metadata": "V1ObjectMeta",
        "spec": {
            "fields": {
                "groups": [{
                    "fields": {
                        "name": "str", "interval": "str", "query_offset": "str", "limit": "int",
                        "partial_response_strategy": "str", "labels": "dict(str, str)",
                        "rules": [{
                            "fields": {
                                "record": "str", "alert": "str", "expr": "str", "for": "str",
                                "keep_firing_for": "str", "labels": "dict(str, str)",
                                "annotations": "dict(str, str)",
                            },
                            "required": ["expr"],
                        }],
                    },
                    "required": ["name"],
                }],
            },
        },
    },
    "required": ["apiVersion", "kind", "metadata", "spec"],
}


class Problems:
    def __init__(self):
        self.items = []

    def add(self, where, msg):
        self.items.append(f"{where}: {msg}")


# ---------------------------------------------------------------------------------------------
# Schema


def model_class(name):
    import kubernetes.client as kc
    return getattr(kc, name, None)


def check_value(value, schema, path, problems):
    """Checks `value` against `schema`: a client type name ("str", "list[V1Container]",
    "V1PodSpec", ...) or an inline object schema ({"fields": ..., "required": ...} or [that])."""
    if isinstance(schema, list):
        if not isinstance(value, list):
            problems.add(path, f"expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            check_value(v, schema[0], f"{path}[{i}]", problems)
        return
    if isinstance(schema, dict):
        check_object(value, schema["fields"], schema.get("required", []), path, problems)
        return
    t = schema
    if t.startswith("list["):
        if not isinstance(value, list):
            problems.add(path, f"expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            check_value(v, t[5:-1], f"{path}[{i}]", problems)
    elif t.startswith("dict("):
        inner = t[t.index(",") + 1:-1].strip()
        if not isinstance(value, dict):
            problems.add(path, f"expected a map, got {type(value).__name__}")
            return
        for k, v in value.items():
            if not isinstance(k, str):
                problems.add(path, f"map key {k!r} is not a string")
            check_value(v, inner, f"{path}.{k}", problems)
    elif t == "str":
        if not isinstance(value, str):
            problems.add(path, f"expected a string, got {value!r}")
    elif t == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            problems.add(path, f"expected an integer, got {value!r}")
    elif t == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            problems.add(path, f"expected a number, got {value!r}")
    elif t == "bool":
        if not isinstance(value, bool):
            problems.add(path, f"expected true or false, got {value!r}")
    elif t == "datetime" or t == "date":
        if not isinstance(value, str):
            problems.add(path, f"expected a timestamp string, got {value!r}")
    elif t == "object":
        pass  # IntOrString, RawExtension: any JSON value
    elif t in NEWER_MODELS:
        m = NEWER_MODELS[t]
        check_object(value, m["fields"], m.get("required", []), path, problems)
    else:
        cls = model_class(t)
        if cls is None:
            problems.add(path, f"unknown model {t} (python3-kubernetes too old?)")
            return
        fields = {json_name: cls.openapi_types[attr] for attr, json_name in cls.attribute_map.items()}
        fields.update(NEWER_FIELDS.get(t, {}))
        check_object(value, fields, required_fields(cls), path, problems, t)


def required_fields(cls):
    """JSON names of the fields the client's model refuses to leave unset."""
    import kubernetes.client as kc
    required = []
    config = kc.Configuration()
    config.client_side_validation = True
    for attr, json_name in cls.attribute_map.items():
        obj = cls.__new__(cls)
        obj.local_vars_configuration = config
        try:
            setattr(obj, attr, None)
        except ValueError:
            required.append(json_name)
    return required


def check_object(value, fields, required, path, problems, type_name="object"):
    if not isinstance(value, dict):
        problems.add(path, f"expected an object ({type_name}), got {value!r}")
        return
    for k, v in value.items():
        if k not in fields:
            problems.add(f"{path}.{k}", f"unknown field (not in {type_name})")
            continue
        if v is None:
            continue
        check_value(v, fields[k], f"{path}.{k}", problems)
    for r in required:
        if value.get(r) is None:
            problems.add(path, f"required field {r} is missing ({type_name})")


def check_schema(obj, where, problems):
    api, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    if (api, kind) == ("monitoring.coreos.com/v1", "ServiceMonitor"):
        check_value(obj, SERVICE_MONITOR, where, problems)
        return
    if (api, kind) == ("monitoring.coreos.com/v1", "PrometheusRule"):
        check_value(obj, PROMETHEUS_RULE_SCHEMA, where, problems)
        return
    if api.startswith("monitoring.coreos.com/"):
        problems.add(where, f"{api} {kind}: only monitoring.coreos.com/v1 ServiceMonitor and "
                            f"PrometheusRule are known here")
        return
    version = api.split("/")[-1]
    if (api, kind) == ("autoscaling/v2", "HorizontalPodAutoscaler"):
        # autoscaling/v2 (GA in Kubernetes 1.23) is v2beta2's schema under a new version; the
        # installed client predates it.
        version = "v2beta2"
    name = version[:1].upper() + version[1:] + kind
    if model_class(name) is None:
        problems.add(where, f"no Kubernetes model for {api} {kind}")
        return
    check_value(obj, name, where, problems)


# ---------------------------------------------------------------------------------------------
# Consistency


def matches(selector, labels):
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        has = e["key"] in labels
        val = labels.get(e["key"])
        op = e["operator"]
        if op == "In" and val not in e.get("values", []):
            return False
        if op == "NotIn" and val in e.get("values", []):
            return False
        if op == "Exists" and not has:
            return False
        if op == "DoesNotExist" and has:
            return False
    return True


def check_network_policies(where, policies, pod_labels, problems):
    """The internal ports (the router's registry, the workers' gRPC and KV ports) admit only the
    cluster's own pods; the router's public ports admit anyone."""
    internal = {"tandem-router": [ROUTER_INTERNAL_PORT],
                "tandem-prefill": [GRPC_PORT],
                "tandem-decode": [GRPC_PORT, KV_PORT]}
    for deployment, ports in internal.items():
        labels = pod_labels.get(deployment)
        if labels is None:
            continue
        selecting = [p for p in policies if matches(p["spec"].get("podSelector", {}), labels)]
        if not selecting:
            problems.add(where, f"no NetworkPolicy selects the pods of {deployment}")
            continue
        for port in ports:
            rules = [r for p in selecting for r in p["spec"].get("ingress", [])
                     if not r.get("ports") or port in [x.get("port") for x in r["ports"]]]
            if not rules:
                problems.add(where, f"{deployment}: no NetworkPolicy rule admits port {port}")
            for r in rules:
                peers = r.get("from")
                own_pods = peers and all(
                    "podSelector" in peer and "namespaceSelector" not in peer and
                    peer["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/part-of")
                    == "tandem" for peer in peers)
                if not own_pods:
                    problems.add(where, f"{deployment}: port {port} is open beyond the cluster's "
                                        f"own pods (a NetworkPolicy rule without a part-of: "
                                        f"tandem podSelector)")


def tandem_metric_names():
    """The metric families Tandem exports: the keys of the help texts in metrics/metrics.cc."""
    with open(os.path.join(ROOT, "metrics", "metrics.cc"), encoding="utf-8") as f:
        return set(re.findall(r'\{"(tandem_[a-z_]+)",', f.read()))


def adapter_rules():
    """{custom metric name: (Tandem series, role)} served by deploy/prometheus-adapter."""
    import yaml
    with open(os.path.join(DEPLOY, "prometheus-adapter", "rules.yaml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    out = {}
    for rule in config.get("rules", []):
        series = re.match(r"([a-z_:]+)\{", rule.get("seriesQuery", ""))
        role = re.search(r'role="([a-z]+)"', rule.get("seriesQuery", ""))
        name = rule.get("name", {}).get("as")
        out[name] = (series.group(1) if series else None, role.group(1) if role else None)
    return out


def check_autoscalers(where, hpas, deployments, problems):
    """Every HPA targets a Tandem Deployment and scales on custom metrics that an adapter rule
    serves, from a metric Tandem exports for that Deployment's role."""
    if not hpas:
        return
    rules = adapter_rules()
    exported = tandem_metric_names()
    for name, (series, role) in rules.items():
        if series not in exported:
            problems.add("deploy/prometheus-adapter/rules.yaml",
                         f"{name}: {series} is not a metric Tandem exports")
    roles = {"tandem-prefill": "prefill", "tandem-decode": "decode", "tandem-router": "router"}
    for h in hpas:
        w = f"{where}: HorizontalPodAutoscaler {h['metadata']['name']}"
        target = h["spec"]["scaleTargetRef"]
        if target.get("kind") != "Deployment" or target.get("name") not in deployments:
            problems.add(w, f"scaleTargetRef {target.get('kind')}/{target.get('name')} is not a "
                            f"Deployment of the overlay")
            continue
        for m in h["spec"].get("metrics", []):
            if m.get("type") != "Pods":
                problems.add(w, f"metric of type {m.get('type')}: only per-pod custom metrics")
                continue
            metric = m["pods"]["metric"]["name"]
            if metric not in rules:
                problems.add(w, f"{metric}: no rule in deploy/prometheus-adapter/rules.yaml "
                                f"serves it")
            elif rules[metric][1] != roles.get(target["name"]):
                problems.add(w, f"{metric} is a {rules[metric][1]} metric, the target is "
                                f"{target['name']}")


def rules_yml_groups():
    import yaml
    with open(RULES, encoding="utf-8") as f:
        return yaml.safe_load(f)["groups"]


def prometheus_rule_text():
    """deploy/k8s/components/prometheus-operator/prometheusrule.yaml as --sync-prometheusrule
    writes it: rules.yml from its `groups:` line on, under `spec:`."""
    with open(RULES, encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("groups:"))
    body = "\n".join(("  " + l) if l.strip() else "" for l in lines[start:])
    return PROMETHEUS_RULE_HEADER + body + "\n"


PROMETHEUS_RULE_HEADER = """\
# GENERATED from deploy/prometheus/rules.yml: edit that file, then run
#   python3 deploy/validate.py --sync-prometheusrule
# (deploy_validate fails while the groups here and there differ). The recording rules and
# alerts of rules.yml for the Prometheus Operator; the Helm chart renders the same object from
# the file itself (deploy/helm/tandem/templates/prometheusrule.yaml).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: tandem
  labels:
    app.kubernetes.io/name: tandem
    app.kubernetes.io/part-of: tandem
spec:
"""


def scrape_job():
    """The job label rules.yml's target-down alert expects (up{job="..."})."""
    with open(RULES, encoding="utf-8") as f:
        m = re.search(r'up\{job="([^"]+)"\}', f.read())
    return m.group(1) if m else None


def expand_command(command, env):
    """A container's shell command with its literal env values put in: ${VAR:+WORD} becomes WORD
    when VAR is set and not empty (else nothing), then "$VAR" and $VAR become the value.
    Variables from ConfigMaps stay as they are."""
    command = re.sub(r"\$\{(\w+):\+([^}]*)\}",
                     lambda m: m.group(2) if env.get(m.group(1)) else "", command)
    for name, value in env.items():
        command = re.sub(r'"?\$(?:\{' + name + r'\}|' + name + r'\b)"?', value, command)
    return command


def mounted_file(path, container, volumes, secret=None):
    """The volumeMount of `container` that holds `path` (of a volume of the Secret `secret`, or
    of any Secret), or None."""
    for vm in container.get("volumeMounts", []):
        v = volumes.get(vm["name"], {})
        if "secret" not in v or (secret and v["secret"].get("secretName") != secret):
            continue
        if path.startswith(vm["mountPath"].rstrip("/") + "/"):
            return vm
    return None


def check_api_keys(cw, role, container, command, volumes, require, problems):
    """--api-keys-file on the router only, from a read-only mount of the Secret tandem-api-keys
    whose items hold the file; a mounted Secret without the flag is a mistake too."""
    key_volumes = {n for n, v in volumes.items()
                   if v.get("secret", {}).get("secretName") == API_KEYS_SECRET}
    m = re.search(r"--api-keys-file[ =](\S+)", command)
    if role != "router":
        if m or key_volumes:
            problems.add(cw, "only the router takes API keys")
        return
    if not m:
        if key_volumes:
            problems.add(cw, f"mounts the Secret {API_KEYS_SECRET} but passes no --api-keys-file")
        if "api-keys" in require:
            problems.add(cw, "the api-keys component is on but the router gets no --api-keys-file")
        return
    path = m.group(1)
    vm = mounted_file(path, container, volumes, API_KEYS_SECRET)
    if vm is None:
        problems.add(cw, f"--api-keys-file {path} is not in a mount of the Secret "
                         f"{API_KEYS_SECRET}")
        return
    if not vm.get("readOnly"):
        problems.add(cw, f"the Secret {API_KEYS_SECRET} must be mounted readOnly")
    items = volumes[vm["name"]]["secret"].get("items")
    rel = path[len(vm["mountPath"].rstrip("/")) + 1:]
    if items and rel not in [i.get("path") for i in items]:
        problems.add(cw, f"--api-keys-file {path}: no item of the Secret volume is {rel}")


def tls_files(command):
    """{"cert": PATH, "key": PATH, "ca": PATH} of the --tls-* flags in `command`."""
    return {f: m.group(1) for f in ("cert", "key", "ca")
            for m in [re.search(rf"--tls-{f}[ =](\S+)", command)] if m}


def check_probes(cw, container, ports, tls, problems):
    """Readiness and liveness probes: native gRPC probes on a container port; under TLS
    (which Kubernetes' grpc probes cannot speak) tandem-health with the container's TLS files."""
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = container.get(probe)
        if p is None:
            if probe != "startupProbe":
                problems.add(cw, f"{probe} is missing")
            continue
        if tls:
            cmd = p.get("exec", {}).get("command", [])
            if not cmd or cmd[0] != "tandem-health":
                problems.add(cw, f"{probe}: under TLS the probe must run tandem-health (exec): "
                                 f"Kubernetes' grpc probes speak plaintext")
                continue
            got = tls_files(" ".join(cmd))
            if got != tls:
                problems.add(cw, f"{probe}: tandem-health's TLS files {got} differ from the "
                                 f"server's {tls}")
        elif "grpc" not in p:
            problems.add(cw, f"{probe} must be a native grpc probe (grpc.health.v1)")
        elif p["grpc"]["port"] not in ports:
            problems.add(cw, f"{probe} port {p['grpc']['port']} is not a container port")


def check_monitoring(where, by_kind, services, require, problems):
    """The Prometheus Operator's objects, where present (the prometheus-operator component or
    the chart's toggles): the ServiceMonitor selects the three role Services by labels and their
    `metrics` port by name, under the job rules.yml's alerts expect; every PrometheusRule holds
    exactly rules.yml's groups."""
    monitors = by_kind.get("ServiceMonitor", [])
    rules = by_kind.get("PrometheusRule", [])
    if "prometheus-operator" in require:
        if not monitors:
            problems.add(where, "no ServiceMonitor (the prometheus-operator component is on)")
        if not rules:
            problems.add(where, "no PrometheusRule (the prometheus-operator component is on)")
    job = scrape_job()
    for m in monitors:
        name = m["metadata"]["name"]
        if m.get("apiVersion") != "monitoring.coreos.com/v1":
            problems.add(where, f"ServiceMonitor {name}: apiVersion {m.get('apiVersion')}")
        sel = m["spec"]["selector"]
        ports = {e.get("port") for e in m["spec"]["endpoints"]}
        job_label = m["spec"].get("jobLabel")
        for role in ("tandem-router", "tandem-prefill", "tandem-decode"):
            s = services.get(role)
            if s is None or not matches(sel, s["metadata"].get("labels", {})):
                problems.add(where, f"ServiceMonitor {name} misses Service {role}")
                continue
            if "metrics" not in [p.get("name") for p in s["spec"]["ports"]]:
                problems.add(where, f"Service {role} has no metrics port")
            if ports != {"metrics"}:
                problems.add(where, f"ServiceMonitor {name} scrapes ports {sorted(map(str, ports))}"
                                    f", not the Services' `metrics` port")
            got = s["metadata"].get("labels", {}).get(job_label) if job_label else role
            if job and got != job:
                problems.add(where, f"ServiceMonitor {name}: Service {role}'s targets get "
                                    f"job={got}, rules.yml's alerts expect job={job} (jobLabel)")
        api = services.get(PUBLIC_SERVICE)
        if api is not None and matches(sel, api["metadata"].get("labels", {})):
            problems.add(where, f"ServiceMonitor {name} selects {PUBLIC_SERVICE}, whose pods are "
                                f"the routers: they would be scraped twice")
    if rules:
        groups = rules_yml_groups()
        for r in rules:
            if r.get("apiVersion") != "monitoring.coreos.com/v1":
                problems.add(where, f"PrometheusRule {r['metadata']['name']}: apiVersion "
                                    f"{r.get('apiVersion')}")
            if r.get("spec", {}).get("groups") != groups:
                problems.add(where, f"PrometheusRule {r['metadata']['name']} differs from "
                                    f"deploy/prometheus/rules.yml (python3 deploy/validate.py "
                                    f"--sync-prometheusrule rewrites the component's copy)")


def check_consistency(overlay, objs, problems, gpu=None, require=()):
    """`require`: the components that must be in effect ("api-keys", "prometheus-operator").
    `gpu`: whether the workers must request GPUs (default: the gpu overlay's)."""
    where = f"overlay {overlay}"
    if gpu is None:
        gpu = overlay == "gpu"
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    deployments = {d["metadata"]["name"]: d for d in by_kind.get("Deployment", [])}
    configmaps = {c["metadata"]["name"]: c for c in by_kind.get("ConfigMap", [])}
    pvcs = {c["metadata"]["name"] for c in by_kind.get("PersistentVolumeClaim", [])}
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}

    roles = {"tandem-router": "router", "tandem-prefill": "prefill", "tandem-decode": "decode"}
    for name in roles:
        if name not in deployments:
            problems.add(where, f"Deployment {name} is missing")

    namespaces = {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"}
    if len(namespaces) != 1:
        problems.add(where, f"objects span namespaces {sorted(map(str, namespaces))}")

    drain = default_drain_seconds()
    if drain is None:
        problems.add(where, "cannot find the --drain-timeout-ms default in server/server_config.h")
        drain = 0
    config_text = " ".join(str(v) for c in configmaps.values() if c["metadata"]["name"]
                           .startswith("tandem-config") for v in c.get("data", {}).values())
    pod_labels = {}
    for name, d in deployments.items():
        w = f"{where}: Deployment {name}"
        spec = d["spec"]
        labels = spec["template"]["metadata"].get("labels", {})
        pod_labels[name] = labels
        if not matches(spec["selector"], labels):
            problems.add(w, "selector does not match the pod template's labels")
        pod = spec["template"]["spec"]
        ann = spec["template"]["metadata"].get("annotations", {})
        if ann.get("prometheus.io/scrape") != "true":
            problems.add(w, "no prometheus.io/scrape annotation")
        grace = pod.get("terminationGracePeriodSeconds", 30)
        command_text = " ".join(" ".join(c.get("command", []) + c.get("args", []))
                                for c in pod["containers"])
        flags = re.findall(r"--drain-timeout-ms[ =](\d+)", command_text + " " + config_text)
        pod_drain = max([int(x) / 1000 for x in flags], default=drain)
        if grace < pod_drain + GRACE_MARGIN_SECONDS:
            problems.add(w, f"terminationGracePeriodSeconds {grace} does not outlast the "
                            f"{pod_drain:g} s drain by {GRACE_MARGIN_SECONDS} s")
        sc = pod.get("securityContext", {})
        if not sc.get("runAsNonRoot") or not sc.get("runAsUser"):
            problems.add(w, "pods must run as a non-root user (runAsNonRoot, runAsUser)")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        secret_volumes = {n for n, v in volumes.items()
                          if v.get("secret", {}).get("secretName") == SECRET_NAME}
        if not secret_volumes:
            problems.add(w, f"no volume of the Secret {SECRET_NAME} (the cluster secret)")
        for v in volumes.values():
            if "configMap" in v and v["configMap"]["name"] not in configmaps:
                problems.add(w, f"volume {v['name']}: no ConfigMap {v['configMap']['name']}")
            if "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] not in pvcs:
                problems.add(w, f"volume {v['name']}: no PVC "
                                f"{v['persistentVolumeClaim']['claimName']} in the overlay")
        for c in pod["containers"]:
            cw = f"{w} container {c['name']}"
            ports = {p["containerPort"] for p in c.get("ports", [])}
            port_names = {p.get("name") for p in c.get("ports", [])}
            literal_env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
            effective = expand_command(" ".join(c.get("command", []) + c.get("args", [])),
                                       literal_env)
            tls = tls_files(effective)
            check_probes(cw, c, ports, tls, problems)
            for f, path in tls.items():
                if mounted_file(path, c, volumes) is None:
                    problems.add(cw, f"--tls-{f} {path} is not in a mounted Secret")
            if tls and not {"cert", "key"} <= set(tls):
                problems.add(cw, "--tls-cert and --tls-key go together")
            check_api_keys(cw, roles.get(name), c, effective, volumes, require, problems)
            if "metrics" not in port_names:
                problems.add(cw, "no port named metrics")
            for ef in c.get("envFrom", []):
                ref = ef.get("configMapRef", {}).get("name")
                if ref is not None and ref not in configmaps:
                    problems.add(cw, f"envFrom: no ConfigMap {ref}")
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    problems.add(cw, f"volumeMount {m['name']}: no such volume")
            command = " ".join(c.get("command", []) + c.get("args", []))
            role = roles.get(name)
            if role and f"tandem-{role}" not in command:
                problems.add(cw, f"does not run tandem-{role}")
            m = re.search(r"--cluster-secret-file (\S+)", command)
            mounts = [vm for vm in c.get("volumeMounts", []) if vm["name"] in secret_volumes]
            if not m:
                problems.add(cw, "no --cluster-secret-file: internal calls would be refused")
            elif not any(m.group(1).startswith(vm["mountPath"].rstrip("/") + "/")
                         for vm in mounts):
                problems.add(cw, f"--cluster-secret-file {m.group(1)} is not in a mount of the "
                                 f"Secret {SECRET_NAME}")
            if role == "router" and f"--internal-port {ROUTER_INTERNAL_PORT}" not in command:
                problems.add(cw, f"the router's registry must be on --internal-port "
                                 f"{ROUTER_INTERNAL_PORT}")
            if role in ("prefill", "decode"):
                if f"--router {ROUTER_SERVICE}:{ROUTER_INTERNAL_PORT}" not in command:
                    problems.add(cw, f"workers must register at --router "
                                     f"{ROUTER_SERVICE}:{ROUTER_INTERNAL_PORT}")
                env = {e["name"]: e for e in c.get("env", [])}
                adv = env.get("TANDEM_ADVERTISE_HOST", {}).get("valueFrom", {}).get("fieldRef", {})
                if adv.get("fieldPath") != "status.podIP" and "--advertise-host" not in command:
                    problems.add(cw, "workers must advertise the pod IP (TANDEM_ADVERTISE_HOST)")
            gpus = {k: v for k, v in (c.get("resources", {}).get("limits") or {}).items()
                    if k == "nvidia.com/gpu"}
            wants_gpu = gpu and role in ("prefill", "decode")
            if wants_gpu and not gpus:
                problems.add(cw, "the gpu overlay's workers must request nvidia.com/gpu")
            if not wants_gpu and gpus:
                problems.add(cw, "requests a GPU outside the gpu overlay's workers")
            if wants_gpu and gpus:
                req = (c.get("resources", {}).get("requests") or {}).get("nvidia.com/gpu")
                if req is not None and req != gpus["nvidia.com/gpu"]:
                    problems.add(cw, "nvidia.com/gpu requests and limits differ")

    router = services.get(ROUTER_SERVICE)
    if router is None:
        problems.add(where, f"Service {ROUTER_SERVICE} is missing")
    else:
        if router["spec"].get("clusterIP") != "None":
            problems.add(where, f"Service {ROUTER_SERVICE} must be headless (clusterIP: None)")
        if ROUTER_INTERNAL_PORT not in [p["port"] for p in router["spec"]["ports"]]:
            problems.add(where, f"Service {ROUTER_SERVICE} does not expose {ROUTER_INTERNAL_PORT}")
    # The public Service: the router's client-facing ports, and nothing internal.
    public = services.get(PUBLIC_SERVICE)
    if public is None:
        problems.add(where, f"Service {PUBLIC_SERVICE} is missing")
    else:
        targets = {p.get("targetPort", p["port"]) for p in public["spec"]["ports"]}
        router_ports = {cp.get("name"): cp["containerPort"]
                        for c in deployments.get("tandem-router", {}).get("spec", {}).get(
                            "template", {}).get("spec", {}).get("containers", [])
                        for cp in c.get("ports", [])}
        resolved = {router_ports.get(t, t) for t in targets}
        for want in (GRPC_PORT, HTTP_PORT):
            if want not in resolved:
                problems.add(where, f"Service {PUBLIC_SERVICE} does not expose port {want}")
        for extra in resolved - {GRPC_PORT, HTTP_PORT}:
            problems.add(where, f"Service {PUBLIC_SERVICE} exposes {extra}, which is not a public "
                                f"port (only {GRPC_PORT} and {HTTP_PORT} are)")
    check_network_policies(where, by_kind.get("NetworkPolicy", []), pod_labels, problems)
    for name, s in services.items():
        sel = {"matchLabels": s["spec"].get("selector", {})}
        if not any(matches(sel, l) for l in pod_labels.values()):
            problems.add(where, f"Service {name} selects no Deployment's pods")
        for p in s["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            if isinstance(target, str):
                ok = any(matches(sel, pod_labels[d]) and target in
                         {cp.get("name") for c in deployments[d]["spec"]["template"]["spec"]
                          ["containers"] for cp in c.get("ports", [])} for d in deployments)
                if not ok:
                    problems.add(where, f"Service {name}: no selected pod has port {target}")
    for pdb in by_kind.get("PodDisruptionBudget", []):
        if not any(matches(pdb["spec"]["selector"], l) for l in pod_labels.values()):
            problems.add(where, f"PodDisruptionBudget {pdb['metadata']['name']} selects no pods")
    covered = {d for d in deployments
               for pdb in by_kind.get("PodDisruptionBudget", [])
               if matches(pdb["spec"]["selector"], pod_labels[d])}
    for d in deployments:
        if d not in covered:
            problems.add(where, f"Deployment {d} has no PodDisruptionBudget")
    check_autoscalers(where, by_kind.get("HorizontalPodAutoscaler", []), deployments, problems)

    check_monitoring(where, by_kind, services, require, problems)

    dashboards = [c for c in configmaps.values() if "tandem-dashboard.json" in c.get("data", {})]
    with open(os.path.join(DEPLOY, "grafana", "tandem-dashboard.json"), encoding="utf-8") as f:
        dashboard = f.read()
    if len(dashboards) != 1:
        problems.add(where, "expected one ConfigMap with tandem-dashboard.json")
    elif dashboards[0]["data"]["tandem-dashboard.json"] != dashboard:
        problems.add(where, "the dashboard ConfigMap differs from deploy/grafana/tandem-dashboard.json")
    elif dashboards[0]["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
        problems.add(where, "the dashboard ConfigMap lacks the grafana_dashboard label")
    config = [c for n, c in configmaps.items() if n.startswith("tandem-config")]
    if len(config) != 1 or not config[0].get("data", {}).get("TANDEM_MODEL"):
        problems.add(where, "expected one tandem-config ConfigMap with TANDEM_MODEL")


# ---------------------------------------------------------------------------------------------
# Components and the Helm chart


def components():
    """{name: folder} of deploy/k8s/components."""
    return {n: os.path.join(COMPONENTS, n) for n in sorted(os.listdir(COMPONENTS))
            if os.path.exists(os.path.join(COMPONENTS, n, "kustomization.yaml"))}


def used_components(d):
    """The component names the kustomization in `d` (or those it builds on) opts into."""
    import yaml
    with open(os.path.join(d, "kustomization.yaml"), encoding="utf-8") as f:
        k = yaml.safe_load(f)
    used = {os.path.basename(os.path.normpath(c)) for c in k.get("components") or []}
    for r in k.get("resources") or []:
        sub = os.path.normpath(os.path.join(d, r))
        if os.path.isdir(sub):
            used |= used_components(sub)
    return used


def render_with(kubectl, target, extra_components):
    """`kubectl kustomize` of the kustomization `target` with `extra_components` added, through a
    kustomization in a scratch folder (kustomize takes relative paths only), in the target's
    namespace, as if the target's own kustomization listed them."""
    import tempfile
    import yaml
    with open(os.path.join(target, "kustomization.yaml"), encoding="utf-8") as f:
        namespace = yaml.safe_load(f).get("namespace")
    with tempfile.TemporaryDirectory() as tmp:
        rel = lambda p: os.path.relpath(p, tmp)  # noqa: E731
        lines = ["apiVersion: kustomize.config.k8s.io/v1beta1", "kind: Kustomization",
                 "resources:", f"  - {rel(target)}"]
        if namespace:
            lines.append(f"namespace: {namespace}")
        if extra_components:
            lines += ["components:"] + [f"  - {rel(c)}" for c in extra_components]
        with open(os.path.join(tmp, "kustomization.yaml"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        return render(kubectl, tmp)


# Labels and annotations only the chart has: Helm's bookkeeping, and the checksum that rolls the
# pods when tandem-config changes (kustomize puts a content hash in the ConfigMap's name instead).
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
HELM_ONLY_POD_ANNOTATIONS = ("checksum/config",)


def canonical(objs):
    """{(kind, name): object} with what legitimately differs between `helm template` and
    `kubectl kustomize` taken out: Namespace objects and metadata.namespace (Helm installs into
    the release's namespace), HELM_ONLY_LABELS, HELM_ONLY_POD_ANNOTATIONS, the hash suffix of
    tandem-config's name, and the order of lists of named items (env, volumes, volumeMounts,
    ports: kustomize's patches put their items first, the chart last)."""
    import copy

    def walk(v):
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            items = [walk(x) for x in v]
            if items and all(isinstance(x, dict) and "name" in x for x in items):
                items.sort(key=lambda x: str(x["name"]))
            return items
        if isinstance(v, str) and re.fullmatch(r"tandem-config-[a-z0-9]{10}", v):
            return "tandem-config"
        return v

    out = {}
    for o in objs:
        if o.get("kind") == "Namespace":
            continue
        o = copy.deepcopy(o)
        meta = o.setdefault("metadata", {})
        meta.pop("namespace", None)
        for k in HELM_ONLY_LABELS:
            (meta.get("labels") or {}).pop(k, None)
        pod_meta = (o.get("spec") or {}).get("template", {}).get("metadata", {})
        for k in HELM_ONLY_POD_ANNOTATIONS:
            (pod_meta.get("annotations") or {}).pop(k, None)
        o = walk(o)
        out[(o.get("kind"), o["metadata"].get("name"))] = o
    return out


def differences(a, b, path="", limit=8):
    """Up to `limit` paths where `a` and `b` differ, as text."""
    out = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a:
                out.append(f"{path}.{k}: only in the chart ({b[k]!r:.80})")
            elif k not in b:
                out.append(f"{path}.{k}: only in kustomize ({a[k]!r:.80})")
            else:
                out += differences(a[k], b[k], f"{path}.{k}", limit)
            if len(out) >= limit:
                break
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            out += differences(x, y, f"{path}[{i}]", limit)
    elif a != b:
        out.append(f"{path}: kustomize {a!r:.100}, chart {b!r:.100}")
    return out[:limit]


def compare_objects(where, kustomized, charted, problems):
    """The chart's objects must be kustomize's, up to canonical()."""
    k, h = canonical(kustomized), canonical(charted)
    for key in sorted(set(k) - set(h), key=str):
        problems.add(where, f"{key[0]}/{key[1]} is built by kustomize but not by the chart")
    for key in sorted(set(h) - set(k), key=str):
        problems.add(where, f"{key[0]}/{key[1]} is rendered by the chart but not by kustomize")
    for key in sorted(set(k) & set(h), key=str):
        for d in differences(k[key], h[key]):
            problems.add(where, f"{key[0]}/{key[1]}{d}")


def helm_renderers():
    """[(name, function(value_files, overrides) -> objects)]: deploy/helm_render.py always;
    `helm template` too where Helm is installed."""
    import yaml
    sys.path.insert(0, DEPLOY)
    import helm_render
    out = [("helm_render.py", lambda files, over: helm_render.chart_objects(HELM_CHART, files,
                                                                             over))]
    helm = shutil.which("helm")
    if helm:
        def with_helm(files, over):
            import tempfile
            with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
                yaml.safe_dump(over or {}, f)
                f.flush()
                args = [helm, "template", "tandem", HELM_CHART]
                for v in list(files) + [f.name]:
                    args += ["-f", v]
                r = subprocess.run(args, capture_output=True, text=True)
            if r.returncode != 0:
                raise helm_render.RenderError("helm template: " + r.stderr.strip())
            return [o for o in yaml.safe_load_all(r.stdout) if o is not None]
        out.append(("helm template", with_helm))
    return out


# Chart values against what kustomize builds: (case, value files, overrides, kustomization,
# components added to it, gpu workers, components in effect).
EXAMPLES = os.path.join(HELM_CHART, "examples")
ALL_ON = {"apiKeys": {"enabled": True}, "serviceMonitor": {"enabled": True},
          "prometheusRule": {"enabled": True}}
HELM_CASES = [
    ("defaults", [], None, "base", [], False, ()),
    ("examples/cpu-demo.yaml", [os.path.join(EXAMPLES, "cpu-demo.yaml")], None,
     "overlays/cpu-demo", [], False, ()),
    ("examples/gpu.yaml", [os.path.join(EXAMPLES, "gpu.yaml")], None, "overlays/gpu", [], True,
     ()),
    ("apiKeys, serviceMonitor, prometheusRule on", [], ALL_ON, "base",
     ["api-keys", "prometheus-operator"], False, ("api-keys", "prometheus-operator")),
]
# Values with no kustomize counterpart: checked on their own (schema and consistency).
HELM_ONLY_CASES = [
    ("TLS and API keys", {"tls": {"enabled": True}, "apiKeys": {"enabled": True}},
     ("api-keys",)),
]


def check_helm(kubectl, problems):
    """Renders deploy/helm/tandem for each case of HELM_CASES and checks that it builds what
    kustomize builds; every rendered object also passes the schema and consistency checks."""
    renderers = helm_renderers()
    import helm_render
    rendered = 0
    for case, files, overrides, target, extra, gpu, require in HELM_CASES:
        kustomized, err = render_with(kubectl, os.path.join(K8S, target),
                                      [os.path.join(COMPONENTS, c) for c in extra])
        if kustomized is None:
            problems.add(f"helm {case}", f"kubectl kustomize {target} + {extra}: {err}")
            continue
        for name, fn in renderers:
            where = f"{name} ({case})"
            try:
                objs = fn(files, overrides)
            except helm_render.RenderError as e:
                problems.add(where, str(e))
                continue
            rendered += len(objs)
            compare_objects(f"{where} vs kustomize {target}" +
                            (f" + {', '.join(extra)}" if extra else ""), kustomized, objs,
                            problems)
            for o in objs:
                check_schema(o, f"{where}: {o.get('kind')}/{o['metadata'].get('name')}",
                             problems)
            check_consistency(f"helm {case}", objs, problems, gpu=gpu, require=require)
    for case, overrides, require in HELM_ONLY_CASES:
        for name, fn in renderers:
            where = f"{name} ({case})"
            try:
                objs = fn([], overrides)
            except helm_render.RenderError as e:
                problems.add(where, str(e))
                continue
            rendered += len(objs)
            for o in objs:
                check_schema(o, f"{where}: {o.get('kind')}/{o['metadata'].get('name')}",
                             problems)
            check_consistency(f"helm {case}", objs, problems, require=require)
    return [n for n, _ in renderers], rendered


# ---------------------------------------------------------------------------------------------
# Dockerfile

INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
                "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


def dockerfile_instructions(text):
    """[(line number, INSTRUCTION, arguments)], continuation lines joined, comments dropped."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        word, _, rest = buf.partition(" ")
        out.append((start, word, rest.strip()))
        buf = ""
    if buf:
        out.append((start, "<unterminated>", buf))
    return out


def dockerignore_excludes(patterns, path):
    """Whether .dockerignore `patterns` exclude `path` (relative, '/'-separated): the last
    matching pattern wins; a pattern also excludes everything under a matching folder."""
    excluded = False
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for p in patterns:
        negate = p.startswith("!")
        pat = p[1:] if negate else p
        pat = pat.strip("/")
        regex = re.escape(pat).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, pre) for pre in prefixes):
            excluded = not negate
    return excluded


def check_dockerfile(problems, text=None, ignore_patterns=None):
    """deploy/docker/Dockerfile: known instructions; only ARG before the first FROM; every base
    image pinned to a tag (after ARG defaults), never :latest; unique stage names; COPY --from
    names an earlier stage; no ADD (COPY is explicit); apt-get update and install in one RUN
    with -y and --no-install-recommends, lists removed; absolute WORKDIRs; numeric EXPOSE; the
    final stage runs as a non-root user, has a HEALTHCHECK, and exec-form ENTRYPOINT/CMD/
    HEALTHCHECK (valid JSON arrays); the build context (repository root, .dockerignore)
    keeps every source folder the build needs and drops build outputs, models and .git."""
    where = "deploy/docker/Dockerfile"
    if text is None:
        with open(os.path.join(DEPLOY, "docker", "Dockerfile"), encoding="utf-8") as f:
            text = f.read()
    ins = dockerfile_instructions(text)
    args = {}
    stages = []
    seen_from = False
    final = {}
    for n, word, rest in ins:
        w = f"{where}:{n}"
        if word != word.upper() or word not in INSTRUCTIONS:
            problems.add(w, f"unknown or lower-case instruction {word}")
            continue
        if word == "ARG":
            name, _, default = rest.partition("=")
            if not seen_from:
                args[name] = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), default)
            continue
        if not seen_from and word != "FROM":
            problems.add(w, f"{word} before the first FROM")
        if word == "FROM":
            seen_from = True
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            if not m:
                problems.add(w, f"cannot parse FROM {rest}")
                continue
            image = re.sub(r"\$\{(\w+)\}", lambda x: args.get(x.group(1), "<unset>"), m.group(1))
            if "<unset>" in image:
                problems.add(w, f"FROM {m.group(1)}: an ARG without a default before FROM")
            elif image not in [s for s in stages] and "@" not in image:
                tag = image.rsplit("/", 1)[-1].partition(":")[2]
                if not tag:
                    problems.add(w, f"base image {image} is not pinned to a tag")
                elif tag == "latest":
                    problems.add(w, f"base image {image} uses :latest")
            name = m.group(2) or str(len(stages))
            if name in stages:
                problems.add(w, f"stage name {name} is used twice")
            stages.append(name)
            final = {"user": None, "healthcheck": False, "entry": False}
            continue
        if word == "ADD":
            problems.add(w, "use COPY (ADD fetches URLs and unpacks archives implicitly)")
        if word == "COPY":
            m = re.search(r"--from=(\S+)", rest)
            if m and m.group(1) not in stages[:-1]:
                problems.add(w, f"COPY --from={m.group(1)}: no earlier stage of that name")
        if word == "RUN" and "apt-get install" in rest:
            if "apt-get update" not in rest:
                problems.add(w, "apt-get install without apt-get update in the same RUN")
            if "--no-install-recommends" not in rest or not re.search(r"\s-y\b|--yes", rest):
                problems.add(w, "apt-get install needs -y and --no-install-recommends")
            if "rm -rf /var/lib/apt/lists" not in rest:
                problems.add(w, "remove /var/lib/apt/lists in the RUN that installs")
        if word == "WORKDIR" and not rest.startswith("/"):
            problems.add(w, f"WORKDIR {rest} is not absolute")
        if word == "EXPOSE":
            for p in rest.split():
                if not re.fullmatch(r"\d+(/(tcp|udp))?", p) or not 0 < int(p.split("/")[0]) < 65536:
                    problems.add(w, f"EXPOSE {p} is not a port")
        if word == "USER":
            final["user"] = rest.split(":")[0]
        if word in ("ENTRYPOINT", "CMD", "HEALTHCHECK"):
            payload = rest
            if word == "HEALTHCHECK":
                final["healthcheck"] = rest.strip() != "NONE"
                payload = rest[rest.index("CMD") + 3:].strip() if " CMD " in f" {rest} " else ""
                if not payload and final["healthcheck"]:
                    problems.add(w, "HEALTHCHECK without CMD")
            if payload:
                try:
                    value = json.loads(payload)
                    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                        raise ValueError
                except ValueError:
                    problems.add(w, f"{word} must be in exec form (a JSON array of strings)")
            if word == "ENTRYPOINT":
                final["entry"] = True
    if len(stages) < 2:
        problems.add(where, "expected a multi-stage build (build and runtime stages)")
    if final.get("user") in (None, "root", "0"):
        problems.add(where, "the final stage must switch to a non-root USER")
    if not final.get("healthcheck"):
        problems.add(where, "the final stage has no HEALTHCHECK")
    if not final.get("entry"):
        problems.add(where, "the final stage has no ENTRYPOINT")
    for a in ("BUILD_IMAGE", "RUNTIME_IMAGE"):
        if a not in args:
            problems.add(where, f"ARG {a} (the CPU variant's switch) is missing")

    patterns = ignore_patterns
    if patterns is None:
        ignore_path = os.path.join(ROOT, ".dockerignore")
        if not os.path.exists(ignore_path):
            problems.add(".dockerignore", "missing")
            return
        with open(ignore_path, encoding="utf-8") as f:
            patterns = [l.strip() for l in f if l.strip() and not l.strip().startswith("#")]
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        cmake = f.read()
    # Folders the build always adds (bench and tests are switched off in the image).
    needed = [d for d in re.findall(r"^add_subdirectory\((\w+)\)", cmake, re.M)
              if d not in ("bench", "tests")]
    needed += ["CMakeLists.txt", "cmake", "scripts/fetch_model.sh"]
    for d in needed:
        if not os.path.exists(os.path.join(ROOT, d)):
            problems.add(where, f"the build needs {d}, which does not exist")
        elif dockerignore_excludes(patterns, d):
            problems.add(".dockerignore", f"excludes {d}, which the image build needs")
    for d in (".git", "build", "build-asan", "models"):
        if not dockerignore_excludes(patterns, d):
            problems.add(".dockerignore", f"does not exclude {d}")


# ---------------------------------------------------------------------------------------------


def render(kubectl, d):
    """The objects `kubectl kustomize d` builds, or (None, why). Anything kustomize prints on
    stderr fails the build too: its warnings (deprecated fields such as `bases` or
    `patchesStrategicMerge`, fields it ignores) are problems to fix, not noise."""
    import yaml
    r = subprocess.run([kubectl, "kustomize", d], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    if r.stderr.strip():
        return None, "kustomize warned: " + " | ".join(r.stderr.strip().splitlines())
    return [o for o in yaml.safe_load_all(r.stdout) if o is not None], ""


# kustomize v4 (kubectl 1.21) is the first with `components` and with strategic-merge patches
# under `patches`; Debian 12's kubectl (1.20, kustomize v2.0.3) predates both.
MIN_KUSTOMIZE = (4, 0)


def kustomize_version(kubectl):
    """(major, minor) of the kustomize inside `kubectl`, or None when it does not say."""
    r = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True,
                       text=True)
    try:
        v = json.loads(r.stdout).get("kustomizeVersion", "")
    except ValueError:
        return None
    m = re.match(r"v?(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else None


def self_test_more(kubectl, objs, expect, failures):
    """The kustomize-warning, TLS, PrometheusRule-sync and Helm checks reject what they look
    for; the Go-template renderer follows Go's rules. Returns the number of cases."""
    import copy
    import tempfile
    import yaml
    sys.path.insert(0, DEPLOY)
    import helm_render
    n = 0

    # A deprecated field (`bases`) is a problem, not a warning.
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "kustomization.yaml"), "w", encoding="utf-8") as f:
            f.write("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                    f"bases:\n  - {os.path.relpath(os.path.join(K8S, 'base'), tmp)}\n")
        got, err = render(kubectl, tmp)
        n += 1
        if got is not None or "kustomize warned" not in err or "bases" not in err:
            failures.append(f"a kustomization with `bases` was not refused: {err or 'no error'}")

    # The component's PrometheusRule is rules.yml, and --sync-prometheusrule writes that.
    n += 1
    if yaml.safe_load(prometheus_rule_text())["spec"]["groups"] != rules_yml_groups():
        failures.append("prometheus_rule_text() does not hold rules.yml's groups")

    # TLS from the chart: probes that cannot speak TLS, files outside a mounted Secret.
    tls = helm_render.chart_objects(HELM_CHART, [], {"tls": {"enabled": True}})
    clean = Problems()
    check_consistency("helm tls", tls, clean)
    if clean.items:
        failures.append(f"the chart with TLS has problems: {clean.items}")

    def tls_case(label, fn, needle):
        o = copy.deepcopy(tls)
        fn(o)
        p = Problems()
        check_consistency("helm tls", o, p)
        expect(label, p, needle)

    def c0(o, name):
        return next(x for x in o if x["kind"] == "Deployment" and
                    x["metadata"]["name"] == name)["spec"]["template"]["spec"]["containers"][0]
    tls_cases = [
        ("TLS with a grpc probe", lambda o: c0(o, "tandem-prefill").update(
            readinessProbe={"grpc": {"port": 7000}}), "under TLS the probe must run tandem-health"),
        ("TLS probe without the key", lambda o: c0(o, "tandem-decode")["livenessProbe"]["exec"]
         .update(command=c0(o, "tandem-decode")["livenessProbe"]["exec"]["command"][:-2]),
         "differ from the server's"),
        ("TLS files not mounted", lambda o: c0(o, "tandem-router").update(
            volumeMounts=[m for m in c0(o, "tandem-router")["volumeMounts"]
                          if m["name"] != "tls"]), "is not in a mounted Secret"),
    ]
    for label, fn, needle in tls_cases:
        tls_case(label, fn, needle)
    n += len(tls_cases)

    # The chart against kustomize: a changed value, a changed template output, an extra object.
    base, err = render(kubectl, os.path.join(K8S, "base"))
    chart = helm_render.chart_objects(HELM_CHART)
    p = Problems()
    compare_objects("self-test", base, chart, p)
    if p.items:
        failures.append(f"the chart's defaults differ from the base: {p.items}")
    helm_cases = [
        ("chart replicas", helm_render.chart_objects(HELM_CHART, [],
                                                     {"decode": {"replicas": 3}}),
         "Deployment/tandem-decode.spec.replicas"),
        ("chart flags", helm_render.chart_objects(HELM_CHART, [], {"flags": {"decode": "-x"}}),
         "TANDEM_DECODE_FLAGS"),
        ("chart ServiceMonitor", helm_render.chart_objects(HELM_CHART, [],
                                                           {"serviceMonitor": {"enabled": True}}),
         "ServiceMonitor/tandem is rendered by the chart but not by kustomize"),
        ("chart without the dashboard",
         helm_render.chart_objects(HELM_CHART, [], {"grafanaDashboard": {"enabled": False}}),
         "ConfigMap/tandem-grafana-dashboard is built by kustomize but not by the chart"),
    ]
    for label, objs_, needle in helm_cases:
        p = Problems()
        compare_objects("self-test", base, objs_, p)
        expect(label, p, needle)
    n += len(helm_cases) + 1

    # The renderer against Go's text/template rules.
    go_cases = [
        ("a {{- 1 -}} b", {}, "a1b"),
        ("{{ if .Values.x }}yes{{ else if .Values.y }}y{{ else }}no{{ end }}", {"y": 1}, "y"),
        ("{{ range $k, $v := .Values.m }}{{ $k }}={{ $v }};{{ end }}", {"m": {"b": 2, "a": 1}},
         "a=1;b=2;"),
        ("{{ with .Values.m }}{{ .a }}{{ end }}|{{ with .Values.no }}x{{ else }}e{{ end }}",
         {"m": {"a": 5}}, "5|e"),
        ('{{ define "t" }}[{{ .v }}]{{ end }}{{ include "t" (dict "v" 3) | nindent 2 }}', {},
         "\n  [3]"),
        ('{{ .Values.s | quote }} {{ printf "%s-%d" .Values.s 7 }} {{ .Values.missing }}.',
         {"s": "a"}, '"a" a-7 .'),
        ("{{ and 1 0 }} {{ or 0 2 }} {{ not 0 }} {{ eq 1 1 }} {{ ne 1 1 }}", {},
         "0 2 true true false"),
        ("{{ toYaml .Values.m | indent 2 }}", {"m": {"k": ["a"]}}, "  k:\n  - a"),
        ("{{ $x := 4 }}{{ $x }}{{/* c */}}", {}, "4"),
    ]
    for src, values, want in go_cases:
        with tempfile.TemporaryDirectory() as tmp:
            os.mkdir(os.path.join(tmp, "templates"))
            with open(os.path.join(tmp, "Chart.yaml"), "w", encoding="utf-8") as f:
                f.write("name: t\nversion: 0.1.0\n")
            with open(os.path.join(tmp, "values.yaml"), "w", encoding="utf-8") as f:
                yaml.safe_dump(values, f)
            with open(os.path.join(tmp, "templates", "t.txt"), "w", encoding="utf-8") as f:
                f.write(src)
            try:
                got = helm_render.render_chart(tmp)["t.txt"]
            except helm_render.RenderError as e:
                got = f"RenderError: {e}"
        if got != want:
            failures.append(f"helm_render: {src!r} gave {got!r}, Go gives {want!r}")
    n += len(go_cases)
    for src in ('{{ lookup "v1" }}', "{{ if .Values.x }}", "{{ .Values.a | frobnicate }}"):
        with tempfile.TemporaryDirectory() as tmp:
            os.mkdir(os.path.join(tmp, "templates"))
            with open(os.path.join(tmp, "Chart.yaml"), "w", encoding="utf-8") as f:
                f.write("name: t\nversion: 0.1.0\n")
            with open(os.path.join(tmp, "values.yaml"), "w", encoding="utf-8") as f:
                f.write("{}\n")
            with open(os.path.join(tmp, "templates", "t.txt"), "w", encoding="utf-8") as f:
                f.write(src)
            try:
                helm_render.render_chart(tmp)
                failures.append(f"helm_render accepted {src!r}, which it does not understand")
            except helm_render.RenderError:
                pass
        n += 1
    return n


def self_test(kubectl):
    """Each check must reject a manifest or Dockerfile broken in the way it looks for."""
    import copy
    failures = []

    def expect(label, problems, needle):
        if not any(needle in p for p in problems.items):
            failures.append(f"{label}: expected a problem containing {needle!r}, got "
                            f"{problems.items or 'none'}")

    # The gpu overlay with both components: every kind of object the checks look at.
    on = ("api-keys", "prometheus-operator")
    objs, err = render_with(kubectl, os.path.join(K8S, "overlays", "gpu"),
                            [os.path.join(COMPONENTS, c) for c in on])
    if objs is None:
        print("self-test: kubectl kustomize failed: " + err)
        return 1
    clean = Problems()
    check_consistency("gpu", objs, clean, require=on)
    for o in objs:
        check_schema(o, "gpu", clean)
    if clean.items:
        failures.append(f"the gpu overlay itself has problems: {clean.items}")

    def deployment(objs, name):
        return next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == name)

    schema_cases = [
        ("unknown field", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(
            imagePullPolcy="Always"), "imagePullPolcy: unknown field"),
        ("wrong type", lambda d: d["spec"].update(replicas="2"), "expected an integer"),
        ("missing required", lambda d: d["spec"]["template"]["spec"].pop("containers"),
         "required field containers"),
        ("grpc probe without port", lambda d: d["spec"]["template"]["spec"]["containers"][0]
         ["readinessProbe"]["grpc"].pop("port"), "required field port"),
        ("unknown probe field", lambda d: d["spec"]["template"]["spec"]["containers"][0]
         ["livenessProbe"].update(grpcc={"port": 7000}), "grpcc: unknown field"),
        ("quantity as a number", lambda d: d["spec"]["template"]["spec"]["containers"][0]
         ["resources"]["limits"].update({"nvidia.com/gpu": 1}), "expected a string"),
    ]
    for label, mutate, needle in schema_cases:
        d = copy.deepcopy(deployment(objs, "tandem-decode"))
        mutate(d)
        p = Problems()
        check_schema(d, "self-test", p)
        expect(label, p, needle)
    sm = copy.deepcopy(next(o for o in objs if o["kind"] == "ServiceMonitor"))
    sm["spec"]["endpoints"][0]["intervall"] = "5s"
    p = Problems()
    check_schema(sm, "self-test", p)
    expect("ServiceMonitor unknown field", p, "intervall: unknown field")

    pr = copy.deepcopy(next(o for o in objs if o["kind"] == "PrometheusRule"))
    pr["spec"]["groups"][0]["rules"][0]["recrod"] = "x"
    p = Problems()
    check_schema(pr, "self-test", p)
    expect("PrometheusRule unknown field", p, "recrod: unknown field")
    sm = copy.deepcopy(next(o for o in objs if o["kind"] == "ServiceMonitor"))
    sm["apiVersion"] = "monitoring.coreos.com/v1alpha1"
    p = Problems()
    check_schema(sm, "self-test", p)
    expect("ServiceMonitor apiVersion", p, "only monitoring.coreos.com/v1")

    def mutated(fn):
        o = copy.deepcopy(objs)
        fn(o)
        p = Problems()
        check_consistency("gpu", o, p, require=on)
        return p

    def first(o, kind):
        return next(x for x in o if x["kind"] == kind)

    def router_pod(o):
        return deployment(o, "tandem-router")["spec"]["template"]["spec"]

    def container(o, name):
        return deployment(o, name)["spec"]["template"]["spec"]["containers"][0]

    consistency_cases = [
        ("exec probe", lambda o: container(o, "tandem-router").update(
            readinessProbe={"exec": {"command": ["true"]}}), "native grpc probe"),
        ("short grace", lambda o: deployment(o, "tandem-prefill")["spec"]["template"]["spec"]
         .update(terminationGracePeriodSeconds=int(default_drain_seconds())),
         "terminationGracePeriodSeconds"),
        ("no GPU", lambda o: container(o, "tandem-decode")["resources"]["limits"]
         .pop("nvidia.com/gpu"), "must request nvidia.com/gpu"),
        ("router GPU", lambda o: container(o, "tandem-router").setdefault("resources", {})
         .setdefault("limits", {}).update({"nvidia.com/gpu": "1"}), "requests a GPU outside"),
        ("dashboard copy", lambda o: next(c for c in o if "tandem-dashboard.json" in
                                          c.get("data", {}))["data"].update(
            {"tandem-dashboard.json": "{}"}), "differs from deploy/grafana"),
        ("wrong router", lambda o: container(o, "tandem-decode").update(
            args=[container(o, "tandem-decode")["args"][0].replace("tandem-router:", "router:")]),
         "--router tandem-router"),
        ("pdb selector", lambda o: [x for x in o if x["kind"] == "PodDisruptionBudget"][0]["spec"]
         ["selector"]["matchLabels"].update({"app.kubernetes.io/component": "nope"}),
         "selects no pods"),
        ("missing configmap", lambda o: o.remove(next(c for c in o if c["kind"] == "ConfigMap" and
                                                      c["metadata"]["name"].startswith(
                                                          "tandem-config"))), "envFrom: no ConfigMap"),
        ("not headless", lambda o: next(x for x in o if x["kind"] == "Service" and
                                        x["metadata"]["name"] == ROUTER_SERVICE)["spec"].update(
            clusterIP="10.0.0.1"), "must be headless"),
        ("selector mismatch", lambda o: deployment(o, "tandem-decode")["spec"]["selector"]
         ["matchLabels"].update({"app.kubernetes.io/component": "x"}), "selector does not match"),
        ("internal port in the public Service", lambda o: next(
            x for x in o if x["kind"] == "Service" and x["metadata"]["name"] == PUBLIC_SERVICE)
         ["spec"]["ports"].append({"name": "internal", "port": 7001, "targetPort": "internal"}),
         "which is not a public port"),
        ("no secret flag", lambda o: container(o, "tandem-decode").update(
            args=[container(o, "tandem-decode")["args"][0].replace(
                "--cluster-secret-file", "--cluster-secret")]), "no --cluster-secret-file"),
        ("no secret volume", lambda o: deployment(o, "tandem-prefill")["spec"]["template"]["spec"]
         .update(volumes=[v for v in deployment(o, "tandem-prefill")["spec"]["template"]["spec"]
                          ["volumes"] if "secret" not in v]), "no volume of the Secret"),
        ("no worker NetworkPolicy", lambda o: o.remove(next(
            x for x in o if x["kind"] == "NetworkPolicy" and
            x["metadata"]["name"] == "tandem-workers")), "no NetworkPolicy selects the pods"),
        ("KV port open to all", lambda o: next(
            x for x in o if x["kind"] == "NetworkPolicy" and
            x["metadata"]["name"] == "tandem-workers")["spec"]["ingress"].append(
                {"ports": [{"port": 7100}]}), "port 7100 is open beyond"),
        # API keys from the Secret (the api-keys component).
        ("API keys not passed", lambda o: container(o, "tandem-router").update(
            env=[e for e in container(o, "tandem-router")["env"]
                 if e["name"] != "TANDEM_API_KEYS_FILE"]), "passes no --api-keys-file"),
        ("API keys from another Secret", lambda o: next(
            v for v in router_pod(o)["volumes"] if v["name"] == "api-keys")["secret"].update(
                secretName="other"), "is not in a mount of the Secret tandem-api-keys"),
        ("API keys writable", lambda o: next(
            m for m in container(o, "tandem-router")["volumeMounts"] if m["name"] == "api-keys")
         .pop("readOnly"), "mounted readOnly"),
        ("API keys file not an item", lambda o: next(
            e for e in container(o, "tandem-router")["env"]
            if e["name"] == "TANDEM_API_KEYS_FILE").update(
                value="/etc/tandem/api-keys/other.txt"), "no item of the Secret volume"),
        ("API keys on a worker", lambda o: container(o, "tandem-decode").update(
            args=[container(o, "tandem-decode")["args"][0] + " --api-keys-file /x"]),
         "only the router takes API keys"),
        # The Prometheus Operator's objects (the prometheus-operator component).
        ("no ServiceMonitor", lambda o: o.remove(first(o, "ServiceMonitor")), "no ServiceMonitor"),
        ("ServiceMonitor port", lambda o: first(o, "ServiceMonitor")["spec"]["endpoints"][0]
         .update(port="http-metrics"), "not the Services' `metrics` port"),
        ("ServiceMonitor job", lambda o: first(o, "ServiceMonitor")["spec"].pop("jobLabel"),
         "rules.yml's alerts expect job="),
        ("ServiceMonitor selector", lambda o: first(o, "ServiceMonitor")["spec"]["selector"]
         .pop("matchExpressions"), "selects tandem-api"),
        ("ServiceMonitor misses a role", lambda o: first(o, "ServiceMonitor")["spec"]["selector"]
         ["matchExpressions"][0].update(values=["router", "prefill"]),
         "misses Service tandem-decode"),
        ("PrometheusRule drifted", lambda o: first(o, "PrometheusRule")["spec"]["groups"][0]
         ["rules"][0].update(expr="vector(1)"), "differs from deploy/prometheus/rules.yml"),
        ("no PrometheusRule", lambda o: o.remove(first(o, "PrometheusRule")),
         "no PrometheusRule"),
    ]
    for label, fn, needle in consistency_cases:
        expect(label, mutated(fn), needle)

    # The autoscaling overlay: an HPA on a metric no adapter rule serves, on another role's
    # metric, or aimed at no Deployment.
    scaled, err = render(kubectl, os.path.join(K8S, "overlays", "autoscaling"))
    if scaled is None:
        failures.append("kubectl kustomize overlays/autoscaling: " + err)
        scaled = []

    def hpa(o, name):
        return next(x for x in o if x["kind"] == "HorizontalPodAutoscaler" and
                    x["metadata"]["name"] == name)

    autoscaling_cases = [
        ("unserved metric", lambda o: hpa(o, "tandem-decode")["spec"]["metrics"][0]["pods"]
         ["metric"].update(name="tandem_decode_kv_usage"), "no rule in"),
        ("another role's metric", lambda o: hpa(o, "tandem-prefill")["spec"]["metrics"][0]["pods"]
         ["metric"].update(name="tandem_decode_requests_waiting"), "is a decode metric"),
        ("no such target", lambda o: hpa(o, "tandem-decode")["spec"]["scaleTargetRef"].update(
            name="tandem-decoder"), "is not a Deployment"),
    ]
    for label, fn, needle in autoscaling_cases if scaled else []:
        o = copy.deepcopy(scaled)
        fn(o)
        p = Problems()
        check_consistency("autoscaling", o, p)
        expect(label, p, needle)

    with open(os.path.join(DEPLOY, "docker", "Dockerfile"), encoding="utf-8") as f:
        dockerfile = f.read()
    docker_cases = [
        ("latest", lambda t: t.replace("FROM ${RUNTIME_IMAGE} AS runtime",
                                       "FROM debian:latest AS runtime"), ":latest"),
        ("untagged", lambda t: t.replace("FROM ${RUNTIME_IMAGE} AS runtime",
                                         "FROM debian AS runtime"), "not pinned"),
        ("root", lambda t: t.replace("USER 10001:10001", "USER root"), "non-root USER"),
        ("no healthcheck", lambda t: re.sub(r"HEALTHCHECK [^\n]*\\\n[^\n]*\n", "", t),
         "no HEALTHCHECK"),
        ("ADD", lambda t: t.replace("COPY . .", "ADD . ."), "use COPY"),
        ("recommends", lambda t: t.replace("--no-install-recommends", ""), "--no-install-recommends"),
        ("shell form", lambda t: t.replace('ENTRYPOINT ["tandem-server"]',
                                           "ENTRYPOINT tandem-server"), "exec form"),
        ("bad stage", lambda t: t.replace("--from=build", "--from=builder"), "no earlier stage"),
    ]
    for label, fn, needle in docker_cases:
        changed = fn(dockerfile)
        if changed == dockerfile:
            failures.append(f"Dockerfile case {label}: the mutation did not apply")
            continue
        p = Problems()
        check_dockerfile(p, text=changed)
        expect(f"Dockerfile {label}", p, needle)
    p = Problems()
    check_dockerfile(p, ignore_patterns=["engine", "build*"])
    expect(".dockerignore excluding sources", p, "excludes engine")
    expect(".dockerignore keeping .git", p, "does not exclude .git")
    for path, pats, want in [("build/bin", ["build*"], True), ("engine/x.cc", ["build*"], False),
                             ("a/b/__pycache__", ["**/__pycache__"], True),
                             ("models", ["models", "!models"], False)]:
        if dockerignore_excludes(pats, path) != want:
            failures.append(f"dockerignore_excludes({pats}, {path}) != {want}")

    n_more = self_test_more(kubectl, objs, expect, failures)
    for f in failures:
        print("self-test: " + f)
    n = (len(schema_cases) + len(consistency_cases) + len(autoscaling_cases) + len(docker_cases) +
         9 + n_more)
    print(f"deploy validation self-test: {'FAILED' if failures else 'ok'} ({n} cases)")
    return 1 if failures else 0


def main():
    missing = []
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        missing.append("kubectl (Debian package kubernetes-client)")
    yamllint = shutil.which("yamllint")
    if yamllint is None:
        missing.append("yamllint")
    try:
        import kubernetes.client  # noqa: F401
        import yaml
    except ImportError:
        missing.append("python3-kubernetes (run with /usr/bin/python3)")
    if "--sync-prometheusrule" in sys.argv[1:]:
        with open(PROMETHEUS_RULE, "w", encoding="utf-8") as f:
            f.write(prometheus_rule_text())
        print(f"wrote {os.path.relpath(PROMETHEUS_RULE, ROOT)} from "
              f"{os.path.relpath(RULES, ROOT)}")
        return 0
    if missing:
        print("deploy validation skipped: missing " + ", ".join(missing) +
              " (scripts/setup.sh installs them)")
        return SKIP
    version = kustomize_version(kubectl)
    if version is None or version < MIN_KUSTOMIZE:
        print(f"deploy validation skipped: {kubectl} has kustomize "
              f"{'.'.join(map(str, version)) if version else '(unknown)'}; the manifests need "
              f"v{MIN_KUSTOMIZE[0]} or newer (kubectl 1.21 or newer; Debian 12's kubectl is 1.20)")
        return SKIP

    if "--self-test" in sys.argv[1:]:
        return self_test(kubectl)

    problems = Problems()
    overlays = sorted(os.listdir(os.path.join(K8S, "overlays")))
    if set(overlays) < {"cpu-demo", "gpu"}:
        problems.add("deploy/k8s/overlays", f"expected cpu-demo and gpu, found {overlays}")
    counts = {}
    for overlay in ["base"] + overlays:
        d = os.path.join(K8S, "base") if overlay == "base" else os.path.join(K8S, "overlays", overlay)
        objs, err = render(kubectl, d)
        if objs is None:
            problems.add(f"kubectl kustomize {os.path.relpath(d, ROOT)}", err)
            continue
        counts[overlay] = len(objs)
        for i, o in enumerate(objs):
            name = f"{overlay}: {o.get('kind')}/{o.get('metadata', {}).get('name')}"
            check_schema(o, name, problems)
        if overlay != "base":
            check_consistency(overlay, objs, problems, require=used_components(d))

    # Every optional component on every overlay that does not have it yet.
    combos = 0
    for comp, comp_dir in components().items():
        for overlay in overlays:
            d = os.path.join(K8S, "overlays", overlay)
            if comp in used_components(d):
                continue
            objs, err = render_with(kubectl, d, [comp_dir])
            where = f"{overlay} + component {comp}"
            if objs is None:
                problems.add(f"kubectl kustomize {where}", err)
                continue
            combos += 1
            for o in objs:
                check_schema(o, f"{where}: {o.get('kind')}/{o['metadata'].get('name')}",
                             problems)
            check_consistency(where, objs, problems, gpu=overlay == "gpu",
                              require=used_components(d) | {comp})
    if not os.path.exists(PROMETHEUS_RULE):
        problems.add(os.path.relpath(PROMETHEUS_RULE, ROOT), "missing (--sync-prometheusrule)")

    helm_names, helm_objects = check_helm(kubectl, problems)

    r = subprocess.run([yamllint, "-f", "parsable", "-c", os.path.join(DEPLOY, "yamllint.yaml"),
                        DEPLOY], capture_output=True, text=True)
    if r.returncode != 0:
        for line in (r.stdout + r.stderr).strip().splitlines():
            problems.add("yamllint", line)

    check_dockerfile(problems)

    for p in problems.items:
        print(p)
    summary = ", ".join(f"{k} {v} objects" for k, v in counts.items())
    if problems.items:
        print(f"deploy validation: {len(problems.items)} problem(s) ({summary})")
        return 1
    print(f"deploy validation: ok ({summary}; {combos} overlay+component builds; Helm chart "
          f"by {' and '.join(helm_names)}, {helm_objects} objects against kustomize; yamllint; "
          f"Dockerfile)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
