"""The Secret of API keys the Helm chart makes: a keys file the router's --api-keys-file accepts
(the rules of rpc/api_keys.cc), holding the random key the Secret also gives alone under
`api-key`, and the same key after an upgrade."""

import base64
import binascii
import re

API_KEYS_SECRET = "tandem-api-keys"
LIMITS = ("max_concurrent", "max_n", "tokens_per_minute")
# randAlphaNum 48 in the chart; fewer than this many letters and digits is guessable.
MIN_GENERATED_LENGTH = 32
INT32_MAX = 2**31 - 1


def parse_api_keys(text):
    """[(key, {limit: value})] of a keys file, as ApiKeys::Parse reads it; ValueError naming the
    line where the router would refuse the file."""
    keys = []
    for n, line in enumerate(text.split("\n"), 1):
        line = line.split("#", 1)[0].strip(" \t\r\n\v\f")
        if not line:
            continue
        fields = [f for f in re.split(r"[ \t]", line) if f]
        key = fields[0]
        if not all(0x21 <= ord(c) <= 0x7e for c in key):
            raise ValueError(f"line {n}: a key must be printable, without spaces")
        if len(key) < 16:
            raise ValueError(f"line {n}: a key must have at least 16 characters")
        limits = {}
        for f in fields[1:]:
            name, _, value = f.partition("=")
            if (not re.fullmatch(r"[+-]?\d+", value) or int(value) <= 0 or
                    (name != "tokens_per_minute" and int(value) > INT32_MAX)):
                raise ValueError(f"line {n}: {name}: the value must be a positive number")
            if name not in LIMITS:
                raise ValueError(f"line {n}: unknown limit {name!r} ({', '.join(LIMITS)})")
            limits[name] = int(value)
        keys.append((key, limits))
    if not keys:
        raise ValueError("the file holds no key")
    return keys


def decoded(secret, field):
    """The text of `field` of the Secret's data, or None."""
    value = (secret.get("data") or {}).get(field)
    if value is None:
        return None
    try:
        return base64.b64decode(value, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def check_generated_secret(where, secret, file_key, problems):
    """The chart's Secret: `file_key` holds a keys file the router accepts with one key, a long
    random one, which `api-key` holds alone. Returns (key, its limits) or None."""
    w = f"{where}: Secret {API_KEYS_SECRET}"
    key = decoded(secret, "api-key")
    text = decoded(secret, file_key)
    if key is None or text is None:
        problems.add(w, f"needs base64 data `api-key` and `{file_key}` (the keys file)")
        return None
    try:
        keys = parse_api_keys(text)
    except ValueError as e:
        problems.add(w, f"{file_key}: the router would refuse it: {e}")
        return None
    if [k for k, _ in keys] != [key]:
        problems.add(w, f"{file_key} must hold exactly the key under `api-key`")
        return None
    if len(key) < MIN_GENERATED_LENGTH or not key.isalnum():
        problems.add(w, f"the generated key has {len(key)} characters: at least "
                        f"{MIN_GENERATED_LENGTH} letters and digits")
    return keys[0]


def check_key_kept(chart_objects, problems):
    """`chart_objects(overrides, installed)`: the chart's objects as `helm upgrade` renders them
    where the Secret `installed` (None: none) is already in the release's namespace. Two
    installs draw different keys; an upgrade keeps the installed key, with the limits the new
    values give."""
    where = "helm (apiKeys: upgrade)"

    def generated(objs):
        found = [o for o in objs if o["kind"] == "Secret" and
                 o["metadata"]["name"] == API_KEYS_SECRET]
        return found[0] if len(found) == 1 else None

    first, second = generated(chart_objects(None, None)), generated(chart_objects(None, None))
    if first is None or second is None:
        problems.add(where, f"the defaults render no Secret {API_KEYS_SECRET}")
        return
    if decoded(first, "api-key") == decoded(second, "api-key"):
        problems.add(where, "two installs made the same key: it is not random")
    limits = "max_concurrent=32 tokens_per_minute=200000"
    upgraded = generated(chart_objects({"apiKeys": {"limits": limits}}, first))
    got = upgraded and check_generated_secret(where, upgraded, "keys.txt", problems)
    if got and got[0] != decoded(first, "api-key"):
        problems.add(where, "`helm upgrade` replaced the installed key (lookup must keep it)")
    if got and got[1] != {"max_concurrent": 32, "tokens_per_minute": 200000}:
        problems.add(where, f"the upgraded keys file has limits {got[1]}, the values {limits}")
