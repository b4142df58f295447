#!/usr/bin/python3
"""Renders deploy/helm/tandem the way `helm template` does, offline and without Helm.

Helm is not packaged for Debian 12 and has no official PyPI wheel, so deploy/validate.py
renders the chart with this: Go's text/template for the subset the chart uses, with Helm's
objects (.Values, .Release, .Chart, .Files) and the handful of Sprig functions the templates
call. Anything outside that subset is an error (RenderError), never silently empty output, so
a template that needs more fails the check until this file learns it. Where `helm` is on PATH,
validate.py renders with it as well and checks both.

What is covered: text and actions with the trim markers `{{-` and `-}}`; comments; pipelines
(`a | f b`), parenthesised pipelines, fields of `.`, `$` and variables (`$x := ...`); if / else
if / else, with / else, range over lists and maps (with `$k, $v :=`), define, include and
template; the functions and, or, not, eq, ne, default, dict, list, index, dig, printf (%s %d %v
%q), quote, trim, indent, nindent, toYaml, toJson, sha256sum, b64enc, b64dec, randAlphaNum, len,
lookup, and .Files.Get.

`lookup` answers as `helm template` does, with an empty map, unless the caller hands the
renderer the objects of a cluster (`cluster=`): then it answers as `helm upgrade` against that
cluster would, which is how validate.py checks that an upgrade keeps a generated API key.
"""

import base64
import binascii
import hashlib
import json
import os
import re
import secrets
import string

import yaml


class RenderError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Lexing: text and actions, trim markers applied.

ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)


def lex(src, name):
    """[("text", str) | ("action", str, line)] with the trim markers' whitespace removed."""
    out = []
    pos = 0
    trim_next = False
    for m in ACTION.finditer(src):
        text = src[pos:m.start()]
        if trim_next:
            text = text.lstrip(" \t\r\n")
        if m.group(1):
            text = text.rstrip(" \t\r\n")
        if text:
            out.append(("text", text))
        body = m.group(2).strip()
        line = src.count("\n", 0, m.start()) + 1
        if not (body.startswith("/*") and body.endswith("*/")):
            out.append(("action", body, f"{name}:{line}"))
        trim_next = bool(m.group(3))
        pos = m.end()
    text = src[pos:]
    if trim_next:
        text = text.lstrip(" \t\r\n")
    if text:
        out.append(("text", text))
    return out


# ---------------------------------------------------------------------------------------------
# Parsing: a tree of nodes.

def parse(tokens, defines):
    """The node list of a template; `define` blocks go into `defines`."""
    pos = 0

    def block(stop):
        nonlocal pos
        nodes = []
        while pos < len(tokens):
            tok = tokens[pos]
            if tok[0] == "text":
                nodes.append(("text", tok[1]))
                pos += 1
                continue
            body, where = tok[1], tok[2]
            word = body.split(None, 1)[0] if body else ""
            if word in stop:
                return nodes, body, where
            pos += 1
            if word in ("if", "with", "range"):
                nodes.append(control(word, body[len(word):].strip(), where))
            elif word == "define":
                name = parse_string(body[len("define"):].strip(), where)
                inner, end, _ = block({"end"})
                pos += 1
                defines[name] = inner
            elif word in ("end", "else"):
                raise RenderError(f"{where}: unexpected {{{{{body}}}}}")
            elif word == "block":
                raise RenderError(f"{where}: `block` is not supported")
            else:
                nodes.append(("action", body, where))
        if stop:
            raise RenderError(f"unterminated block: expected {sorted(stop)}")
        return nodes, None, None

    def control(kind, pipeline, where):
        nonlocal pos
        body, end, end_where = block({"end", "else"})
        pos += 1
        else_nodes = []
        if end.split(None, 1)[0] == "else":
            rest = end[len("else"):].strip()
            if rest.startswith("if ") and kind == "if":
                else_nodes = [control("if", rest[3:].strip(), end_where)]
                return (kind, pipeline, body, else_nodes, where)
            if rest:
                raise RenderError(f"{end_where}: `else {rest}` is not supported")
            else_nodes, end, _ = block({"end"})
            pos += 1
        return (kind, pipeline, body, else_nodes, where)

    nodes, _, _ = block(set())
    return nodes


def parse_string(text, where):
    text = text.strip()
    if text.startswith('"'):
        return json.loads(text)
    if text.startswith("`") and text.endswith("`"):
        return text[1:-1]
    raise RenderError(f"{where}: expected a string, got {text!r}")


# ---------------------------------------------------------------------------------------------
# Pipelines.

TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<raw>`[^`]*`)|(?P<lp>\()|(?P<rp>\))'
                   r'|(?P<pipe>\|)|(?P<decl>:=)|(?P<assign>=)|(?P<comma>,)'
                   r'|(?P<num>-?\d+(?:\.\d+)?)(?![\w.])'
                   r'|(?P<word>[$.]?[A-Za-z_0-9$]*(?:\.[A-Za-z_0-9]+)*))')


def tokenize(text, where):
    out = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise RenderError(f"{where}: cannot read {text[pos:]!r}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


class Scope:
    def __init__(self, root, variables=None):
        self.root = root
        self.vars = dict(variables or {"$": root})

    def child(self):
        return Scope(self.root, self.vars)


def truthy(v):
    if v is None or v is False:
        return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v != 0
    if isinstance(v, (str, list, dict, tuple)):
        return len(v) > 0
    return True


def go_string(v):
    """fmt.Sprint of a value, as text/template prints it (Helm prints nil as "")."""
    if v is None:
        return ""
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (dict, list)):
        raise RenderError(f"printing a {type(v).__name__} needs toYaml or toJson: {v!r}")
    return str(v)


def to_yaml(v):
    if v is None:
        return "null"
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True, width=1 << 20,
                          allow_unicode=True).rstrip("\n").removesuffix("\n...")


def indent(n, s):
    pad = " " * int(n)
    return pad + str(s).replace("\n", "\n" + pad)


def printf(fmt, *args):
    args = list(args)

    def sub(m):
        verb = m.group(1)
        if verb == "%":
            return "%"
        if not args:
            raise RenderError(f"printf {fmt!r}: too few arguments")
        a = args.pop(0)
        if verb in ("s", "v"):
            return go_string(a)
        if verb == "d":
            return str(int(a))
        if verb == "q":
            return json.dumps(go_string(a), ensure_ascii=False)
        raise RenderError(f"printf verb %{verb} is not supported")
    out = re.sub(r"%([%svdq])", sub, fmt)
    if args:
        raise RenderError(f"printf {fmt!r}: too many arguments")
    return out


def index(v, *keys):
    for k in keys:
        if isinstance(v, dict):
            v = v.get(k)
        elif isinstance(v, list):
            v = v[int(k)]
        elif v is None:
            return None
        else:
            raise RenderError(f"index of a {type(v).__name__}")
    return v


def dig(*args):
    """Sprig's dig: `dig k1 k2 ... default map` walks nested maps; a missing key gives default."""
    if len(args) < 3:
        raise RenderError("dig needs at least three arguments")
    *keys, default, d = args
    if not isinstance(d, dict):
        raise RenderError(f"dig: the last argument is a {type(d).__name__}, not a map")
    for i, k in enumerate(keys):
        if k not in d:
            return default
        if i == len(keys) - 1:
            return d[k]
        d = d[k]
        if not isinstance(d, dict):
            raise RenderError(f"dig: {k} holds a {type(d).__name__}, not a map")
    return default


def b64dec(s):
    """Sprig's b64dec: standard base64; what does not decode gives an error text instead, as
    Sprig does."""
    try:
        return base64.b64decode(str(s).encode(), validate=True).decode("utf-8", "replace")
    except binascii.Error as e:
        return f"illegal base64 data ({e})"


def rand_alpha_num(n):
    """Sprig's randAlphaNum: n letters and digits from a cryptographic source."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(int(n)))


def go_and(*args):
    for a in args:
        if not truthy(a):
            return a
    return args[-1]


def go_or(*args):
    for a in args:
        if truthy(a):
            return a
    return args[-1]


def go_eq(a, *bs):
    return any(a == b for b in bs)


FUNCTIONS = {
    "and": go_and,
    "or": go_or,
    "not": lambda a: not truthy(a),
    "eq": go_eq,
    "ne": lambda a, b: a != b,
    "default": lambda d, v=None: v if truthy(v) else d,
    "dict": lambda *kv: {kv[i]: kv[i + 1] for i in range(0, len(kv), 2)},
    "list": lambda *items: list(items),
    "index": index,
    "printf": printf,
    "print": lambda *a: "".join(go_string(x) for x in a),
    "dig": dig,
    "trim": lambda s: go_string(s).strip(),
    "b64enc": lambda s: base64.b64encode(go_string(s).encode()).decode(),
    "b64dec": b64dec,
    "randAlphaNum": rand_alpha_num,
    "quote": lambda *a: " ".join(json.dumps(go_string(x), ensure_ascii=False) for x in a
                                 if x is not None),
    "indent": indent,
    "nindent": lambda n, s: "\n" + indent(n, s),
    "toYaml": to_yaml,
    "toJson": lambda v: json.dumps(v, sort_keys=True, separators=(",", ":"),
                                   ensure_ascii=False),
    "sha256sum": lambda s: hashlib.sha256(str(s).encode()).hexdigest(),
    "len": lambda v: len(v),
}


class Renderer:
    def __init__(self, chart_dir, values, release_name="tandem", namespace="default",
                 cluster=None):
        self.chart_dir = chart_dir
        # The objects `lookup` finds; None: no cluster, as under `helm template`.
        self.cluster = cluster
        with open(os.path.join(chart_dir, "Chart.yaml"), encoding="utf-8") as f:
            chart = yaml.safe_load(f)
        self.defines = {}
        self.templates = {}
        tdir = os.path.join(chart_dir, "templates")
        for name in sorted(os.listdir(tdir)):
            with open(os.path.join(tdir, name), encoding="utf-8") as f:
                src = f.read()
            self.templates[name] = parse(lex(src, f"templates/{name}"), self.defines)
        self.root = {
            "Values": values,
            "Release": {"Name": release_name, "Namespace": namespace, "Service": "Helm",
                        "IsInstall": True, "IsUpgrade": False},
            "Chart": {k[:1].upper() + k[1:]: v for k, v in chart.items()},
            "Files": {"Get": self.file_get},
        }
        self.depth = 0

    def file_get(self, path):
        full = os.path.realpath(os.path.join(self.chart_dir, path))
        if not os.path.exists(full):
            return ""
        with open(full, encoding="utf-8") as f:
            return f.read()

    def lookup(self, api_version, kind, namespace, name):
        """Helm's lookup: the object (a copy) or, for an empty name, {"items": [...]}; an empty
        map where nothing matches or there is no cluster."""
        import copy
        if self.cluster is None:
            return {}
        found = [o for o in self.cluster
                 if o.get("apiVersion") == api_version and o.get("kind") == kind and
                 (not namespace or o.get("metadata", {}).get("namespace") == namespace) and
                 (not name or o.get("metadata", {}).get("name") == name)]
        if not name:
            return {"apiVersion": api_version, "kind": kind + "List",
                    "items": copy.deepcopy(found)} if found else {}
        return copy.deepcopy(found[0]) if found else {}

    # -- evaluation

    def run(self, nodes, dot, scope, out):
        for node in nodes:
            kind = node[0]
            if kind == "text":
                out.append(node[1])
            elif kind == "action":
                v = self.pipeline(node[1], dot, scope, node[2], declare_ok=True)
                if v is not _NOTHING:
                    out.append(go_string(v))
            elif kind == "if":
                _, pipe, body, else_nodes, where = node
                s = scope.child()
                cond = self.pipeline(pipe, dot, s, where, declare_ok=True)
                self.run(body if truthy(cond) else else_nodes, dot, s, out)
            elif kind == "with":
                _, pipe, body, else_nodes, where = node
                s = scope.child()
                v = self.pipeline(pipe, dot, s, where, declare_ok=True)
                if truthy(v):
                    self.run(body, v, s, out)
                else:
                    self.run(else_nodes, dot, s, out)
            elif kind == "range":
                _, pipe, body, else_nodes, where = node
                names, pipe = split_declaration(pipe, where)
                v = self.pipeline(pipe, dot, scope, where)
                items = (sorted(v.items()) if isinstance(v, dict) else
                         list(enumerate(v or [])))
                if not items:
                    self.run(else_nodes, dot, scope.child(), out)
                for k, item in items:
                    s = scope.child()
                    if len(names) == 1:
                        s.vars[names[0]] = item
                    elif len(names) == 2:
                        s.vars[names[0]], s.vars[names[1]] = k, item
                    self.run(body, item, s, out)
            else:
                raise RenderError(f"unknown node {kind}")

    def include(self, name, dot):
        if name not in self.defines:
            raise RenderError(f"no template named {name!r}")
        self.depth += 1
        if self.depth > 50:
            raise RenderError(f"include {name!r}: too deep")
        out = []
        # As in Go: inside the template, `$` is the data it was given.
        self.run(self.defines[name], dot, Scope(self.root, {"$": dot}), out)
        self.depth -= 1
        return "".join(out)

    def pipeline(self, text, dot, scope, where, declare_ok=False):
        names, text = split_declaration(text, where)
        if names and not declare_ok:
            raise RenderError(f"{where}: a declaration is not allowed here")
        tokens = tokenize(text, where)
        if tokens and tokens[0] == ("word", "template"):
            tokens = [("word", "include")] + tokens[1:]
            v = self.eval_tokens(tokens, dot, scope, where)
        else:
            v = self.eval_tokens(tokens, dot, scope, where)
        if names:
            if len(names) != 1:
                raise RenderError(f"{where}: one variable at a time outside range")
            scope.vars[names[0]] = v
            return _NOTHING
        return v

    def eval_tokens(self, tokens, dot, scope, where):
        # Split into commands at top-level pipes.
        commands, cur, depth = [], [], 0
        for t in tokens:
            if t[0] == "lp":
                depth += 1
            elif t[0] == "rp":
                depth -= 1
            if t[0] == "pipe" and depth == 0:
                commands.append(cur)
                cur = []
            else:
                cur.append(t)
        commands.append(cur)
        value = _NOTHING
        for cmd in commands:
            if not cmd:
                raise RenderError(f"{where}: empty command in a pipeline")
            value = self.command(cmd, dot, scope, where, value)
        return value

    def command(self, cmd, dot, scope, where, piped):
        operands = self.operands(cmd, dot, scope, where)
        head_kind, head = operands[0]
        args = [v for _, v in operands[1:]]
        if piped is not _NOTHING:
            args.append(piped)
        if head_kind == "func":
            if head == "include":
                if len(args) != 2 and not (len(args) == 1):
                    raise RenderError(f"{where}: include takes a name and a context")
                return self.include(args[0], args[1] if len(args) > 1 else None)
            if head == "lookup":
                if len(args) != 4:
                    raise RenderError(f"{where}: lookup takes apiVersion, kind, namespace, name")
                return self.lookup(*args)
            if head not in FUNCTIONS:
                raise RenderError(f"{where}: function {head!r} is not supported by "
                                  f"deploy/helm_render.py")
            try:
                return FUNCTIONS[head](*args)
            except RenderError:
                raise
            except Exception as e:  # a wrong argument count or type, as Go would refuse
                raise RenderError(f"{where}: {head}: {e}") from e
        if callable(head):
            return head(*args)
        if args:
            raise RenderError(f"{where}: {head!r} is not a function but has arguments")
        return head

    def operands(self, cmd, dot, scope, where):
        out = []
        i = 0
        while i < len(cmd):
            kind, text = cmd[i]
            if kind == "lp":
                depth, j = 1, i + 1
                while j < len(cmd) and depth:
                    depth += {"lp": 1, "rp": -1}.get(cmd[j][0], 0)
                    j += 1
                if depth:
                    raise RenderError(f"{where}: unbalanced parentheses")
                out.append(("value", self.eval_tokens(cmd[i + 1:j - 1], dot, scope, where)))
                i = j
                continue
            if kind == "str":
                out.append(("value", json.loads(text)))
            elif kind == "raw":
                out.append(("value", text[1:-1]))
            elif kind == "num":
                out.append(("value", float(text) if "." in text else int(text)))
            elif kind == "word":
                out.append(self.word(text, dot, scope, where, head=not out))
            else:
                raise RenderError(f"{where}: unexpected {text!r}")
            i += 1
        return out

    def word(self, text, dot, scope, where, head):
        if text in ("true", "false"):
            return ("value", text == "true")
        if text == "nil":
            return ("value", None)
        if text == ".":
            return ("value", dot)
        if text.startswith("$"):
            name, _, path = text.partition(".")
            if name not in scope.vars:
                raise RenderError(f"{where}: undefined variable {name}")
            return ("value", fields(scope.vars[name], path, where))
        if text.startswith("."):
            return ("value", fields(dot, text[1:], where))
        if head:
            return ("func", text)
        raise RenderError(f"{where}: {text!r} where a value was expected")


_NOTHING = object()


def split_declaration(text, where):
    m = re.match(r"\s*(\$\w*(?:\s*,\s*\$\w*)?)\s*:=\s*(.*)$", text, re.S)
    if not m:
        return [], text
    return [n.strip() for n in m.group(1).split(",")], m.group(2)


def fields(v, path, where):
    for part in [p for p in path.split(".") if p]:
        if isinstance(v, dict):
            v = v.get(part)
        elif v is None:
            return None  # Helm: a missing value renders empty
        else:
            raise RenderError(f"{where}: field {part} of a {type(v).__name__}")
    return v


# ---------------------------------------------------------------------------------------------


def merge(base, override):
    """Helm's values merge: maps merge key by key, anything else is replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = merge(base.get(k), v) if k in base else v
        return out
    return override


def render_chart(chart_dir, value_files=(), overrides=None, release_name="tandem",
                 namespace="default", cluster=None):
    """{template name: rendered text} for every manifest template, as `helm template` does
    (helpers, files starting with "_", are not rendered on their own); with `cluster` (a list of
    objects), as `helm upgrade` against a cluster holding them (`lookup` finds them)."""
    with open(os.path.join(chart_dir, "values.yaml"), encoding="utf-8") as f:
        values = yaml.safe_load(f) or {}
    for path in value_files:
        with open(path, encoding="utf-8") as f:
            values = merge(values, yaml.safe_load(f) or {})
    if overrides:
        values = merge(values, overrides)
    r = Renderer(chart_dir, values, release_name, namespace, cluster)
    out = {}
    for name, nodes in r.templates.items():
        if name.startswith("_"):
            continue
        text = []
        r.run(nodes, r.root, Scope(r.root), text)
        out[name] = "".join(text)
    return out


def chart_objects(chart_dir, value_files=(), overrides=None, cluster=None, namespace="default"):
    """The Kubernetes objects the chart renders (NOTES.txt left out); `cluster` as in
    render_chart()."""
    objs = []
    for name, text in render_chart(chart_dir, value_files, overrides, namespace=namespace,
                                   cluster=cluster).items():
        if not name.endswith((".yaml", ".yml")):
            continue
        try:
            docs = list(yaml.safe_load_all(text))
        except yaml.YAMLError as e:
            raise RenderError(f"templates/{name} renders invalid YAML: {e}\n{text}") from e
        objs += [d for d in docs if d is not None]
    return objs


if __name__ == "__main__":
    import sys
    chart = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helm", "tandem")
    for name, text in render_chart(chart, sys.argv[1:]).items():
        if name.endswith((".yaml", ".yml")) and text.strip():
            print(f"---\n# Source: tandem/templates/{name}\n{text.strip()}")
