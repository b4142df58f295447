#!/usr/bin/env python3
"""Writes an early-exit draft model for speculative decoding: the first N transformer blocks of a
Llama-family GGUF, with its embedding, final norm, classifier and tokenizer unchanged (the same
vocabulary, as --draft-model requires). Untrained for early exit, it proposes well only where the
first blocks already decide the token; it exists to measure the draft-model path on a real model
when no smaller model of the same tokenizer is at hand.

  bench/speculative/make_early_exit_draft.py MODEL.gguf OUT.gguf --layers N

Needs the `gguf` package from PyPI (pip install gguf).
"""
import argparse
import re
import sys

import gguf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, required=True, help="blocks to keep, from the first")
    args = ap.parse_args()

    reader = gguf.GGUFReader(args.model)
    arch = reader.fields["general.architecture"].contents()
    blocks = reader.fields[f"{arch}.block_count"].contents()
    if not 1 <= args.layers <= blocks:
        print(f"--layers must be in [1, {blocks}]", file=sys.stderr)
        return 2

    writer = gguf.GGUFWriter(args.out, arch)
    for name, field in reader.fields.items():
        # The writer adds the header fields and the architecture itself.
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        if name == f"{arch}.block_count":
            value = args.layers
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_array(name, value)
        else:
            writer.add_key_value(name, value, vtype)

    block = re.compile(r"^blk\.(\d+)\.")
    for t in reader.tensors:
        m = block.match(t.name)
        if m and int(m.group(1)) >= args.layers:
            continue
        # As read: quantized data as rows of bytes, which the writer turns back into the shape.
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {args.out}: {args.layers} of {blocks} blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
