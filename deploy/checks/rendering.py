"""Builds: `kubectl kustomize` of the base, the overlays and the components."""

import json
import os
import re
import subprocess

from .common import COMPONENTS


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

