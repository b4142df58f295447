"""The Helm chart deploy/helm/tandem, rendered and linted by Helm itself (its Go SDK, through the
PyPI package helm-python-sdk), checked against what kustomize builds."""

import copy
import os
import re
import shutil
import tempfile

from .apikeys import API_KEYS_SECRET, check_generated_secret, check_key_kept
from .cluster import check_consistency
from .common import COMPONENTS, HELM_CHART, K8S
from .rendering import render_with
from .schema import check_schema

RELEASE = "tandem"
NAMESPACE = "default"
EXAMPLES = os.path.join(HELM_CHART, "examples")
# How templates/api-keys-secret.yaml reads the installed Secret back. `helm template` and the
# SDK's offline rendering see no cluster (lookup returns an empty map), so the upgrade case
# renders a copy of the chart whose lookup returns the installed Secret instead.
LOOKUP = re.compile(r'lookup\s+"v1"\s+"Secret"\s+\.Release\.Namespace\s+"'
                    + API_KEYS_SECRET + '"')
API_KEYS_TEMPLATE = os.path.join("templates", "api-keys-secret.yaml")


class RenderError(Exception):
    pass


def helm():
    import helm_python
    return helm_python


def chart_copy(tmp, chart_dir=HELM_CHART):
    """A copy of the chart in the folder `tmp`, files/'s symlinks replaced by the files they
    point at (as `helm package` stores them; loading the symlinks, Helm logs a line for each).
    Returns its path."""
    copy_dir = os.path.join(tmp, os.path.basename(chart_dir))
    shutil.copytree(chart_dir, copy_dir)
    return copy_dir


def merged(base, over):
    """`over` merged into `base` as Helm merges value files: maps key by key, the rest replaced."""
    out = dict(base)
    for k, v in (over or {}).items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def user_values(files, overrides):
    """The values of `helm template -f FILE... -f OVERRIDES`."""
    import yaml
    values = {}
    for path in files:
        with open(path, encoding="utf-8") as f:
            values = merged(values, yaml.safe_load(f) or {})
    return merged(values, overrides or {})


def render_dir(chart_dir, values):
    """[objects] of `helm template tandem CHART_DIR` with the user values `values` (CHART_DIR:
    a chart_copy())."""
    import yaml
    h = helm()
    try:
        with h.Chart.load(chart_dir) as chart:
            manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    except h.HelmError as e:
        raise RenderError(f"helm template: {e}") from e
    objs = []
    for path in sorted(manifests):
        if path.endswith("NOTES.txt"):
            continue
        objs += [o for o in yaml.safe_load_all(manifests[path]) if o is not None]
    return objs


def chart_objects(files=(), overrides=None, installed=None):
    """The chart's objects for the value files `files` and then `overrides`; `installed`: the
    Secret tandem-api-keys already in the release's namespace, which lookup finds (as under
    `helm upgrade`)."""
    values = user_values(files, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        chart_dir = chart_copy(tmp)
        if installed is None:
            return render_dir(chart_dir, values)
        path = os.path.join(chart_dir, API_KEYS_TEMPLATE)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        data = " ".join(f'"{k}" "{v}"' for k, v in (installed.get("data") or {}).items())
        text, n = LOOKUP.subn(f'(dict "data" (dict {data}))', text)
        if n != 1:
            raise RenderError(f"{os.path.relpath(HELM_CHART)}/{API_KEYS_TEMPLATE}: expected one "
                              f'`lookup "v1" "Secret" .Release.Namespace "{API_KEYS_SECRET}"`, '
                              f"found {n}")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return render_dir(chart_dir, values)


def lint(files, problems, chart_dir=HELM_CHART):
    """`helm lint --strict` with the value files `files`: a warning or error is a problem."""
    h = helm()
    where = "helm lint " + (" ".join(os.path.relpath(f, HELM_CHART) for f in files)
                            or "(defaults)")
    with tempfile.TemporaryDirectory() as tmp:
        report = h.lint(chart_copy(tmp, chart_dir), user_values(files, None), strict=True,
                        namespace=NAMESPACE)
    for m in report.get("messages", []):
        if m.get("severity", 0) >= 2:
            problems.add(where, f"{m.get('path')}: {m.get('error')}")
    for e in report.get("errors") or []:
        if not any(e == m.get("error") for m in report.get("messages", [])):
            problems.add(where, e)


# Labels and annotations only the chart has: Helm's bookkeeping, and the checksums that roll the
# pods when tandem-config changes (kustomize puts a content hash in the ConfigMap's name instead)
# and the routers when the keys file the chart makes does.
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
HELM_ONLY_POD_ANNOTATIONS = ("checksum/config", "checksum/api-keys")


def canonical(objs):
    """{(kind, name): object} with what legitimately differs between the chart and
    `kubectl kustomize` taken out: Namespace objects and metadata.namespace (Helm installs into
    the release's namespace), HELM_ONLY_LABELS, HELM_ONLY_POD_ANNOTATIONS, the hash suffix of
    tandem-config's name, and the order of lists of named items (env, volumes, volumeMounts,
    ports: kustomize's patches put their items first, the chart last)."""
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


def rendered(where, files, overrides, problems):
    """The chart's objects, each checked against the API schema, or None (a problem)."""
    try:
        objs = chart_objects(files, overrides)
    except RenderError as e:
        problems.add(where, str(e))
        return None
    for o in objs:
        check_schema(o, f"{where}: {o.get('kind')}/{o['metadata'].get('name')}", problems)
    return objs


def check_helm(kubectl, problems):
    """`helm lint --strict` with the defaults and each example; then the chart rendered for each
    case of HELM_CASES must build what kustomize builds, and for HELM_ONLY_CASES what the values
    ask for; every rendered object passes the schema and consistency checks, and the Secret of
    API keys the chart makes is checked on its own (check_key_kept: `helm upgrade` keeps the
    key). Returns the number of objects rendered."""
    for files in [[]] + [[os.path.join(EXAMPLES, f)] for f in sorted(os.listdir(EXAMPLES))]:
        lint(files, problems)
    count = 0
    for case in HELM_CASES:
        kustomized, err = render_with(kubectl, os.path.join(K8S, case.target),
                                      [os.path.join(COMPONENTS, c) for c in case.extra])
        if kustomized is None:
            problems.add(f"helm {case.name}", f"kubectl kustomize {case.target} + {case.extra}: "
                                              f"{err}")
            continue
        where = f"helm template ({case.name})"
        objs = rendered(where, case.files, case.overrides, problems)
        if objs is None:
            continue
        count += len(objs)
        check_consistency(f"helm {case.name}", objs, problems, gpu=case.gpu, require=case.extra)
        compare_objects(f"{where} vs kustomize {case.target}" +
                        (f" + {', '.join(case.extra)}" if case.extra else ""), kustomized,
                        split_generated(where, objs, case.generates_key, problems), problems)
    for case, overrides, expected in HELM_ONLY_CASES:
        where = f"helm template ({case})"
        objs = rendered(where, [], overrides, problems)
        if objs is None:
            continue
        count += len(objs)
        check_consistency(f"helm {case}", objs, problems, require=("api-keys",))
        split_generated(where, objs, True, problems)
        check_helm_only(where, objs, expected, problems)
    try:
        check_key_kept(lambda over, installed: chart_objects((), over, installed), problems)
    except RenderError as e:
        problems.add("helm (apiKeys: upgrade)", str(e))
    return count


def sdk_version():
    return helm().helm_sdk_version()

