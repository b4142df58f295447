"""vLLM's guided decoding fields through the official `openai` client (`extra_body`), as clients
written for vLLM send them.

    python3 openai_guided.py HOST:PORT

guided_regex (and structured_outputs.regex) on completions and chat, streamed and not, must come
back matching the pattern as a whole by Python's `re`; guided_choice one of the strings;
guided_json a JSON value of the schema's shape. Run by python_clients_test.sh.
"""
import json
import re
import sys

from openai import OpenAI

PATTERN = r"(Lily|Tom) (saw|found) a (big|small) [a-z]{2,8}\."
CHOICES = ["happy ending", "sad ending"]
SCHEMA = {"type": "object", "required": ["name", "age"], "additionalProperties": False,
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "age": {"type": "integer"}}}


def main():
    client = OpenAI(base_url=f"http://{sys.argv[1]}/v1", api_key="none")
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Tell me a story."}]
    for seed in (1, 2, 3):
        for body in ({"guided_regex": PATTERN}, {"structured_outputs": {"regex": PATTERN}}):
            text = client.completions.create(
                model=model, prompt="Once upon a time", max_tokens=60, temperature=0.9,
                seed=seed, extra_body=body).choices[0].text
            assert re.fullmatch(PATTERN, text), (body, text)
            chat = client.chat.completions.create(
                model=model, messages=messages, max_tokens=60, temperature=0.9, seed=seed,
                extra_body=body).choices[0].message.content
            assert re.fullmatch(PATTERN, chat), (body, chat)
            streamed = "".join(
                c.choices[0].delta.content or "" for c in client.chat.completions.create(
                    model=model, messages=messages, max_tokens=60, temperature=0.9, seed=seed,
                    extra_body=body, stream=True) if c.choices)
            assert streamed == chat, (streamed, chat)
        print(f"seed {seed}: {text!r} / {chat!r}")
        choice = client.completions.create(
            model=model, prompt="The story ends with", max_tokens=20, temperature=0.9, seed=seed,
            extra_body={"guided_choice": CHOICES}).choices[0].text
        assert choice in CHOICES, choice
        value = json.loads(client.completions.create(
            model=model, prompt="A person:", max_tokens=80, temperature=0.9, seed=seed,
            extra_body={"guided_json": SCHEMA}).choices[0].text)
        assert set(value) == {"name", "age"} and isinstance(value["age"], int), value
    # What is not supported is a 400 naming the field, never ignored.
    try:
        client.completions.create(model=model, prompt="a", max_tokens=4,
                                  extra_body={"guided_regex": r"(a)\1"})
        raise AssertionError("a backreference was accepted")
    except Exception as e:  # openai.BadRequestError
        assert getattr(e, "status_code", None) == 400 and "guided_regex" in str(e), e
    print("guided fields: ok")


if __name__ == "__main__":
    main()
