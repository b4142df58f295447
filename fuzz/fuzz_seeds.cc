// Writes the seed corpora of the fuzz targets into OUT_DIR/<target>/: headers of the real
// stories260K checkpoint, small safetensors files written by the engine's own writer, the test
// fixtures' config.json files, shrunken copies of the real tokenizer.json files (their full
// vocabularies would make every run slow), chat templates of a real tokenizer_config.json, valid
// GenerateRequests and valid KV frames. Generated at build time rather than committed.
//   fuzz_seeds OUT_DIR
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "formats/mapped_file.h"
#include "formats/safetensors.h"
#include "kv_transfer/wire.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/generation.pb.h"
#include "tests/engine/gguf_writer.h"
#include "text/tokenizer/hf_tokenizer.h"

namespace fs = std::filesystem;

namespace {

std::string g_out;
int g_count = 0;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = fs::path(g_out) / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz_seeds: cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
  ++g_count;
}

std::string Read(const std::string& path) {
  auto s = tandem::ReadFileToString(path);
  if (!s.ok()) {
    std::fprintf(stderr, "fuzz_seeds: %s\n", s.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(s);
}

const std::string kShared = TANDEM_SHARED_DIR;
const std::string kSource = TANDEM_SOURCE_DIR;

void Llama2c() {
  const std::string bin = Read(kShared + "/models/stories260K/stories260K.bin");
  Write("llama2c_fuzzer", "stories260K_header", bin.substr(0, 28));
  // dim 8, hidden 16, 1 layer, 2 heads, 1 KV head, vocab 4 (negative: separate classifier),
  // context 4: the target pads it to the size it describes.
  const int32_t tiny[7] = {8, 16, 1, 2, 1, -4, 4};
  Write("llama2c_fuzzer", "tiny_header", std::string(reinterpret_cast<const char*>(tiny), 28));
}

void Safetensors() {
  using tandem::DType;
  const std::vector<std::vector<tandem::TensorSpec>> files = {
      {{"model.embed_tokens.weight", DType::kF32, {4, 2}}, {"model.norm.weight", DType::kF32, {2}}},
      {{"a", DType::kF16, {3}}, {"b", DType::kBF16, {1, 2}}, {"c", DType::kF32, {0, 5}}},
      {{"lm_head.weight", DType::kBF16, {2, 2, 1}}},
  };
  const fs::path tmp = fs::path(g_out) / "tmp.safetensors";
  int i = 0;
  for (const auto& specs : files) {
    auto st = tandem::WriteSafetensors(tmp, specs, [](const tandem::TensorSpec& t) {
      return std::string(static_cast<size_t>(t.numel()) * tandem::DTypeSize(t.dtype), '\x3c');
    });
    if (!st.ok()) {
      std::fprintf(stderr, "fuzz_seeds: %s\n", st.ToString().c_str());
      std::exit(1);
    }
    Write("safetensors_fuzzer", "small" + std::to_string(i++), Read(tmp));
  }
  fs::remove(tmp);
  // The header of a real fixture (its data cut off: offsets then point past the end).
  const std::string real = Read(kSource + "/tests/fixtures/hf/llama_tied_bf16/model.safetensors");
  uint64_t len = 0;
  std::memcpy(&len, real.data(), 8);
  Write("safetensors_fuzzer", "fixture_header", real.substr(0, 8 + len));
}

void HfConfig() {
  for (const char* name :
       {"llama3_f32", "llama_tied_bf16", "mistral_f16", "qwen2_f32", "qwen3_f32"}) {
    Write("hf_config_fuzzer", name, Read(kSource + "/tests/fixtures/hf/" + name + "/config.json"));
  }
}

// Schemas of every supported kind, each followed by a NUL and a few choice bytes.
void JsonSchemas() {
  const char* schemas[] = {
      R"({"type": "object"})",
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
          "age": {"type": "integer"}}, "required": ["name"], "additionalProperties": false})",
      R"({"type": "array", "items": {"enum": ["a", 1, null, true]}, "minItems": 1})",
      R"({"anyOf": [{"type": "number"}, {"type": "string"}, {"const": {"k": [1]}}]})",
      R"({"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
          "$ref": "#/$defs/t"})",
      R"(true)",
      R"({"type": "object", "properties": {"e": {"type": "string", "pattern": "^[a-z]+@x\\.com$"},
          "n": {"pattern": "[0-9]"}, "t": {"pattern": "^\\w"}}, "required": ["e", "n"]})",
      // guided_regex patterns (the 'R' mode).
      R"(R(yes|no) [0-9]{1,3}\.)",
      R"(R[^a-c]+.(?:x|y)*\w{2,}$)",
      R"(R^(ab){3,5}é.?)",
  };
  int i = 0;
  for (const char* s : schemas) {
    Write("json_schema_fuzzer", "schema" + std::to_string(i++),
          std::string(s) + std::string(1, '\0') + "\x01\x07\x13\x42\x99\xff\x10\x33");
  }
}

// The tokenizer.json with only the vocabulary entries of ids below `keep` and the merges among
// them (json, not ordered_json: the latter's linear key lookups take minutes on 150k entries).
std::string Shrink(const std::string& text, int keep) {
  nlohmann::json j = nlohmann::json::parse(text);
  auto& model = j["model"];
  nlohmann::json vocab = nlohmann::json::object();
  std::unordered_set<std::string> kept;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (it.value().get<int>() < keep) {
      vocab[it.key()] = it.value();
      kept.insert(it.key());
    }
  }
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& m : model["merges"]) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) continue;
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    if (kept.contains(a) && kept.contains(b) && kept.contains(a + b)) merges.push_back(m);
  }
  model["vocab"] = std::move(vocab);
  model["merges"] = std::move(merges);
  return j.dump(1);
}

void Tokenizers() {
  for (const char* name : {"qwen3", "mistral"}) {
    const std::string full = Read(kShared + "/testdata/tokenizers/" + name + ".tokenizer.json");
    const std::string small = Shrink(full, 400);
    auto loaded = tandem::HfTokenizer::FromJson(small);
    if (!loaded.ok()) {
      std::fprintf(stderr, "fuzz_seeds: warning: shrunken %s does not load: %s\n", name,
                   loaded.status().ToString().c_str());
    }
    Write("tokenizer_json_fuzzer", name, small);
  }
  const char* texts[] = {"Hello world! It's 12345 times.", "ünïcödé 日本語 🙂\n\n  x",
                         "<|im_start|>user\nhi<|im_end|>", "[INST] a\tb [/INST]</s>"};
  int i = 0;
  for (const char* text : texts) {
    for (char which : {'\0', '\1'}) {
      Write("tokenizer_encode_fuzzer", "text" + std::to_string(i++), std::string(1, which) + text);
    }
  }
}

void ChatTemplates() {
  auto config =
      nlohmann::json::parse(Read(kShared + "/testdata/tokenizers/qwen3.tokenizer_config.json"));
  Write("chat_template_fuzzer", "qwen3", config["chat_template"].get<std::string>());
  Write("chat_template_fuzzer", "llama2",
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] "
        "| trim }} [/INST]{% elif m['role'] == 'assistant' %} {{ m['content'] }}{{ eos_token }}"
        "{% endif %}{% endfor %}");
  Write("chat_template_fuzzer", "features",
        "{%- set ns = namespace(n=0) -%}{% macro f(x, y=2) %}{{ x ~ y }}{% endmacro %}"
        "{% for m in messages if m.role != 'tool' %}{{ loop.index }}:{{ f(m.role) }}"
        "{{ m.content is string }}{{ tools | tojson(indent=2) }}{% set ns.n = ns.n + 1 %}"
        "{% endfor %}{{ ns.n }}{{ 'x' * 3 }}{{ [1,2,3][1:] | join(',') }}{{ {'a': 1}.items() "
        "| list | length }}{% if add_generation_prompt %}<|assistant|>{% endif %}");
  Write("chat_template_fuzzer", "chains",
        "{{ messages[0].content|trim|e|length ~ 'x' ~ (1 + 2 * 3 ** 2) }}{{ x.a.b[0]()[1:] "
        "if x is defined and not y or z else none }}");
}

void Requests() {
  tandem::v1::GenerateRequest r;
  r.set_text("Once upon a time");
  r.set_max_tokens(16);
  Write("ingress_fuzzer", "text", r.SerializeAsString());
  r.mutable_sampling()->set_temperature(0.7f);
  r.mutable_sampling()->set_top_k(40);
  r.mutable_sampling()->set_top_p(0.9f);
  r.mutable_sampling()->set_seed(7);
  r.add_stop("\n");
  r.add_stop("The end");
  r.set_request_id("req-1");
  r.set_ignore_eos(true);
  Write("ingress_fuzzer", "text_sampling_stop", r.SerializeAsString());
  tandem::v1::GenerateRequest t;
  for (int id : {1, 403, 407, 261, 500}) t.mutable_tokens()->add_ids(id);
  t.set_max_tokens(200);
  Write("ingress_fuzzer", "tokens", t.SerializeAsString());
}

void Frames() {
  tandem::KvChunkHeader c;
  c.request_id = 42;
  c.lease_id = 7;
  c.generation = 3;
  c.layer = 1;
  c.width = 8;
  int i = 0;
  for (uint32_t start : {0u, 3u, 6u}) {
    for (uint32_t count : {1u, 2u, 5u}) {
      ++i;
      c.token_start = start;
      c.token_count = count;
      std::string payload(2 * count * 8 * 4, '\0');
      for (size_t b = 0; b < payload.size(); ++b) payload[b] = static_cast<char>(b * 7 + start);
      Write("kv_wire_fuzzer", "data" + std::to_string(i), tandem::EncodeKvDataFrame(i, c, payload));
    }
  }
  c.dtype = tandem::DType::kBF16;
  Write("kv_wire_fuzzer", "data_bf16",
        tandem::EncodeKvDataFrame(99, c, std::string(2 * c.token_count * 8 * 2, '\1')));
  // fp8: one byte per value, then a float32 scale per KV head for K and for V.
  c.dtype = tandem::DType::kFp8E4M3;
  c.scale_groups = 2;
  std::string fp8(2 * c.token_count * 8, '\x38');
  for (int s = 0; s < 4; ++s) fp8.append("\x00\x00\x80\x3f", 4);  // 1.0f
  Write("kv_wire_fuzzer", "data_fp8", tandem::EncodeKvDataFrame(100, c, fp8));
  c.scale_groups = 0;
  Write("kv_wire_fuzzer", "ack_ok", tandem::EncodeKvAckFrame(5, c, absl::OkStatus()));
  Write("kv_wire_fuzzer", "ack_error",
        tandem::EncodeKvAckFrame(6, c, absl::FailedPreconditionError("lease 7 generation 3 gone")));
  Write("kv_wire_fuzzer", "endpoint_tcp", "tcp://127.0.0.1:4567");
  Write("kv_wire_fuzzer", "endpoint_local", "local://decode-0");
}

void HttpRequests() {
  const char* const kRequests[] = {
      "GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 46\r\n"
      "\r\n{\"prompt\": \"Once upon\", \"max_tokens\": 8, \"n\": 1}",
      "POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
      "1a\r\n{\"messages\": [{\"role\": 1}]}\r\n0\r\n\r\n",
      "POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n[1e400]",
      "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.1\r\n\r\n",
  };
  int i = 0;
  for (const char* r : kRequests) Write("http_request_fuzzer", "request" + std::to_string(++i), r);
}

// Small GGUF models (every tensor type) with a BPE and a sentencepiece vocabulary.
void Gguf() {
  using tandem::DType;
  tandem::testing::TinyLlamaShape shape{32, 64, 1, 2, 1, 8};
  int i = 0;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                  DType::kQ5_0, DType::kQ5_1}) {
    tandem::testing::GgufWriter w = tandem::testing::TinyLlama(t, 1, shape);
    if (i % 2 == 0) {
      w.String("tokenizer.ggml.model", "gpt2");
      w.String("tokenizer.ggml.pre", i % 4 == 0 ? "smollm" : "llama-bpe");
      w.Strings("tokenizer.ggml.tokens", {"a", "b", "ab", "<|end|>", "\u0120", "c", "d", "e"});
      w.Strings("tokenizer.ggml.merges", {"a b"});
      w.Ints("tokenizer.ggml.token_type", {1, 1, 1, 3, 1, 1, 1, 1});
      w.U32("tokenizer.ggml.eos_token_id", 3);
      w.String("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}");
    } else {
      w.String("tokenizer.ggml.model", "llama");
      w.Strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "<0x41>",
                                          "\xE2\x96\x81"
                                          "a",
                                          "b", "ab", "\xE2\x96\x81"});
      w.Floats("tokenizer.ggml.scores", {0, 0, 0, 0, -1, -2, -0.5f, -3});
      w.Ints("tokenizer.ggml.token_type", {2, 3, 3, 6, 1, 1, 1, 1});
    }
    Write("gguf_fuzzer", "tiny_" + std::string(tandem::DTypeName(t)), w.Build(i % 3 == 0 ? 2 : 3));
    ++i;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds OUT_DIR\n");
    return 2;
  }
  g_out = argv[1];
  fs::create_directories(g_out);
  Llama2c();
  Safetensors();
  Gguf();
  HfConfig();
  JsonSchemas();
  Tokenizers();
  ChatTemplates();
  HttpRequests();
  Requests();
  Frames();
  std::printf("fuzz_seeds: %d seeds in %s\n", g_count, g_out.c_str());
  return 0;
}
