"""Paths of deploy/, the list of problems the checks report, and label selectors."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
K8S = os.path.join(DEPLOY, "k8s")
COMPONENTS = os.path.join(K8S, "components")
HELM_CHART = os.path.join(DEPLOY, "helm", "tandem")
RULES = os.path.join(DEPLOY, "prometheus", "rules.yml")
PROMETHEUS_RULE = os.path.join(COMPONENTS, "prometheus-operator", "prometheusrule.yaml")

# Tandem's ports.
GRPC_PORT = 7000          # the router's public gRPC API; a worker's internal port
HTTP_PORT = 8000          # the router's OpenAI-compatible HTTP API
ROUTER_INTERNAL_PORT = 7001
KV_PORT = 7100
METRICS_PORT = 9400


class Problems:
    def __init__(self):
        self.items = []

    def add(self, where, msg):
        self.items.append(f"{where}: {msg}")


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
