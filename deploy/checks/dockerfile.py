"""deploy/docker/Dockerfile and the build context's .dockerignore, checked statically (Debian
packages no Dockerfile linter)."""

import json
import os
import re

from .common import DEPLOY, ROOT

INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
                "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


def dockerfile_instructions(text):
    """[(line number, INSTRUCTION, arguments)], continuation lines joined, comments dropped."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        word, _, rest = buf.partition(" ")
        out.append((start, word, rest.strip()))
        buf = ""
    if buf:
        out.append((start, "<unterminated>", buf))
    return out


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


def check_dockerfile(problems, text=None, ignore_patterns=None):
    """deploy/docker/Dockerfile: known instructions; only ARG before the first FROM; every base
    image pinned to a tag (after ARG defaults), never :latest; unique stage names; COPY --from
    names an earlier stage; no ADD (COPY is explicit); apt-get update and install in one RUN
    with -y and --no-install-recommends, lists removed; absolute WORKDIRs; numeric EXPOSE; the
    final stage runs as a non-root user, has a HEALTHCHECK, and exec-form ENTRYPOINT/CMD/
    HEALTHCHECK (valid JSON arrays); the build context (repository root, .dockerignore)
    keeps every source folder the build needs and drops build outputs, models and .git."""
    where = "deploy/docker/Dockerfile"
    if text is None:
        with open(os.path.join(DEPLOY, "docker", "Dockerfile"), encoding="utf-8") as f:
            text = f.read()
    ins = dockerfile_instructions(text)
    args = {}
    stages = []
    seen_from = False
    final = {}
    for n, word, rest in ins:
        w = f"{where}:{n}"
        if word != word.upper() or word not in INSTRUCTIONS:
            problems.add(w, f"unknown or lower-case instruction {word}")
            continue
        if word == "ARG":
            name, _, default = rest.partition("=")
            if not seen_from:
                args[name] = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), default)
            continue
        if not seen_from and word != "FROM":
            problems.add(w, f"{word} before the first FROM")
        if word == "FROM":
            seen_from = True
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            if not m:
                problems.add(w, f"cannot parse FROM {rest}")
                continue
            image = re.sub(r"\$\{(\w+)\}", lambda x: args.get(x.group(1), "<unset>"), m.group(1))
            if "<unset>" in image:
                problems.add(w, f"FROM {m.group(1)}: an ARG without a default before FROM")
            elif image not in [s for s in stages] and "@" not in image:
                tag = image.rsplit("/", 1)[-1].partition(":")[2]
                if not tag:
                    problems.add(w, f"base image {image} is not pinned to a tag")
                elif tag == "latest":
                    problems.add(w, f"base image {image} uses :latest")
            name = m.group(2) or str(len(stages))
            if name in stages:
                problems.add(w, f"stage name {name} is used twice")
            stages.append(name)
            final = {"user": None, "healthcheck": False, "entry": False}
            continue
        if word == "ADD":
            problems.add(w, "use COPY (ADD fetches URLs and unpacks archives implicitly)")
        if word == "COPY":
            m = re.search(r"--from=(\S+)", rest)
            if m and m.group(1) not in stages[:-1]:
                problems.add(w, f"COPY --from={m.group(1)}: no earlier stage of that name")
        if word == "RUN" and "apt-get install" in rest:
            if "apt-get update" not in rest:
                problems.add(w, "apt-get install without apt-get update in the same RUN")
            if "--no-install-recommends" not in rest or not re.search(r"\s-y\b|--yes", rest):
                problems.add(w, "apt-get install needs -y and --no-install-recommends")
            if "rm -rf /var/lib/apt/lists" not in rest:
                problems.add(w, "remove /var/lib/apt/lists in the RUN that installs")
        if word == "WORKDIR" and not rest.startswith("/"):
            problems.add(w, f"WORKDIR {rest} is not absolute")
        if word == "EXPOSE":
            for p in rest.split():
                if not re.fullmatch(r"\d+(/(tcp|udp))?", p) or not 0 < int(p.split("/")[0]) < 65536:
                    problems.add(w, f"EXPOSE {p} is not a port")
        if word == "USER":
            final["user"] = rest.split(":")[0]
        if word in ("ENTRYPOINT", "CMD", "HEALTHCHECK"):
            payload = rest
            if word == "HEALTHCHECK":
                final["healthcheck"] = rest.strip() != "NONE"
                payload = rest[rest.index("CMD") + 3:].strip() if " CMD " in f" {rest} " else ""
                if not payload and final["healthcheck"]:
                    problems.add(w, "HEALTHCHECK without CMD")
            if payload:
                try:
                    value = json.loads(payload)
                    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                        raise ValueError
                except ValueError:
                    problems.add(w, f"{word} must be in exec form (a JSON array of strings)")
            if word == "ENTRYPOINT":
                final["entry"] = True
    if len(stages) < 2:
        problems.add(where, "expected a multi-stage build (build and runtime stages)")
    if final.get("user") in (None, "root", "0"):
        problems.add(where, "the final stage must switch to a non-root USER")
    if not final.get("healthcheck"):
        problems.add(where, "the final stage has no HEALTHCHECK")
    if not final.get("entry"):
        problems.add(where, "the final stage has no ENTRYPOINT")
    for a in ("BUILD_IMAGE", "RUNTIME_IMAGE"):
        if a not in args:
            problems.add(where, f"ARG {a} (the CPU variant's switch) is missing")
    check_build_context(where, problems, ignore_patterns)


def check_build_context(where, problems, ignore_patterns=None):
    """The build context (repository root, .dockerignore or `ignore_patterns`) keeps every source
    folder the build needs and drops build outputs, models and .git."""
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
