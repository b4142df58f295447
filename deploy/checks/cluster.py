"""Rules across the objects of one build: selectors, references, ports, probes, TLS, the
cluster secret, API keys, GPUs, NetworkPolicies, autoscalers, the Prometheus Operator's objects
and the dashboard."""

import os
import re

from .apikeys import API_KEYS_SECRET  # the api-keys component's Secret (key keys.txt)
from .common import DEPLOY, GRPC_PORT, HTTP_PORT, ROOT, ROUTER_INTERNAL_PORT, RULES, matches
from .network import check_network_policies

# After SIGTERM, tandem-server drains for up to --drain-timeout-ms (its default is read from
# server/server_config.h), then stops within about a second and says goodbye to the routers:
# the grace period must exceed the drain by this margin.
GRACE_MARGIN_SECONDS = 5
ROUTER_SERVICE = "tandem-router"
PUBLIC_SERVICE = "tandem-api"
SECRET_NAME = "tandem-cluster-secret"
# The Deployment of each role.
ROLES = {"tandem-router": "router", "tandem-prefill": "prefill", "tandem-decode": "decode"}


def default_drain_seconds():
    with open(os.path.join(ROOT, "server", "server_config.h"), encoding="utf-8") as f:
        m = re.search(r'int64_t drain_timeout_ms = (\d+);', f.read())
    return int(m.group(1)) / 1000 if m else None


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



class Build:
    """The objects of one build, by kind and by name, and what they must meet: `gpu` (whether the
    workers request GPUs) and `require` (the components in effect)."""

    def __init__(self, objs, gpu, require):
        self.by_kind = {}
        for o in objs:
            self.by_kind.setdefault(o["kind"], []).append(o)
        self.deployments = {d["metadata"]["name"]: d for d in self.by_kind.get("Deployment", [])}
        self.configmaps = {c["metadata"]["name"]: c for c in self.by_kind.get("ConfigMap", [])}
        self.pvcs = {c["metadata"]["name"] for c in self.by_kind.get("PersistentVolumeClaim", [])}
        self.services = {s["metadata"]["name"]: s for s in self.by_kind.get("Service", [])}
        self.gpu = gpu
        self.require = require
        # tandem-config's values, where a --drain-timeout-ms may be set.
        self.config_text = " ".join(str(v) for c in self.configmaps.values()
                                    if c["metadata"]["name"].startswith("tandem-config")
                                    for v in c.get("data", {}).values())


def check_consistency(overlay, objs, problems, gpu=None, require=()):
    """`require`: the components that must be in effect ("api-keys", "prometheus-operator").
    `gpu`: whether the workers must request GPUs (default: the gpu overlay's)."""
    where = f"overlay {overlay}"
    if gpu is None:
        gpu = overlay == "gpu"
    build = Build(objs, gpu, require)

    for name in ROLES:
        if name not in build.deployments:
            problems.add(where, f"Deployment {name} is missing")

    namespaces = {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"}
    if len(namespaces) != 1:
        problems.add(where, f"objects span namespaces {sorted(map(str, namespaces))}")

    drain = default_drain_seconds()
    if drain is None:
        problems.add(where, "cannot find the --drain-timeout-ms default in server/server_config.h")
        drain = 0
    pod_labels = {}
    for name, d in build.deployments.items():
        pod_labels[name] = check_deployment(f"{where}: Deployment {name}", name, d, build, drain,
                                            problems)

    check_router_services(where, build.services, build.deployments, problems)
    check_network_policies(where, build.by_kind.get("NetworkPolicy", []), pod_labels, problems)
    check_service_targets(where, build.services, build.deployments, pod_labels, problems)
    check_disruption_budgets(where, build.by_kind.get("PodDisruptionBudget", []),
                             build.deployments, pod_labels, problems)
    check_autoscalers(where, build.by_kind.get("HorizontalPodAutoscaler", []), build.deployments,
                      problems)
    check_monitoring(where, build.by_kind, build.services, require, problems)
    check_config_maps(where, build.configmaps, problems)


def check_deployment(w, name, d, build, drain, problems):
    """The Deployment `name` of `build`: selector, scrape annotation, grace period against the
    drain (`drain`: the server's default), non-root pods, volumes, and each container. Returns
    its pod labels."""
    spec = d["spec"]
    labels = spec["template"]["metadata"].get("labels", {})
    if not matches(spec["selector"], labels):
        problems.add(w, "selector does not match the pod template's labels")
    pod = spec["template"]["spec"]
    ann = spec["template"]["metadata"].get("annotations", {})
    if ann.get("prometheus.io/scrape") != "true":
        problems.add(w, "no prometheus.io/scrape annotation")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    command_text = " ".join(" ".join(c.get("command", []) + c.get("args", []))
                            for c in pod["containers"])
    flags = re.findall(r"--drain-timeout-ms[ =](\d+)", command_text + " " + build.config_text)
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
        if "configMap" in v and v["configMap"]["name"] not in build.configmaps:
            problems.add(w, f"volume {v['name']}: no ConfigMap {v['configMap']['name']}")
        if ("persistentVolumeClaim" in v and
                v["persistentVolumeClaim"]["claimName"] not in build.pvcs):
            problems.add(w, f"volume {v['name']}: no PVC "
                            f"{v['persistentVolumeClaim']['claimName']} in the overlay")
    for c in pod["containers"]:
        check_container(f"{w} container {c['name']}", ROLES.get(name), c, volumes,
                        secret_volumes, build, problems)
    return labels


def check_container(cw, role, c, volumes, secret_volumes, build, problems):
    """A container of the Deployment of `role` (None: not a Tandem role): probes, TLS files, API
    keys, the metrics port, ConfigMaps and volumes it refers to, its command and its GPUs."""
    ports = {p["containerPort"] for p in c.get("ports", [])}
    port_names = {p.get("name") for p in c.get("ports", [])}
    literal_env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    effective = expand_command(" ".join(c.get("command", []) + c.get("args", [])), literal_env)
    tls = tls_files(effective)
    check_probes(cw, c, ports, tls, problems)
    for f, path in tls.items():
        if mounted_file(path, c, volumes) is None:
            problems.add(cw, f"--tls-{f} {path} is not in a mounted Secret")
    if tls and not {"cert", "key"} <= set(tls):
        problems.add(cw, "--tls-cert and --tls-key go together")
    check_api_keys(cw, role, c, effective, volumes, build.require, problems)
    if "metrics" not in port_names:
        problems.add(cw, "no port named metrics")
    for ef in c.get("envFrom", []):
        ref = ef.get("configMapRef", {}).get("name")
        if ref is not None and ref not in build.configmaps:
            problems.add(cw, f"envFrom: no ConfigMap {ref}")
    for m in c.get("volumeMounts", []):
        if m["name"] not in volumes:
            problems.add(cw, f"volumeMount {m['name']}: no such volume")
    check_command(cw, role, c, secret_volumes, problems)
    check_gpus(cw, role, c, build.gpu, problems)


def check_command(cw, role, c, secret_volumes, problems):
    """The container runs its role's program with the cluster secret from a mount of the Secret;
    the router's registry is on its internal port, and the workers register there and
    advertise the pod IP."""
    command = " ".join(c.get("command", []) + c.get("args", []))
    if role and f"tandem-{role}" not in command:
        problems.add(cw, f"does not run tandem-{role}")
    m = re.search(r"--cluster-secret-file (\S+)", command)
    mounts = [vm for vm in c.get("volumeMounts", []) if vm["name"] in secret_volumes]
    if not m:
        problems.add(cw, "no --cluster-secret-file: internal calls would be refused")
    elif not any(m.group(1).startswith(vm["mountPath"].rstrip("/") + "/") for vm in mounts):
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


def check_gpus(cw, role, c, gpu, problems):
    """nvidia.com/gpu on the workers where `gpu` is set (requests equal to limits), else
    nowhere."""
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


def check_router_services(where, services, deployments, problems):
    """The router's headless Service exposes its registry; the public Service exposes the
    router's client-facing ports and nothing internal."""
    router = services.get(ROUTER_SERVICE)
    if router is None:
        problems.add(where, f"Service {ROUTER_SERVICE} is missing")
    else:
        if router["spec"].get("clusterIP") != "None":
            problems.add(where, f"Service {ROUTER_SERVICE} must be headless (clusterIP: None)")
        if ROUTER_INTERNAL_PORT not in [p["port"] for p in router["spec"]["ports"]]:
            problems.add(where, f"Service {ROUTER_SERVICE} does not expose {ROUTER_INTERNAL_PORT}")
    public = services.get(PUBLIC_SERVICE)
    if public is None:
        problems.add(where, f"Service {PUBLIC_SERVICE} is missing")
        return
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


def check_service_targets(where, services, deployments, pod_labels, problems):
    """Every Service selects some Deployment's pods, and a named target port is a port of a
    selected pod."""
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


def check_disruption_budgets(where, pdbs, deployments, pod_labels, problems):
    """Every PodDisruptionBudget selects pods, and every Deployment has one."""
    for pdb in pdbs:
        if not any(matches(pdb["spec"]["selector"], l) for l in pod_labels.values()):
            problems.add(where, f"PodDisruptionBudget {pdb['metadata']['name']} selects no pods")
    covered = {d for d in deployments
               for pdb in pdbs
               if matches(pdb["spec"]["selector"], pod_labels[d])}
    for d in deployments:
        if d not in covered:
            problems.add(where, f"Deployment {d} has no PodDisruptionBudget")


def check_config_maps(where, configmaps, problems):
    """One dashboard ConfigMap holding deploy/grafana/tandem-dashboard.json byte for byte, and one
    tandem-config with TANDEM_MODEL."""
    dashboards = [c for c in configmaps.values() if "tandem-dashboard.json" in c.get("data", {})]
    with open(os.path.join(DEPLOY, "grafana", "tandem-dashboard.json"), encoding="utf-8") as f:
        dashboard = f.read()
    if len(dashboards) != 1:
        problems.add(where, "expected one ConfigMap with tandem-dashboard.json")
    elif dashboards[0]["data"]["tandem-dashboard.json"] != dashboard:
        problems.add(where,
                     "the dashboard ConfigMap differs from deploy/grafana/tandem-dashboard.json")
    elif dashboards[0]["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
        problems.add(where, "the dashboard ConfigMap lacks the grafana_dashboard label")
    config = [c for n, c in configmaps.items() if n.startswith("tandem-config")]
    if len(config) != 1 or not config[0].get("data", {}).get("TANDEM_MODEL"):
        problems.add(where, "expected one tandem-config ConfigMap with TANDEM_MODEL")
