"""--self-test: each check rejects a manifest, chart or Dockerfile broken in the way it looks
for, and deploy/helm_render.py follows Go's template rules."""

import copy
import os
import re
import tempfile

from .apikeys import API_KEYS_SECRET, check_generated_secret, check_key_kept
from .cluster import (PUBLIC_SERVICE, ROUTER_SERVICE, check_consistency, default_drain_seconds,
                      prometheus_rule_text, rules_yml_groups)
from .common import COMPONENTS, DEPLOY, HELM_CHART, K8S, Problems
from .dockerfile import check_dockerfile, dockerignore_excludes
from .rendering import compare_objects, render, render_with, split_generated
from .schema import check_schema


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
    n += self_test_renderer(failures)
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


def deployment(objs, name):
    return next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == name)


def first(o, kind):
    return next(x for x in o if x["kind"] == kind)


def router_pod(o):
    return deployment(o, "tandem-router")["spec"]["template"]["spec"]


def container(o, name):
    return deployment(o, name)["spec"]["template"]["spec"]["containers"][0]


def hpa(o, name):
    return next(x for x in o if x["kind"] == "HorizontalPodAutoscaler" and
                x["metadata"]["name"] == name)


def self_test_schema(objs, expect):
    """The schema check rejects unknown fields, wrong types and missing required fields, in the
    Kubernetes objects and in the Prometheus Operator's. Returns the number of cases."""
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
    return len(schema_cases) + 3


def self_test_consistency(objs, on, expect):
    """The cluster rules reject each mutation of consistency_cases() and component_cases() of the
    gpu overlay with the components `on`. Returns the number of cases."""
    def mutated(fn):
        o = copy.deepcopy(objs)
        fn(o)
        p = Problems()
        check_consistency("gpu", o, p, require=on)
        return p

    cases = consistency_cases() + component_cases()
    for label, fn, needle in cases:
        expect(label, mutated(fn), needle)
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
        o = copy.deepcopy(scaled)
        fn(o)
        p = Problems()
        check_consistency("autoscaling", o, p)
        expect(label, p, needle)
    return len(autoscaling_cases)


def self_test_dockerfile(expect, failures):
    """The Dockerfile and .dockerignore checks reject each mutation. Returns the number of
    cases."""
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
        ("recommends", lambda t: t.replace("--no-install-recommends", ""),
         "--no-install-recommends"),
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
    return len(docker_cases) + 6


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


def self_test_tls(expect, failures):
    """TLS from the chart: probes that cannot speak TLS, files outside a mounted Secret. Returns
    the number of cases."""
    import helm_render
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

    tls_cases = [
        ("TLS with a grpc probe", lambda o: container(o, "tandem-prefill").update(
            readinessProbe={"grpc": {"port": 7000}}), "under TLS the probe must run tandem-health"),
        ("TLS probe without the key", lambda o: container(o, "tandem-decode")["livenessProbe"]
         ["exec"].update(command=container(o, "tandem-decode")["livenessProbe"]["exec"]
                         ["command"][:-2]), "differ from the server's"),
        ("TLS files not mounted", lambda o: container(o, "tandem-router").update(
            volumeMounts=[m for m in container(o, "tandem-router")["volumeMounts"]
                          if m["name"] != "tls"]), "is not in a mounted Secret"),
    ]
    for label, fn, needle in tls_cases:
        tls_case(label, fn, needle)
    return len(tls_cases)


def self_test_chart(kubectl, expect, failures):
    """The chart against kustomize: a changed value, a changed template output, an extra
    object. Returns the number of cases."""
    import helm_render
    base, err = render_with(kubectl, os.path.join(K8S, "base"),
                            [os.path.join(COMPONENTS, "api-keys")])
    p = Problems()

    def chart(overrides=None):
        return split_generated("self-test", helm_render.chart_objects(HELM_CHART, [], overrides),
                               True, p)
    compare_objects("self-test", base, chart(), p)
    if p.items:
        failures.append(f"the chart's defaults differ from the base with api-keys: {p.items}")
    helm_cases = [
        ("chart replicas", chart({"decode": {"replicas": 3}}),
         "Deployment/tandem-decode.spec.replicas"),
        ("chart flags", chart({"flags": {"decode": "-x"}}), "TANDEM_DECODE_FLAGS"),
        ("chart ServiceMonitor", chart({"serviceMonitor": {"enabled": True}}),
         "ServiceMonitor/tandem is rendered by the chart but not by kustomize"),
        ("chart without the dashboard", chart({"grafanaDashboard": {"enabled": False}}),
         "ConfigMap/tandem-grafana-dashboard is built by kustomize but not by the chart"),
        ("chart metrics from elsewhere",
         chart({"networkPolicy": {"metrics": {"from": [{"namespaceSelector": {}}]}}}),
         "NetworkPolicy/tandem-router.spec.ingress[2].from[0].namespaceSelector"),
    ]
    for label, objs_, needle in helm_cases:
        p = Problems()
        compare_objects("self-test", base, objs_, p)
        expect(label, p, needle)
    return len(helm_cases) + 1 + self_test_api_keys(expect, failures)


def self_test_api_keys(expect, failures):
    """The Secret of API keys the chart makes: a keys file the router would refuse, a key that
    is not the one under `api-key`, a short key, an upgrade that draws a new key. Returns the
    number of cases."""
    import base64
    import helm_render
    secret = next(o for o in helm_render.chart_objects(HELM_CHART)
                  if o["kind"] == "Secret" and o["metadata"]["name"] == API_KEYS_SECRET)
    key = base64.b64decode(secret["data"]["api-key"]).decode()
    enc = lambda t: base64.b64encode(t.encode()).decode()  # noqa: E731
    cases = [
        ("keys file with an unknown limit", {"keys.txt": enc(f"{key} max_tokens=5\n")},
         "unknown limit 'max_tokens'"),
        ("keys file with a zero limit", {"keys.txt": enc(f"{key} max_n=0\n")},
         "max_n: the value must be a positive number"),
        ("keys file of another key", {"keys.txt": enc("x" * 48 + "\n")},
         "exactly the key under `api-key`"),
        ("keys file with no key", {"keys.txt": enc("# none\n")}, "holds no key"),
        ("short key", {"keys.txt": enc("k" * 20 + "\n"), "api-key": enc("k" * 20)},
         "the generated key has 20 characters"),
        ("key too short for the router", {"keys.txt": enc("k" * 15 + "\n"),
                                          "api-key": enc("k" * 15)}, "at least 16 characters"),
    ]
    for label, data, needle in cases:
        s = copy.deepcopy(secret)
        s["data"].update(data)
        p = Problems()
        check_generated_secret("self-test", s, "keys.txt", p)
        expect(label, p, needle)
    p = Problems()
    check_key_kept(lambda over, cluster: helm_render.chart_objects(HELM_CHART, [], over), p)
    expect("upgrade without lookup", p, "replaced the installed key")
    p = Problems()
    check_key_kept(lambda over, cluster: [secret], p)
    expect("the same key twice", p, "not random")
    return len(cases) + 2


def template_chart(tmp, values_text, src):
    """A chart in the folder `tmp` with values.yaml `values_text` and one template, t.txt."""
    os.mkdir(os.path.join(tmp, "templates"))
    with open(os.path.join(tmp, "Chart.yaml"), "w", encoding="utf-8") as f:
        f.write("name: t\nversion: 0.1.0\n")
    with open(os.path.join(tmp, "values.yaml"), "w", encoding="utf-8") as f:
        f.write(values_text)
    with open(os.path.join(tmp, "templates", "t.txt"), "w", encoding="utf-8") as f:
        f.write(src)


def self_test_renderer(failures):
    """deploy/helm_render.py against Go's text/template rules, and its refusal of what it does
    not understand. Returns the number of cases."""
    import yaml
    import helm_render
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
        ('{{ b64enc "key" }} {{ b64dec "a2V5" }} {{ "a2V5" | b64dec | b64enc }}', {},
         "a2V5 key a2V5"),
        ('{{ dig "a" "b" "d" .Values.m }} {{ dig "a" "x" "d" .Values.m }} '
         '{{ dig "z" "b" "d" .Values.m }}', {"m": {"a": {"b": "v"}}}, "v d d"),
        ('[{{ printf "%s %s" "k" "" | trim }}] [{{ trim " a b\\n" }}]', {}, "[k] [a b]"),
        ('{{ lookup "v1" "Secret" "ns" "s" | len }} {{ dig "data" "k" "none" (lookup "v1" '
         '"Secret" "ns" "s") }}', {}, "0 none"),
    ]
    for src, values, want in go_cases:
        with tempfile.TemporaryDirectory() as tmp:
            template_chart(tmp, yaml.safe_dump(values), src)
            try:
                got = helm_render.render_chart(tmp)["t.txt"]
            except helm_render.RenderError as e:
                got = f"RenderError: {e}"
        if got != want:
            failures.append(f"helm_render: {src!r} gave {got!r}, Go gives {want!r}")
    for src in ('{{ lookup "v1" }}', "{{ if .Values.x }}", "{{ .Values.a | frobnicate }}",
                '{{ genCA "tandem" 365 }}', '{{ dig "a" "d" "not a map" }}'):
        with tempfile.TemporaryDirectory() as tmp:
            template_chart(tmp, "{}\n", src)
            try:
                helm_render.render_chart(tmp)
                failures.append(f"helm_render accepted {src!r}, which it does not understand")
            except helm_render.RenderError:
                pass
    return len(go_cases) + 5 + self_test_random_and_lookup(failures)


def self_test_random_and_lookup(failures):
    """randAlphaNum draws letters and digits anew each call; lookup finds what the cluster it is
    handed holds, in the namespace asked for, and nothing else. Returns the number of cases."""
    import helm_render
    keys = {helm_render.FUNCTIONS["randAlphaNum"](48) for _ in range(4)}
    if len(keys) != 4 or not all(len(k) == 48 and k.isalnum() and k.isascii() for k in keys):
        failures.append(f"helm_render randAlphaNum 48 gave {sorted(keys)}")
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "ns"},
              "data": {"k": "dg=="}}
    r = helm_render.Renderer(HELM_CHART, {}, cluster=[secret])
    got = (r.lookup("v1", "Secret", "ns", "s"), r.lookup("v1", "Secret", "other", "s"),
           r.lookup("v1", "ConfigMap", "ns", "s"), len(r.lookup("v1", "Secret", "", "")["items"]))
    if got != (secret, {}, {}, 1):
        failures.append(f"helm_render lookup against a cluster gave {got}")
    return 2
