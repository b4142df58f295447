"""Builds: `kubectl kustomize` of the overlays and components, and the Helm chart (rendered by
deploy/helm_render.py, and by `helm template` where Helm is installed) against kustomize."""

import json
import os
import re
import shutil
import subprocess

from .apikeys import API_KEYS_SECRET, check_generated_secret, check_key_kept
from .cluster import check_consistency
from .common import COMPONENTS, HELM_CHART, K8S
from .schema import check_schema


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


# Labels and annotations only the chart has: Helm's bookkeeping, and the checksums that roll the
# pods when tandem-config changes (kustomize puts a content hash in the ConfigMap's name instead)
# and the routers when the keys file the chart makes does.
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
HELM_ONLY_POD_ANNOTATIONS = ("checksum/config", "checksum/api-keys")


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


class HelmCase:
    """Chart values against what kustomize builds: `files` (value files) and `overrides` against
    the kustomization `target` with the components `extra` added; `gpu`: the workers request
    GPUs; `generates_key`: the chart makes the Secret of API keys, which kustomize leaves to the
    user (the api-keys component: docs/deploy.md#api-keys)."""

    def __init__(self, name, files=(), overrides=None, target="base", extra=(), gpu=False,
                 generates_key=True):
        self.name, self.files, self.overrides = name, list(files), overrides
        self.target, self.extra, self.gpu = target, list(extra), gpu
        self.generates_key = generates_key
        # The components in effect: what the consistency checks require.
        self.require = tuple(extra)


EXAMPLES = os.path.join(HELM_CHART, "examples")
MONITORING_ON = {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
HELM_CASES = [
    HelmCase("defaults", extra=["api-keys"]),
    HelmCase("examples/cpu-demo.yaml", [os.path.join(EXAMPLES, "cpu-demo.yaml")],
             target="overlays/cpu-demo", extra=["api-keys"]),
    HelmCase("examples/gpu.yaml", [os.path.join(EXAMPLES, "gpu.yaml")], target="overlays/gpu",
             extra=["api-keys"], gpu=True),
    HelmCase("serviceMonitor, prometheusRule on", overrides=MONITORING_ON,
             extra=["api-keys", "prometheus-operator"]),
    HelmCase("apiKeys.existingSecret", overrides={"apiKeys": {"existingSecret": API_KEYS_SECRET}},
             extra=["api-keys"], generates_key=False),
    HelmCase("apiKeys off", overrides={"apiKeys": {"enabled": False}}, generates_key=False),
]
# Values with no kustomize counterpart, checked on their own (schema and consistency), each with
# what its rendering must show: (case, overrides, [(object name, path, what it must hold)]).
NETWORK_VALUES = {
    "api": {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]},
    "metrics": {"from": [{"namespaceSelector": {"matchLabels": {"team": "observability"}},
                          "podSelector": {"matchLabels": {"app": "prometheus"}}}]},
    "extraEgress": [{"to": [{"ipBlock": {"cidr": "169.254.20.10/32"}}],
                     "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}],
}
HELM_ONLY_CASES = [
    ("TLS", {"tls": {"enabled": True}}, []),
    ("networkPolicy values", {"networkPolicy": NETWORK_VALUES},
     [("tandem-router", ("spec", "ingress", 0, "from"), NETWORK_VALUES["api"]["from"]),
      ("tandem-workers", ("spec", "ingress", 1, "from"), NETWORK_VALUES["metrics"]["from"]),
      ("tandem-egress", ("spec", "egress", -1), NETWORK_VALUES["extraEgress"][0])]),
]


def split_generated(where, objs, generates_key, problems):
    """The objects less the Secret of API keys the chart makes, which is checked on its own: a
    keys file the router accepts, present exactly when `generates_key`."""
    made = [o for o in objs if o.get("kind") == "Secret" and
            o["metadata"].get("name") == API_KEYS_SECRET]
    if generates_key and len(made) != 1:
        problems.add(where, f"expected the chart to make the Secret {API_KEYS_SECRET}, "
                            f"found {len(made)}")
    if not generates_key and made:
        problems.add(where, f"the chart makes the Secret {API_KEYS_SECRET}, which the values "
                            f"leave to the user")
    for s in made:
        check_generated_secret(where, s, "keys.txt", problems)
    return [o for o in objs if not any(o is s for s in made)]


def check_helm_only(where, objs, expected, problems):
    """The NetworkPolicies of a HELM_ONLY_CASES rendering hold what its values asked for."""
    policies = {o["metadata"]["name"]: o for o in objs if o["kind"] == "NetworkPolicy"}
    for name, path, want in expected:
        got = policies.get(name)
        try:
            for step in path:
                got = got[step]
        except (KeyError, IndexError, TypeError):
            got = None
        if got != want:
            problems.add(where, f"NetworkPolicy/{name} {'.'.join(map(str, path))}: {got!r:.100}, "
                                f"the values ask for {want!r:.100}")


def check_helm(kubectl, problems):
    """Renders deploy/helm/tandem for each case of HELM_CASES and checks that it builds what
    kustomize builds; every rendered object also passes the schema and consistency checks, and
    the Secret of API keys the chart makes is checked on its own (check_key_kept: `helm upgrade`
    keeps the key)."""
    renderers = helm_renderers()
    import helm_render
    rendered = 0
    for case in HELM_CASES:
        kustomized, err = render_with(kubectl, os.path.join(K8S, case.target),
                                      [os.path.join(COMPONENTS, c) for c in case.extra])
        if kustomized is None:
            problems.add(f"helm {case.name}", f"kubectl kustomize {case.target} + {case.extra}: "
                                              f"{err}")
            continue
        for name, fn in renderers:
            where = f"{name} ({case.name})"
            try:
                objs = fn(case.files, case.overrides)
            except helm_render.RenderError as e:
                problems.add(where, str(e))
                continue
            rendered += len(objs)
            for o in objs:
                check_schema(o, f"{where}: {o.get('kind')}/{o['metadata'].get('name')}",
                             problems)
            check_consistency(f"helm {case.name}", objs, problems, gpu=case.gpu,
                              require=case.require)
            compare_objects(f"{where} vs kustomize {case.target}" +
                            (f" + {', '.join(case.extra)}" if case.extra else ""), kustomized,
                            split_generated(where, objs, case.generates_key, problems), problems)
    for case, overrides, expected in HELM_ONLY_CASES:
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
            check_consistency(f"helm {case}", objs, problems, require=("api-keys",))
            split_generated(where, objs, True, problems)
            check_helm_only(where, objs, expected, problems)
    check_key_kept(lambda over, cluster: helm_render.chart_objects(HELM_CHART, [], over, cluster),
                   problems)
    return [n for n, _ in renderers], rendered
