"""NetworkPolicies of one build: who may connect to each role's ports, and where its pods may
connect to."""

from .common import (GRPC_PORT, HTTP_PORT, KV_PORT, METRICS_PORT, ROUTER_INTERNAL_PORT,
                     matches)

DNS_PORT = 53
# The ports each Deployment's pods serve to the cluster's own pods only.
INTERNAL = {"tandem-router": [ROUTER_INTERNAL_PORT],
            "tandem-prefill": [GRPC_PORT],
            "tandem-decode": [GRPC_PORT, KV_PORT]}
# The ports of the cluster's own pods each Deployment's pods call: routers call the workers;
# workers register with the routers; prefill workers send KV to decode workers (and bootstrap
# NCCL on their gRPC port).
CALLS = {"tandem-router": [GRPC_PORT],
         "tandem-prefill": [ROUTER_INTERNAL_PORT, GRPC_PORT, KV_PORT],
         "tandem-decode": [ROUTER_INTERNAL_PORT]}


def policy_types(policy):
    """The directions a NetworkPolicy limits (Kubernetes' default when policyTypes is unset)."""
    spec = policy["spec"]
    return spec.get("policyTypes") or (["Ingress"] + (["Egress"] if spec.get("egress") else []))


def admits(rule, port, protocol="TCP"):
    """Whether an ingress or egress rule covers `port` over `protocol` (no ports: every port)."""
    ports = rule.get("ports")
    return not ports or any(p.get("port") in (None, port) and p.get("protocol", "TCP") == protocol
                            for p in ports)


def own_pods(peer):
    """A peer that is the cluster's own pods: a part-of: tandem podSelector, in the namespace."""
    return ("podSelector" in peer and "namespaceSelector" not in peer and "ipBlock" not in peer
            and peer["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/part-of")
            == "tandem")


def some_namespaces(peer):
    """A peer limited to the namespaces a non-empty namespaceSelector picks."""
    sel = peer.get("namespaceSelector")
    return bool(sel) and bool(sel.get("matchLabels") or sel.get("matchExpressions"))


def open_peer(peer):
    """A peer that is everyone: every namespace's pods, or every address."""
    if "ipBlock" in peer:
        return peer["ipBlock"].get("cidr") in ("0.0.0.0/0", "::/0")
    sel = peer.get("namespaceSelector")
    return sel is not None and not some_namespaces(peer) and not (peer.get("podSelector") or {})


def check_network_policies(where, policies, pod_labels, problems):
    """Per role: the internal ports admit the cluster's own pods only, /metrics the monitoring
    namespaces only, the router's public ports whoever the policy names; egress reaches DNS and
    the ports of the cluster's own pods the role calls, and no rule reaches everyone."""
    for deployment in INTERNAL:
        labels = pod_labels.get(deployment)
        if labels is None:
            continue
        selecting = [p for p in policies if matches(p["spec"].get("podSelector", {}), labels)]
        check_ingress(f"{where}: {deployment}", deployment,
                      [p for p in selecting if "Ingress" in policy_types(p)], problems)
        check_egress(f"{where}: {deployment}", deployment,
                     [p for p in selecting if "Egress" in policy_types(p)], problems)


def check_ingress(w, deployment, selecting, problems):
    if not selecting:
        problems.add(w, "no NetworkPolicy limits the ingress of its pods")
        return
    rules = [r for p in selecting for r in p["spec"].get("ingress") or []]
    for port in INTERNAL[deployment]:
        admitting = [r for r in rules if admits(r, port)]
        if not admitting:
            problems.add(w, f"no NetworkPolicy rule admits port {port}")
        for r in admitting:
            peers = r.get("from")
            if not (peers and all(own_pods(peer) for peer in peers)):
                problems.add(w, f"port {port} is open beyond the cluster's own pods (a "
                                f"NetworkPolicy rule without a part-of: tandem podSelector)")
    admitting = [r for r in rules if admits(r, METRICS_PORT)]
    if not admitting:
        problems.add(w, f"no NetworkPolicy rule admits port {METRICS_PORT} (/metrics): "
                        f"Prometheus cannot scrape it")
    for r in admitting:
        peers = r.get("from")
        if not (peers and all(own_pods(peer) or some_namespaces(peer) for peer in peers)):
            problems.add(w, f"port {METRICS_PORT} (/metrics) is open beyond the monitoring "
                            f"namespaces (a NetworkPolicy rule whose peers are not all a "
                            f"non-empty namespaceSelector)")
    if deployment == "tandem-router":
        for port in (GRPC_PORT, HTTP_PORT):
            if not any(admits(r, port) for r in rules):
                problems.add(w, f"no NetworkPolicy rule admits the public port {port}")


def check_egress(w, deployment, selecting, problems):
    if not selecting:
        problems.add(w, "no NetworkPolicy limits the egress of its pods: they may connect "
                        "anywhere")
        return
    rules = [r for p in selecting for r in p["spec"].get("egress") or []]
    for r in rules:
        peers = r.get("to")
        if not peers:
            problems.add(w, f"an egress rule without `to` lets its pods connect to any address "
                            f"(ports {[p.get('port') for p in r.get('ports') or []] or 'all'})")
        elif any(open_peer(peer) for peer in peers):
            problems.add(w, "an egress rule reaches every namespace or every address")
    for protocol in ("UDP", "TCP"):
        if not any(r.get("to") and admits(r, DNS_PORT, protocol) for r in rules):
            problems.add(w, f"no egress to DNS ({DNS_PORT}/{protocol}): its pods cannot resolve "
                            f"tandem-router")
    for port in CALLS[deployment]:
        if not any(admits(r, port) and any(own_pods(peer) for peer in r.get("to") or [])
                   for r in rules):
            problems.add(w, f"no egress to port {port} of the cluster's own pods, which its pods "
                            f"call")
