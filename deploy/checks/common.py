"""Paths of deploy/ and the list of problems the checks report."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
K8S = os.path.join(DEPLOY, "k8s")
COMPONENTS = os.path.join(K8S, "components")
HELM_CHART = os.path.join(DEPLOY, "helm", "tandem")
RULES = os.path.join(DEPLOY, "prometheus", "rules.yml")
PROMETHEUS_RULE = os.path.join(COMPONENTS, "prometheus-operator", "prometheusrule.yaml")


class Problems:
    def __init__(self):
        self.items = []

    def add(self, where, msg):
        self.items.append(f"{where}: {msg}")
