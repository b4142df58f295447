"""Holds lm_eval's logged answers (lm_eval_test.sh) to the server's own.

    python3 lm_eval_check.py OUT_DIR HOST:PORT TOKENIZER_DIR MODEL

TOKENIZER_DIR `remote`: the server's own /tokenize encodes (lm_eval's tokenizer_backend=remote),
and transformers is not needed.

Loglikelihood: lm_eval sends context + continuation with echo, logprobs and max_tokens 1 and
sums the continuation's echoed log-probabilities; the same tokens with max_tokens 0 (the prompt's
log-probabilities alone) must sum to the same number. generate_until: a greedy completion of the
same prompt with the same stop must be the text lm_eval logged.
"""
import glob
import json
import math
import sys
import urllib.request


def post(host, body, path="/v1/completions"):
    req = urllib.request.Request(f"http://{host}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


class ServerTokenizer:
    """The server's /tokenize, as lm_eval's RemoteTokenizer calls it."""

    def __init__(self, host, model):
        self.host, self.model = host, model

    def encode(self, text, add_special_tokens=False):
        body = {"model": self.model, "prompt": text, "add_special_tokens": add_special_tokens}
        return post(self.host, body, "/tokenize")["tokens"]


def samples(out_dir, task):
    (path,) = glob.glob(f"{out_dir}/*/samples_{task}_*.jsonl")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main():
    out_dir, host, tok_dir, model = sys.argv[1:5]
    if tok_dir == "remote":
        tok = ServerTokenizer(host, model)
    else:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(tok_dir)
    checked = 0
    for s in samples(out_dir, "tandem_ll"):
        for args, resp in zip(s["arguments"].values(), s["resps"]):
            context, continuation = args["arg_0"], args["arg_1"]
            ctx = tok.encode(context, add_special_tokens=False)
            cont = tok.encode(continuation, add_special_tokens=False)
            reply = post(host, {"model": model, "prompt": ctx + cont, "max_tokens": 0,
                                "echo": True, "logprobs": 1})
            lps = reply["choices"][0]["logprobs"]["token_logprobs"]
            assert len(lps) == len(ctx) + len(cont), (len(lps), len(ctx), len(cont))
            want = sum(lps[len(ctx):])
            got = float(resp[0][0])
            assert math.isfinite(got) and abs(got - want) <= 1e-4 * max(1.0, abs(want)), \
                (context, continuation, got, want)
            checked += 1
    for s in samples(out_dir, "tandem_gen"):
        prompt = s["arguments"]["gen_args_0"]["arg_0"]
        reply = post(host, {"model": model, "prompt": tok.encode(prompt, add_special_tokens=False),
                            "max_tokens": 16, "temperature": 0, "stop": ["\n"]})
        text = reply["choices"][0]["text"]
        assert text == s["resps"][0][0], (prompt, text, s["resps"][0][0])
        assert "\n" not in text, text
        checked += 1
    (results,) = glob.glob(f"{out_dir}/*/results_*.json")
    with open(results, encoding="utf-8") as f:
        r = json.load(f)["results"]
    acc, em = r["tandem_ll"]["acc,none"], r["tandem_gen"]["exact_match,none"]
    assert 0 <= acc <= 1 and 0 <= em <= 1, r
    print(f"lm_eval: {checked} answers equal the server's own; acc {acc:.3f}, exact_match {em:.3f}")


if __name__ == "__main__":
    main()
