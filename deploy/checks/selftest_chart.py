"""--self-test of the Helm chart's checks (checks/chart.py, checks/apikeys.py): each rejects a
chart rendering broken in the way it looks for."""

import base64
import copy
import os
import shutil
import tempfile

from .apikeys import API_KEYS_SECRET, check_generated_secret, check_key_kept
from .chart import chart_objects, compare_objects, lint, split_generated
from .cluster import check_consistency
from .common import COMPONENTS, HELM_CHART, K8S, Problems
from .rendering import render_with


def deployment(objs, name):
    return next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == name)


def container(o, name):
    return deployment(o, name)["spec"]["template"]["spec"]["containers"][0]


def mutated(name, objs, fn, **kwargs):
    """The problems check_consistency finds in a copy of `objs` that `fn` changed."""
    o = copy.deepcopy(objs)
    fn(o)
    p = Problems()
    check_consistency(name, o, p, **kwargs)
    return p


def self_test_tls(expect, failures):
    """TLS from the chart: probes that cannot speak TLS, files outside a mounted Secret. Returns
    the number of cases."""
    tls = chart_objects((), {"tls": {"enabled": True}})
    clean = Problems()
    check_consistency("helm tls", tls, clean)
    if clean.items:
        failures.append(f"the chart with TLS has problems: {clean.items}")

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
        expect(label, mutated("helm tls", tls, fn), needle)
    return len(tls_cases)


def self_test_chart(kubectl, expect, failures):
    """The chart against kustomize: a changed value, a changed template output, an extra
    object; helm lint on a broken template. Returns the number of cases."""
    base, err = render_with(kubectl, os.path.join(K8S, "base"),
                            [os.path.join(COMPONENTS, "api-keys")])
    if base is None:
        failures.append(f"kubectl kustomize base + api-keys: {err}")
        return 0
    p = Problems()

    def chart(overrides=None):
        return split_generated("self-test", chart_objects((), overrides), True, p)
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
    return len(helm_cases) + 1 + self_test_lint(expect) + self_test_api_keys(expect)


def self_test_lint(expect):
    """helm lint reports a template that renders no valid YAML. Returns the number of cases."""
    with tempfile.TemporaryDirectory() as tmp:
        chart_dir = os.path.join(tmp, "tandem")
        shutil.copytree(HELM_CHART, chart_dir)
        with open(os.path.join(chart_dir, "templates", "pdb.yaml"), "a", encoding="utf-8") as f:
            f.write("\n---\nkind: [\n")
        p = Problems()
        lint([], p, chart_dir)
        expect("helm lint of a broken template", p, "templates/pdb.yaml")
    return 1


def self_test_api_keys(expect):
    """The Secret of API keys the chart makes: a keys file the router would refuse, a key that
    is not the one under `api-key`, a short key, an upgrade that draws a new key. Returns the
    number of cases."""
    secret = next(o for o in chart_objects()
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
    check_key_kept(lambda over, installed: chart_objects((), over), p)
    expect("upgrade without lookup", p, "replaced the installed key")
    p = Problems()
    check_key_kept(lambda over, installed: [secret], p)
    expect("the same key twice", p, "not random")
    return len(cases) + 2
