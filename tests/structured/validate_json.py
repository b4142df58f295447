"""Validates constrained outputs with the `jsonschema` package (an oracle nobody here wrote).

  python3 validate_json.py CASES.json
CASES.json is a list of {"schema": <schema>, "text": <output text>}. Each text must parse as
exactly one JSON value and validate against its schema (Draft 2020-12). Prints every failure and
exits 1 if there is one.
"""
import json
import sys

import jsonschema


def main():
    cases = json.load(open(sys.argv[1], encoding="utf-8"))
    failures = 0
    for i, case in enumerate(cases):
        schema = case["schema"]
        try:
            value = json.loads(case["text"])
            jsonschema.Draft202012Validator(schema).validate(value)
        except (ValueError, jsonschema.ValidationError) as e:
            failures += 1
            print(f"case {i}: {type(e).__name__}: {str(e).splitlines()[0]}\n"
                  f"  schema {json.dumps(schema)}\n  text {case['text']!r}")
    print(f"{len(cases) - failures} of {len(cases)} valid")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
