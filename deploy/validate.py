#!/usr/bin/python3
"""Offline checks of deploy/ (the deploy_validate test; no cluster, no Docker daemon needed).

1. `kubectl kustomize` builds the base, every overlay under deploy/k8s/overlays, and every
   overlay with each component of deploy/k8s/components it does not use yet. Anything kustomize
   prints on stderr fails the check: a deprecated field (`bases`, `patchesStrategicMerge`, ...)
   must be fixed, not tolerated. Needs kustomize v4+ (kubectl 1.21+); older: skipped (77).
2. Every object is checked against the Kubernetes API schema: the model classes of the
   python3-kubernetes client (Debian package), walked strictly: an unknown field, a wrong type or
   a missing required field is an error. API fields newer than the installed client are added
   in NEWER_FIELDS of checks/schema.py (each with the Kubernetes version that introduced it); the
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
   groups (the prometheus-operator component); NetworkPolicies admit the internal ports from
   the cluster's own pods only and /metrics from selected namespaces only, and limit every
   pod's egress to DNS and the ports of the cluster's own pods it calls (checks/network.py).
4. The Helm chart deploy/helm/tandem, rendered by deploy/helm_render.py (and by `helm template`
   where Helm is installed), builds the same objects as kustomize (HELM_CASES) but for the
   Secret of API keys it makes, which must hold a keys file the router accepts with a random
   key that `helm upgrade` keeps (checks/apikeys.py), and passes 2 and 3.
5. yamllint (deploy/yamllint.yaml) over every YAML file under deploy/.
6. deploy/docker/Dockerfile and .dockerignore: Debian has no Dockerfile linter (hadolint is not
   packaged), so check_dockerfile() in checks/dockerfile.py checks what a linter would and what
   this project needs (see its docstring).

The checks are in deploy/checks/: schema.py (2), cluster.py and network.py (3), rendering.py and
apikeys.py (1 and 4), dockerfile.py (6) and selftest.py (--self-test).

--self-test: each check rejects what it looks for. --sync-prometheusrule: rewrites the
prometheus-operator component's PrometheusRule from deploy/prometheus/rules.yml.

Exit status: 0 all good, 1 problems (each printed), 77 a tool is missing (skipped).
"""

import os
import shutil
import subprocess
import sys

from checks.cluster import check_consistency, prometheus_rule_text
from checks.common import DEPLOY, K8S, PROMETHEUS_RULE, ROOT, RULES, Problems
from checks.dockerfile import check_dockerfile
from checks.rendering import (MIN_KUSTOMIZE, check_helm, components, kustomize_version, render,
                              render_with, used_components)
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
    overlays, counts = check_overlays(kubectl, problems)
    combos = check_component_builds(kubectl, overlays, problems)
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
