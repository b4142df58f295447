"""Tandem's OpenAI-compatible HTTP API through the official `openai` client (pip install openai).

    python3 openai_client.py HOST:PORT [API_KEY]

Asks one chat question, then streams a completion. The README shows this file; a test runs it
against a real cluster (tests/clients/python_clients_test.sh).
"""
import sys

from openai import OpenAI


def main():
    address = sys.argv[1]
    api_key = sys.argv[2] if len(sys.argv) > 2 else "none"  # any string without --api-keys-file
    client = OpenAI(base_url=f"http://{address}/v1", api_key=api_key)
    model = client.models.list().data[0].id  # the one model served

    chat = client.chat.completions.create(
        model=model, max_tokens=32, temperature=0.8, seed=1,
        messages=[{"role": "user", "content": "Tell me a story about the sea."}])
    print("chat:", chat.choices[0].message.content)

    print("completion: ", end="")
    for chunk in client.completions.create(model=model, prompt="The old lighthouse",
                                           max_tokens=24, temperature=0.8, seed=7, stream=True):
        print(chunk.choices[0].text, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
