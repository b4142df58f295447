"""--self-test: each check rejects a manifest or Dockerfile broken in the way it looks for (the
chart's checks: checks/selftest_chart.py)."""

import copy
import os
import re
import tempfile

from .cluster import (PUBLIC_SERVICE, ROUTER_SERVICE, check_consistency, default_drain_seconds,
                      prometheus_rule_text, rules_yml_groups)
from .common import COMPONENTS, K8S, Problems
from .dockerfile import (DOCKERFILE, check_build_context, check_image_rules, dockerignore_excludes,
                         hadolint)
from .rendering import render, render_with
from .schema import check_schema
from .selftest_chart import container, deployment, mutated, self_test_chart, self_test_tls


def self_test(kubectl):
    """Each check must reject a manifest or Dockerfile broken in the way it looks for."""
    failures = []
    expect = expecter(failures)

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

    n = self_test_schema(objs, expect)
    n += self_test_consistency(objs, on, expect)
    n += self_test_autoscaling(kubectl, expect, failures)
    n += self_test_dockerfile(expect, failures)
    n += self_test_kustomize_warning(kubectl, failures)
    n += self_test_prometheus_rule(failures)
    n += self_test_tls(expect, failures)
    n += self_test_chart(kubectl, expect, failures)
    for f in failures:
        print("self-test: " + f)
    print(f"deploy validation self-test: {'FAILED' if failures else 'ok'} ({n} cases)")
    return 1 if failures else 0


def expecter(failures):
    """expect(label, problems, needle): a failure unless one of `problems` holds `needle`."""
    def expect(label, problems, needle):
        if not any(needle in p for p in problems.items):
            failures.append(f"{label}: expected a problem containing {needle!r}, got "
                            f"{problems.items or 'none'}")
    return expect


def first(o, kind):
    return next(x for x in o if x["kind"] == kind)


def router_pod(o):
    return deployment(o, "tandem-router")["spec"]["template"]["spec"]


def hpa(o, name):
    return next(x for x in o if x["kind"] == "HorizontalPodAutoscaler" and
                x["metadata"]["name"] == name)


def self_test_schema(objs, expect):
    """kubernetes-validate's findings reach the problems: unknown fields, wrong types and missing
    required fields, in the Kubernetes objects and in the Prometheus Operator's. Returns the
    number of cases."""
    schema_cases = [
        ("unknown field", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(
            imagePullPolcy="Always"), "'imagePullPolcy' was unexpected"),
        ("wrong type", lambda d: d["spec"].update(replicas="2"), "spec.replicas: '2' is not of"),
        ("missing required", lambda d: d["spec"]["template"]["spec"].pop("containers"),
         "'containers' is a required property"),
        ("grpc probe without port", lambda d: d["spec"]["template"]["spec"]["containers"][0]
         ["readinessProbe"]["grpc"].pop("port"), "'port' is a required property"),
    ]
    for label, mutate, needle in schema_cases:
        d = copy.deepcopy(deployment(objs, "tandem-decode"))
        mutate(d)
        p = Problems()
        check_schema(d, "self-test", p)
        expect(label, p, needle)
    custom_cases = [
        ("ServiceMonitor unknown field", "ServiceMonitor",
         lambda o: o["spec"]["endpoints"][0].update(intervall="5s"), "'intervall' was unexpected"),
        ("ServiceMonitor interval", "ServiceMonitor",
         lambda o: o["spec"]["endpoints"][0].update(interval="5 seconds"), "does not match"),
        ("PrometheusRule unknown field", "PrometheusRule",
         lambda o: o["spec"]["groups"][0]["rules"][0].update(recrod="x"),
         "'recrod' was unexpected"),
        ("ServiceMonitor apiVersion", "ServiceMonitor",
         lambda o: o.update(apiVersion="monitoring.coreos.com/v1alpha1"),
         "only monitoring.coreos.com/v1"),
    ]
    for label, kind, mutate, needle in custom_cases:
        o = copy.deepcopy(first(objs, kind))
        mutate(o)
        p = Problems()
        check_schema(o, "self-test", p)
        expect(label, p, needle)
    return len(schema_cases) + len(custom_cases)


def self_test_consistency(objs, on, expect):
    """The cluster rules reject each mutation of consistency_cases() and component_cases() of the
    gpu overlay with the components `on`. Returns the number of cases."""
    cases = consistency_cases() + component_cases()
    for label, fn, needle in cases:
        expect(label, mutated("gpu", objs, fn, require=on), needle)
    return len(cases)


def consistency_cases():
    """(label, mutation of the objects, expected problem) for the rules every build meets."""
    return [
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
        ("missing configmap", lambda o: o.remove(next(
            c for c in o if c["kind"] == "ConfigMap" and
            c["metadata"]["name"].startswith("tandem-config"))), "envFrom: no ConfigMap"),
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
            x["metadata"]["name"] == "tandem-workers")), "no NetworkPolicy limits the ingress"),
        ("KV port open to all", lambda o: next(
            x for x in o if x["kind"] == "NetworkPolicy" and
            x["metadata"]["name"] == "tandem-workers")["spec"]["ingress"].append(
                {"ports": [{"port": 7100}]}), "port 7100 is open beyond"),
    ] + network_cases()


def policy(o, name):
    return next(x for x in o if x["kind"] == "NetworkPolicy" and x["metadata"]["name"] == name)


def network_cases():
    """(label, mutation of the objects, expected problem) for /metrics and egress."""
    return [
        ("metrics from every namespace", lambda o: policy(o, "tandem-router")["spec"]["ingress"]
         [-1].update({"from": [{"namespaceSelector": {}}]}), "port 9400 (/metrics) is open"),
        ("metrics from anywhere", lambda o: policy(o, "tandem-workers")["spec"]["ingress"][-1]
         .pop("from"), "port 9400 (/metrics) is open"),
        ("metrics closed", lambda o: policy(o, "tandem-workers")["spec"]["ingress"].pop(),
         "Prometheus cannot scrape it"),
        ("public port closed", lambda o: policy(o, "tandem-router")["spec"]["ingress"][0]
         .update(ports=[{"port": 7000}]), "admits the public port 8000"),
        ("no egress policy", lambda o: o.remove(policy(o, "tandem-egress")),
         "no NetworkPolicy limits the egress"),
        ("egress anywhere", lambda o: policy(o, "tandem-egress")["spec"]["egress"].append(
            {"ports": [{"port": 443}]}), "without `to`"),
        ("egress to every namespace", lambda o: policy(o, "tandem-egress")["spec"]["egress"]
         .append({"to": [{"namespaceSelector": {}}]}), "reaches every namespace"),
        ("egress without DNS over TCP", lambda o: policy(o, "tandem-egress")["spec"]["egress"][0]
         ["ports"].pop(), "no egress to DNS (53/TCP)"),
        ("egress without the registry", lambda o: policy(o, "tandem-egress")["spec"]["egress"][1]
         ["ports"].remove({"port": 7001}), "no egress to port 7001"),
        ("egress to the KV port elsewhere", lambda o: policy(o, "tandem-egress")["spec"]
         ["egress"][1]["to"][0].update(namespaceSelector={"matchLabels": {"x": "y"}}),
         "no egress to port 7100"),
    ]


def component_cases():
    """(label, mutation of the objects, expected problem) for the api-keys and
    prometheus-operator components."""
    return [
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


def self_test_autoscaling(kubectl, expect, failures):
    """The autoscaling overlay: an HPA on a metric no adapter rule serves, on another role's
    metric, or aimed at no Deployment. Returns the number of cases."""
    scaled, err = render(kubectl, os.path.join(K8S, "overlays", "autoscaling"))
    if scaled is None:
        failures.append("kubectl kustomize overlays/autoscaling: " + err)
        scaled = []

    autoscaling_cases = [
        ("unserved metric", lambda o: hpa(o, "tandem-decode")["spec"]["metrics"][0]["pods"]
         ["metric"].update(name="tandem_decode_kv_usage"), "no rule in"),
        ("another role's metric", lambda o: hpa(o, "tandem-prefill")["spec"]["metrics"][0]["pods"]
         ["metric"].update(name="tandem_decode_requests_waiting"), "is a decode metric"),
        ("no such target", lambda o: hpa(o, "tandem-decode")["spec"]["scaleTargetRef"].update(
            name="tandem-decoder"), "is not a Deployment"),
    ]
    for label, fn, needle in autoscaling_cases if scaled else []:
        expect(label, mutated("autoscaling", scaled, fn), needle)
    return len(autoscaling_cases)


def self_test_dockerfile(expect, failures):
    """hadolint's findings reach the problems, and Tandem's rules for the Dockerfile and the
    .dockerignore reject each mutation. Returns the number of cases."""
    with open(DOCKERFILE, encoding="utf-8") as f:
        dockerfile = f.read()
    runtime = "FROM ${RUNTIME_IMAGE} AS runtime"
    lint_cases = [
        ("latest", lambda t: t.replace(runtime, "FROM debian:latest AS runtime"), "DL3007"),
        ("untagged", lambda t: t.replace(runtime, "FROM debian AS runtime"), "DL3006"),
        ("ADD", lambda t: t.replace("COPY . .", "ADD . ."), "DL3020"),
        ("recommends", lambda t: t.replace("--no-install-recommends", ""), "DL3015"),
        ("shell form", lambda t: t.replace('ENTRYPOINT ["tandem-server"]',
                                           "ENTRYPOINT tandem-server"), "DL3025"),
        ("bad stage", lambda t: t.replace("--from=build", "--from=builder"), "DL3022"),
    ]
    rule_cases = [
        ("root", lambda t: t.replace("USER 10001:10001", "USER root"), "non-root USER"),
        ("no user", lambda t: t.replace("USER 10001:10001\n", ""), "non-root USER"),
        ("no healthcheck", lambda t: re.sub(r"HEALTHCHECK [^\n]*\\\n[^\n]*\n", "", t),
         "no HEALTHCHECK"),
        ("no entrypoint", lambda t: t.replace('ENTRYPOINT ["tandem-server"]\n', ""),
         "no ENTRYPOINT"),
        ("no CPU switch", lambda t: t.replace("ARG RUNTIME_IMAGE=", "ARG RUNTIME_BASE="),
         "ARG RUNTIME_IMAGE"),
    ]
    for label, fn, needle in lint_cases + rule_cases:
        changed = fn(dockerfile)
        if changed == dockerfile:
            failures.append(f"Dockerfile case {label}: the mutation did not apply")
            continue
        p = Problems()
        if (label, fn, needle) in lint_cases:
            hadolint(p, DOCKERFILE, changed)
        else:
            check_image_rules(p, changed)
        expect(f"Dockerfile {label}", p, needle)
    p = Problems()
    check_build_context(p, ignore_patterns=["engine", "build*"])
    expect(".dockerignore excluding sources", p, "excludes engine")
    expect(".dockerignore keeping .git", p, "does not exclude .git")
    for path, pats, want in [("build/bin", ["build*"], True), ("engine/x.cc", ["build*"], False),
                             ("a/b/__pycache__", ["**/__pycache__"], True),
                             ("models", ["models", "!models"], False)]:
        if dockerignore_excludes(pats, path) != want:
            failures.append(f"dockerignore_excludes({pats}, {path}) != {want}")
    return len(lint_cases) + len(rule_cases) + 6


def self_test_kustomize_warning(kubectl, failures):
    """A deprecated field (`bases`) is a problem, not a warning. Returns the number of cases."""
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "kustomization.yaml"), "w", encoding="utf-8") as f:
            f.write("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                    f"bases:\n  - {os.path.relpath(os.path.join(K8S, 'base'), tmp)}\n")
        got, err = render(kubectl, tmp)
        if got is not None or "kustomize warned" not in err or "bases" not in err:
            failures.append(f"a kustomization with `bases` was not refused: {err or 'no error'}")
    return 1


def self_test_prometheus_rule(failures):
    """The component's PrometheusRule is rules.yml, and --sync-prometheusrule writes that.
    Returns the number of cases."""
    import yaml
    if yaml.safe_load(prometheus_rule_text())["spec"]["groups"] != rules_yml_groups():
        failures.append("prometheus_rule_text() does not hold rules.yml's groups")
    return 1
