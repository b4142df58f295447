#!/usr/bin/env python3
"""Runs an exported Tandem image the way the Kubernetes manifests run it (scripts/container_check.sh).

Called inside a fresh network and mount namespace (unshare --net --mount), as root. From the
kustomize output it takes, per Deployment, the container's command and arguments, environment
(ConfigMap envFrom, values, the pod IP and name), volumes (emptyDir, Secret, a claim backed by
a host folder given with --claim), user and group, read-only root filesystem and startup probe;
every pod gets a loopback address of its own
(127.0.0.11, ...) so that the manifests' ports stay as written. Only addresses are rewritten:
0.0.0.0 becomes the pod's address and a Service name the address of the pod behind it.
Exits 1 naming the first check that fails.
"""
import argparse
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request

import yaml

CHROOT = "/usr/sbin/chroot"
EXPECTED_BINARIES = {"tandem", "tandem-server", "tandem-router", "tandem-prefill",
                     "tandem-decode", "tandem-health"}
# Strings that only test, benchmark or fault-injection code puts in a binary.
FORBIDDEN_STRINGS = [b"testing::internal", b"GTEST_", b"benchmark::State"]


def fail(msg):
    print(f"container_check: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def log(msg):
    print(f"container_check: {msg}", file=sys.stderr, flush=True)


def sh(*argv):
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


def mount_root(rootfs, root, models):
    """A container's root at `root`: a bind of the image with /proc and /dev, and the demo model
    mounted read-only where an image built with DEMO_MODEL=0 lacks it."""
    os.makedirs(root, exist_ok=True)
    sh("mount", "--bind", rootfs, root)
    sh("mount", "-t", "proc", "proc", os.path.join(root, "proc"))
    sh("mount", "--rbind", "/dev", os.path.join(root, "dev"))
    model_dir = os.path.join(root, "opt/tandem/models/stories260K")
    if not os.path.exists(os.path.join(model_dir, "stories260K.bin")):
        os.makedirs(model_dir, exist_ok=True)
        sh("mount", "--bind", "-o", "ro", os.path.join(models, "stories260K"), model_dir)


def tail_of(path):
    return open(path).read()[-4000:]


def post_json(url, body, timeout):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=timeout))


class Image:
    """The exported root filesystem and the image's configuration (podman image inspect)."""

    def __init__(self, rootfs, config_file):
        self.rootfs = rootfs
        cfg = json.load(open(config_file))[0]
        c = cfg.get("Config") or {}
        self.env = dict(e.split("=", 1) for e in c.get("Env") or [])
        self.workdir = c.get("WorkingDir") or "/"
        self.user = c.get("User") or "0:0"
        self.entrypoint = c.get("Entrypoint") or []
        self.cmd = c.get("Cmd") or []
        self.healthcheck = cfg.get("Healthcheck")

    def command(self, root, argv, env, user, groups, workdir=None):
        """argv run inside root (the image) as user:group, from workdir, with exactly env."""
        spec = ["--userspec=" + user]
        if groups:
            spec.append("--groups=" + ",".join(groups))
        wrapper = 'cd "$0" && exec "$@"'
        return ([CHROOT, *spec, root, "/bin/sh", "-c", wrapper, workdir or self.workdir,
                 *argv], env)

    def run(self, root, argv, user=None, timeout=60):
        full, env = self.command(root, argv, dict(self.env), user or self.user, [])
        return subprocess.run(full, env=env, capture_output=True, text=True, timeout=timeout)


def check_contents(image):
    """Only the programs, and no test, benchmark or fault-injection code in them."""
    bindir = os.path.join(image.rootfs, "opt/tandem/bin")
    names = set(os.listdir(bindir))
    if names - EXPECTED_BINARIES - {"libtandem_cuda.so"}:
        fail(f"/opt/tandem/bin holds more than the programs: {sorted(names - EXPECTED_BINARIES)}")
    if EXPECTED_BINARIES - names:
        fail(f"/opt/tandem/bin lacks {sorted(EXPECTED_BINARIES - names)}")
    for dirpath, _, files in os.walk(os.path.join(image.rootfs, "opt")):
        for f in files:
            if re.search(r"(_test|_bench|fuzz_|gtest|gmock|libbenchmark)", f):
                fail(f"test or benchmark file in the image: {os.path.join(dirpath, f)}")
    for f in sorted(names):
        data = open(os.path.join(bindir, f), "rb").read()
        for s in FORBIDDEN_STRINGS:
            if s in data:
                fail(f"/opt/tandem/bin/{f} contains {s.decode()!r} (test, benchmark or fault code)")
    r = image.run(image.rootfs, ["tandem-server", "--role=prefill", "--model", "/nonexistent",
                                 "--fault", "step_delay_ms=1"])
    if r.returncode == 0 or "no fault injection" not in r.stderr:
        fail(f"the image's tandem-server accepts --fault: {r.returncode} {r.stderr.strip()}")
    log(f"contents: {sorted(names)}; no test, benchmark or fault-injection code")


class Cluster:
    """The Deployments of the manifests, one pod each, on loopback addresses of their own."""

    def __init__(self, image, manifests_file, models, work, claims):
        self.image = image
        self.work = work
        self.models = models
        self.claims = claims  # PersistentVolumeClaim name -> the host folder that backs it
        self.name = os.path.splitext(os.path.basename(manifests_file))[0]
        docs = [d for d in yaml.safe_load_all(open(manifests_file)) if d]
        self.configmaps = {d["metadata"]["name"]: d.get("data", {})
                           for d in docs if d["kind"] == "ConfigMap"}
        self.services = [d for d in docs if d["kind"] == "Service"]
        self.deployments = [d for d in docs if d["kind"] == "Deployment"]
        self.cluster_secret = secrets.token_hex(32)
        self.pods = []  # dicts: name, ip, labels, container, spec
        for i, d in enumerate(self.deployments):
            replicas = d["spec"].get("replicas", 1)
            if replicas != 1:
                fail(f"{d['metadata']['name']}: the check runs overlays with 1 replica per role")
            tmpl = d["spec"]["template"]
            containers = tmpl["spec"]["containers"]
            if len(containers) != 1:
                fail(f"{d['metadata']['name']}: one container per pod expected")
            self.pods.append({"name": d["metadata"]["name"] + "-0", "ip": f"127.0.0.{11 + i}",
                              "labels": tmpl["metadata"]["labels"], "spec": tmpl["spec"],
                              "container": containers[0], "proc": None})

    def service_pod(self, svc):
        sel = svc["spec"].get("selector", {})
        for p in self.pods:
            if all(p["labels"].get(k) == v for k, v in sel.items()):
                return p
        fail(f"Service {svc['metadata']['name']} selects no pod")

    def service_port(self, name, port):
        """The container port behind Service `name`'s port."""
        for svc in self.services:
            if svc["metadata"]["name"] != name:
                continue
            pod = self.service_pod(svc)
            for sp in svc["spec"]["ports"]:
                if sp["port"] != port:
                    continue
                target = sp.get("targetPort", port)
                if isinstance(target, str):
                    named = {cp["name"]: cp["containerPort"]
                             for cp in pod["container"].get("ports", []) if "name" in cp}
                    if target not in named:
                        fail(f"Service {name}: targetPort {target} is no port of {pod['name']}")
                    target = named[target]
                return pod, target
            fail(f"Service {name} has no port {port}")
        fail(f"no Service {name}")

    def rewrite(self, text, pod):
        """Addresses only: 0.0.0.0 -> the pod's, SERVICE[.ns.svc...]:PORT -> the pod behind it."""
        text = text.replace("0.0.0.0", pod["ip"])
        for svc in self.services:
            name = re.escape(svc["metadata"]["name"])
            pattern = re.compile(r"\b" + name + r"(\.[a-z0-9-]+(\.svc(\.cluster\.local)?)?)?:(\d+)\b")

            def sub(m, svc_name=svc["metadata"]["name"]):
                target_pod, target_port = self.service_port(svc_name, int(m.group(4)))
                if target_port != int(m.group(4)):
                    fail(f"{svc_name}:{m.group(4)} maps to port {target_port}; the check keeps ports")
                return f"{target_pod['ip']}:{m.group(4)}"

            text = pattern.sub(sub, text)
        return text

    def env_of(self, pod):
        env = dict(self.image.env)
        c = pod["container"]
        for src in c.get("envFrom", []):
            ref = src.get("configMapRef", {}).get("name")
            if ref not in self.configmaps:
                fail(f"{pod['name']}: envFrom {src} is not a ConfigMap of the manifests")
            env.update(self.configmaps[ref])
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
                continue
            path = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            values = {"status.podIP": pod["ip"], "metadata.name": pod["name"],
                      "metadata.namespace": "tandem-check"}
            if path not in values:
                fail(f"{pod['name']}: env {e['name']} comes from {e.get('valueFrom')}, unsupported")
            env[e["name"]] = values[path]
        return {k: self.rewrite(str(v), pod) for k, v in env.items()}

    def mount_volumes(self):
        """Per pod: its volumes under a root of its own (a read-only bind of the image)."""
        for pod in self.pods:
            root = os.path.join(self.work, "pods", self.name, pod["name"])
            mount_root(self.image.rootfs, root, self.models)
            spec = pod["spec"]
            fs_group = spec.get("securityContext", {}).get("fsGroup")
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            for vm in pod["container"].get("volumeMounts", []):
                v = volumes.get(vm["name"])
                target = os.path.join(root, vm["mountPath"].lstrip("/"))
                os.makedirs(target, exist_ok=True)  # as the container runtime makes them
                if v is None:
                    fail(f"{pod['name']}: volumeMount {vm['name']} names no volume")
                if "emptyDir" in v:
                    sh("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", target)
                elif "secret" in v:
                    self.mount_secret(v["secret"], target, fs_group)
                elif "persistentVolumeClaim" in v:
                    claim = v["persistentVolumeClaim"]["claimName"]
                    if claim not in self.claims:
                        fail(f"{pod['name']}: no folder given for the claim {claim} (--claim)")
                    sh("mount", "--bind", "-o", "ro", self.claims[claim], target)
                else:
                    fail(f"{pod['name']}: volume {vm['name']} is of a kind the check lacks: {v}")
            if pod["container"].get("securityContext", {}).get("readOnlyRootFilesystem"):
                sh("mount", "-o", "remount,bind,ro", root)
            pod["root"] = root

    def mount_secret(self, secret, target, fs_group):
        if secret["secretName"] != "tandem-cluster-secret":
            fail(f"Secret {secret['secretName']} is not one docs/deploy.md tells users to create")
        # As `kubectl create secret generic tandem-cluster-secret --from-literal=cluster-secret=
        # "$(openssl rand -hex 32)"`, projected with the volume's defaultMode and the fsGroup.
        sh("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", target)
        path = os.path.join(target, "cluster-secret")
        with open(path, "w") as f:  # one Secret for the namespace: every pod reads the same
            f.write(self.cluster_secret)
        os.chown(path, 0, fs_group if fs_group is not None else 0)
        os.chmod(path, secret.get("defaultMode", 0o644))
        sh("mount", "-o", "remount,ro", target)

    def start(self):
        for pod in self.pods:
            c = pod["container"]
            sc = pod["spec"].get("securityContext", {})
            uid, gid = sc.get("runAsUser"), sc.get("runAsGroup")
            if uid is None or uid == 0 or not sc.get("runAsNonRoot"):
                fail(f"{pod['name']}: the manifests must run pods as a non-root user")
            groups = [str(sc["fsGroup"])] if "fsGroup" in sc else []
            argv = [self.rewrite(a, pod) for a in (c.get("command") or self.image.entrypoint)]
            argv += [self.rewrite(a, pod) for a in (c.get("args") or
                                                    ([] if c.get("command") else self.image.cmd))]
            env = self.env_of(pod)
            full, env = self.image.command(pod["root"], argv, env, f"{uid}:{gid}", groups,
                                           c.get("workingDir"))
            out = open(self.log_path(pod), "w")
            pod["proc"] = subprocess.Popen(full, env=env, stdout=out, stderr=subprocess.STDOUT)
            log(f"started {pod['name']} at {pod['ip']}: {' '.join(argv)}")

    def wait_ready(self, deadline_s=180):
        """Every pod's startup probe (a grpc health check, through the image's tandem-health)."""
        end = time.time() + deadline_s
        for pod in self.pods:
            probe = pod["container"].get("startupProbe", {}).get("grpc")
            if not probe:
                fail(f"{pod['name']}: no grpc startup probe")
            while True:
                if pod["proc"].poll() is not None:
                    self.dump(pod)
                    fail(f"{pod['name']} exited with {pod['proc'].returncode} before it was ready")
                r = self.exec_in(pod, ["tandem-health", "--address", f"{pod['ip']}:{probe['port']}"])
                if r.returncode == 0:
                    break
                if time.time() > end:
                    self.dump(pod)
                    fail(f"{pod['name']}: not SERVING after {deadline_s} s")
                time.sleep(1)
        log("every pod is SERVING")

    def exec_in(self, pod, argv, timeout=60):
        sc = pod["spec"].get("securityContext", {})
        full, env = self.image.command(pod["root"], argv, dict(self.image.env),
                                       f"{sc.get('runAsUser')}:{sc.get('runAsGroup')}", [])
        return subprocess.run(full, env=env, capture_output=True, text=True, timeout=timeout)

    def log_path(self, pod):
        return os.path.join(self.work, f"{self.name}-{pod['name']}.log")

    def dump(self, pod):
        log(f"--- {pod['name']} log ---")
        print(tail_of(self.log_path(pod)), file=sys.stderr)

    def requests(self, chat):
        """One request over gRPC (the image's tandem CLI) and one over HTTP, through tandem-api;
        with `chat`, also a question through the OpenAI chat API."""
        router, grpc_port = self.service_port("tandem-api", 7000)
        _, http_port = self.service_port("tandem-api", 8000)
        end = time.time() + 60
        while True:  # the workers register with the router a heartbeat after they serve
            r = self.exec_in(router, ["tandem", "generate", "--router", f"{router['ip']}:{grpc_port}",
                                      "--prompt", "Once upon a time", "--max-tokens", "16",
                                      "--temperature", "0"])
            if r.returncode == 0 and len(r.stdout.strip()) > len("Once upon a time"):
                break
            if time.time() > end:
                for p in self.pods:
                    self.dump(p)
                fail(f"gRPC generate through tandem-api: {r.returncode} {r.stderr.strip()}")
            time.sleep(1)
        log(f"gRPC: {r.stdout.strip()!r}")
        base = f"http://{router['ip']}:{http_port}"
        models = json.load(urllib.request.urlopen(base + "/v1/models", timeout=30))
        model = models["data"][0]["id"]
        resp = post_json(base + "/v1/completions", {"model": model, "prompt": "Once upon a time",
                                                    "max_tokens": 16, "temperature": 0}, 60)
        text = resp["choices"][0]["text"]
        if not text.strip() or resp["usage"]["completion_tokens"] <= 0:
            fail(f"HTTP completion through tandem-api is empty: {resp}")
        log(f"HTTP /v1/completions ({model}): {text!r}")
        if not chat:
            return
        question = {"role": "user", "content": "What is the capital of France?"}
        resp = post_json(base + "/v1/chat/completions", {"model": model, "max_tokens": 24,
                                                         "temperature": 0, "messages": [question]},
                         120)
        answer = resp["choices"][0]["message"]["content"]
        if not answer or not answer.strip():
            fail(f"HTTP chat completion through tandem-api is empty: {resp}")
        log(f"HTTP /v1/chat/completions ({model}): {answer!r}")

    def stop(self):
        """SIGTERM, as the kubelet sends it: every pod drains and exits 0 within its grace period."""
        for pod in reversed(self.pods):
            pod["proc"].send_signal(signal.SIGTERM)
        for pod in reversed(self.pods):
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
            try:
                rc = pod["proc"].wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pod["proc"].kill()
                fail(f"{pod['name']} did not stop within terminationGracePeriodSeconds={grace}")
            if rc != 0:
                self.dump(pod)
                fail(f"{pod['name']} exited with {rc} after SIGTERM")
        log("every pod stopped cleanly on SIGTERM")


def default_command(image, work, models):
    """The image's own command (the colocated demo) and its HEALTHCHECK."""
    hc = image.healthcheck
    if not hc or not hc.get("Test") or hc["Test"][0] not in ("CMD", "CMD-SHELL"):
        fail(f"the image has no HEALTHCHECK command (build with --format docker): {hc}")
    root = os.path.join(work, "pods", "default-command")
    mount_root(image.rootfs, root, models)
    full, env = image.command(root, image.entrypoint + image.cmd, dict(image.env), image.user, [])
    log_path = os.path.join(work, "default.log")
    out = open(log_path, "w")
    proc = subprocess.Popen(full, env=env, stdout=out, stderr=subprocess.STDOUT)
    test = hc["Test"][1:] if hc["Test"][0] == "CMD" else ["/bin/sh", "-c", hc["Test"][1]]
    # Docker's timing: checks every Interval after a StartPeriod during which failures do not count.
    ns = 1e-9
    interval = hc.get("Interval", 30e9) * ns
    start_period = hc.get("StartPeriod", 0) * ns
    retries = hc.get("Retries", 3)
    began, failures = time.time(), 0
    try:
        while True:
            if proc.poll() is not None:
                print(tail_of(log_path), file=sys.stderr)
                fail(f"the image's default command exited with {proc.returncode}")
            r = image.run(root, test, timeout=hc.get("Timeout", 30e9) * ns + 5)
            if r.returncode == 0:
                break
            if time.time() - began > start_period:
                failures += 1
                if failures >= retries:
                    fail(f"HEALTHCHECK {test} failed {retries} times: {r.stderr.strip()}")
            time.sleep(min(interval, 1.0) if time.time() - began <= start_period else interval)
        log(f"the default command ({' '.join(image.cmd)}) is healthy by its HEALTHCHECK "
            f"after {time.time() - began:.1f} s")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            proc.kill()
    if proc.returncode != 0:
        fail(f"the default command exited with {proc.returncode} after SIGTERM")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rootfs", required=True)
    ap.add_argument("--image-config", required=True)
    ap.add_argument("--manifests", action="append", default=[],
                    help="kustomize output of an overlay: a cluster run and asked for completions")
    ap.add_argument("--chat-manifests", action="append", default=[],
                    help="the same, also asked a question through the chat API")
    ap.add_argument("--claim", action="append", default=[],
                    help="NAME=DIR: the host folder behind the PersistentVolumeClaim NAME")
    ap.add_argument("--models", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    claims = dict(c.split("=", 1) for c in a.claim)
    sh("ip", "link", "set", "lo", "up")
    sh("mount", "--make-rprivate", "/")
    image = Image(os.path.abspath(a.rootfs), a.image_config)
    check_contents(image)
    runs = [(m, False) for m in a.manifests] + [(m, True) for m in a.chat_manifests]
    for manifests, chat in runs:  # one cluster at a time, on the same addresses
        log(f"cluster of {os.path.basename(manifests)}")
        cluster = Cluster(image, manifests, a.models, os.path.abspath(a.work), claims)
        cluster.mount_volumes()
        try:
            cluster.start()
            cluster.wait_ready()
            cluster.requests(chat)
            cluster.stop()
        finally:
            for pod in cluster.pods:
                if pod["proc"] and pod["proc"].poll() is None:
                    pod["proc"].kill()
    default_command(image, os.path.abspath(a.work), a.models)


if __name__ == "__main__":
    main()
