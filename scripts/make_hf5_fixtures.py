#!/usr/bin/env python3
"""Re-save HF test fixtures with transformers 5, whose files differ from 4.x in ways a loader
must follow.

What it makes
-------------
Under tests/fixtures/hf5/<name>/ for llama3_f32 and qwen2_f32 of tests/fixtures/hf (made by
make_hf_fixtures.py with transformers 4): config.json as transformers 5 writes it (AutoConfig
loaded from the 4.x directory, then save_pretrained: rope_theta and rope_scaling move into
"rope_parameters", torch_dtype becomes dtype), and the same model.safetensors. The model is
unchanged, so the 4.x expected.json logits are the oracle for the re-saved directory too.

Also tests/fixtures/hf5/chatml_tokenizer/: a small byte-level BPE tokenizer with a ChatML chat
template saved by transformers 5's save_pretrained, which writes the template to
chat_template.jinja rather than into tokenizer_config.json; expected.json holds
apply_chat_template's renders of two conversations.

How to run (no torch needed)
----------------------------
  python3 -m venv /root/hf5env && /root/hf5env/bin/pip install "transformers>=5,<6" jinja2
  /root/hf5env/bin/python scripts/make_hf5_fixtures.py
"""

import json
import os
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "fixtures", "hf")
OUT = os.path.join(ROOT, "tests", "fixtures", "hf5")

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."},
     {"role": "user", "content": "Bye"}],
]


def resave_models():
    from transformers import AutoConfig
    for name in ["llama3_f32", "qwen2_f32"]:
        src, dst = os.path.join(SRC, name), os.path.join(OUT, name)
        os.makedirs(dst, exist_ok=True)
        AutoConfig.from_pretrained(src).save_pretrained(dst)
        shutil.copy(os.path.join(src, "model.safetensors"), dst)
        config = json.load(open(os.path.join(dst, "config.json")))
        print(name, "rope_parameters:", config.get("rope_parameters"),
              "rope_theta at top level:", "rope_theta" in config)


def save_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["What is the capital of France? Be brief. Hello. Hi. Bye."] * 4,
                            trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>")
    fast.chat_template = CHATML
    dst = os.path.join(OUT, "chatml_tokenizer")
    os.makedirs(dst, exist_ok=True)
    fast.save_pretrained(dst)
    config = json.load(open(os.path.join(dst, "tokenizer_config.json")))
    assert "chat_template" not in config, "transformers kept the template in the config"
    assert os.path.exists(os.path.join(dst, "chat_template.jinja"))
    renders = [{"messages": m, "add_generation_prompt": True,
                "rendered": fast.apply_chat_template(m, tokenize=False,
                                                     add_generation_prompt=True)}
               for m in CHATS]
    with open(os.path.join(dst, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"chat": renders}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("chatml_tokenizer:", sorted(os.listdir(dst)))


def main():
    import transformers
    print("transformers", transformers.__version__)
    resave_models()
    save_tokenizer()


if __name__ == "__main__":
    main()
