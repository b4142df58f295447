// GGUF files made here (tests/engine/gguf_writer.h): every tensor type through the loader
// against the same file dequantized, a llama (sentencepiece) vocabulary against the llama2.c
// tokenizer it came from, and corrupt, truncated and unsupported files as one clear error.
#include "formats/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/model.h"
#include "tests/engine/gguf_writer.h"
#include "tests/test_util.h"
#include "text/llama2c_tokenizer.h"
#include "text/load_tokenizer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tandem_gguf_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  // Logits of `ids` (every position).
  static std::vector<float> Logits(const Model& m, const std::vector<int>& ids) {
    auto cache = KvCache::Create(m.config(), 4, 16);
    EXPECT_TRUE(cache.ok());
    const std::vector<int> table = {0, 1, 2, 3};
    SequenceChunk chunk{ids, 0, table, /*all_logits=*/true};
    std::vector<float> logits;
    EXPECT_TRUE(m.Forward({&chunk, 1}, &*cache, &logits).ok());
    return logits;
  }

  fs::path dir_;
};

constexpr DType kEveryType[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,
                                DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// Each tensor type, computed as stored, against the same file with every matrix dequantized to
// float32 at load: the activations' rounding (~14 bits) is all that differs.
TEST_F(GgufTest, EveryTensorTypeRunsAsStoredAndMatchesItsDequantization) {
  auto backend = MakeCpuBackend();
  const std::vector<int> ids = {1, 5, 9, 33, 2, 60, 7};
  for (DType t : kEveryType) {
    SCOPED_TRACE(std::string(DTypeName(t)));
    const std::string path =
        Write(std::string(DTypeName(t)) + ".gguf", testing::TinyLlama(t).Build());
    auto native = Model::Load(path, backend.get());
    ASSERT_TRUE(native.ok()) << native.status();
    EXPECT_EQ((*native)->weights().layers[0].w1.dtype, t);
    auto f32 = Model::Load(path, backend.get(), DType::kF32);
    ASSERT_TRUE(f32.ok()) << f32.status();
    const std::vector<float> a = Logits(**native, ids), b = Logits(**f32, ids);
    ASSERT_EQ(a.size(), b.size());
    float max_abs = 0, max_err = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_abs = std::max(max_abs, std::abs(b[i]));
      max_err = std::max(max_err, std::abs(a[i] - b[i]));
    }
    EXPECT_GT(max_abs, 0.1f);
    EXPECT_LE(max_err, 1e-3f * max_abs);
  }
}

// --dtype to a quantized type quantizes at load; rows that are not whole blocks of a K type take
// llama.cpp's fallback (q4_k -> q5_0).
TEST_F(GgufTest, QuantizingAtLoadFallsBackForPartialBlocks) {
  auto backend = MakeCpuBackend();
  testing::TinyLlamaShape shape;
  shape.dim = 96;  // 3 blocks of 32, not a multiple of 256
  shape.hidden = 256;
  const std::string path = Write("f32.gguf", testing::TinyLlama(DType::kF32, 3, shape).Build());
  auto m = Model::Load(path, backend.get(), DType::kQ4_K);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->weights().layers[0].wq.dtype, DType::kQ5_0);  // 96 columns
  EXPECT_EQ((*m)->weights().layers[0].w2.dtype, DType::kQ4_K);  // 256 columns
  // stories260K's hidden size (172) is not a whole number of blocks: f16 rows.
  auto s260 = Model::Load(testing::Stories260K(), backend.get(), DType::kQ8_0);
  ASSERT_TRUE(s260.ok()) << s260.status();
  EXPECT_EQ((*s260)->weights().layers[0].w2.dtype, DType::kF16);
  EXPECT_EQ((*s260)->weights().layers[0].wq.dtype, DType::kQ8_0);
  EXPECT_EQ(ParseWeightDType("q4_k").value(), DType::kQ4_K);
  EXPECT_EQ(ParseWeightDType("int3").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GgufTest, CorruptTruncatedAndUnsupportedFilesAreOneClearError) {
  auto backend = MakeCpuBackend();
  const std::string good = testing::TinyLlama(DType::kQ8_0).Build();
  ASSERT_TRUE(Model::Load(Write("good.gguf", good), backend.get()).ok());

  // Every truncation within the header and metadata, and a spread through the tensor data.
  for (size_t n = 0; n < good.size(); n += n < 2048 ? 1 : 4099) {
    const std::string path = Write("cut.gguf", good.substr(0, n));
    auto m = Model::Load(path, backend.get());
    ASSERT_FALSE(m.ok()) << "truncated at " << n;
  }

  struct Bad {
    std::string name;
    testing::GgufWriter file;
    std::string want;  // in the message
  };
  std::vector<Bad> cases;
  {
    testing::GgufWriter w;
    w.String("general.architecture", "gemma");
    cases.push_back({"architecture", w, "gemma"});
  }
  {
    testing::GgufWriter w = testing::TinyLlama(DType::kF32);
    w.String("llama.rope.scaling.type", "yarn");
    cases.push_back({"rope scaling", w, "yarn"});
  }
  {
    testing::GgufWriter w = testing::TinyLlama(DType::kF32);
    w.F32("llama.attn_logit_softcapping", 50.0f);
    cases.push_back({"unknown key that changes the math", w, "llama.attn_logit_softcapping"});
  }
  for (const Bad& b : cases) {
    auto m = Model::Load(Write("bad.gguf", b.file.Build()), backend.get());
    ASSERT_FALSE(m.ok()) << b.name;
    EXPECT_NE(m.status().message().find(b.want), std::string::npos) << b.name << ": " << m.status();
  }

  // A tensor the model uses, of a ggml type Tandem does not compute with.
  std::string unknown = good;
  const std::string name = "blk.0.ffn_gate.weight";
  const size_t at = unknown.find(name);
  ASSERT_NE(at, std::string::npos);
  const uint32_t type = 77;
  std::memcpy(unknown.data() + at + name.size() + 4 + 2 * 8, &type, 4);
  auto typed = Model::Load(Write("type.gguf", unknown), backend.get());
  ASSERT_FALSE(typed.ok());
  EXPECT_NE(typed.status().message().find("type 77"), std::string::npos) << typed.status();

  // Version 1 and a tensor that runs past the end of the file.
  std::string v1 = good;
  v1[4] = 1;
  auto m = Model::Load(Write("v1.gguf", v1), backend.get());
  EXPECT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("version"), std::string::npos) << m.status();
  testing::GgufWriter w = testing::TinyLlama(DType::kF32);
  w.Tensor("blk.0.huge.weight", 0, {int64_t{1} << 40}, std::string(16, '\0'));
  auto huge = GgufFile::Read(Write("huge.gguf", w.Build()));
  EXPECT_FALSE(huge.ok());
}

// tok512 (a sentencepiece BPE vocabulary, as llama2.c exports it) written as a GGUF "llama"
// vocabulary: the GGUF-built tokenizer must split text exactly as llama2.c's encoder.
TEST_F(GgufTest, LlamaVocabularyMatchesTheLlama2cTokenizer) {
  std::ifstream in(testing::Tok512(), std::ios::binary);
  ASSERT_TRUE(in) << testing::Tok512();
  int32_t max_len = 0;
  in.read(reinterpret_cast<char*>(&max_len), 4);
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (int i = 0; i < 512; ++i) {
    float score;
    int32_t len;
    in.read(reinterpret_cast<char*>(&score), 4);
    in.read(reinterpret_cast<char*>(&len), 4);
    std::string t(len, '\0');
    in.read(t.data(), len);
    // llama2.c's export wrote "▁" as a space and BOS/EOS as "\n<s>\n" / "\n</s>\n".
    std::string piece;
    for (char c : t) piece += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
    if (i == 1) piece = "<s>";
    if (i == 2) piece = "</s>";
    tokens.push_back(piece);
    scores.push_back(score);
    types.push_back(i == 0 ? 2 : i <= 2 ? 3 : piece.starts_with("<0x") ? 6 : 1);
  }
  ASSERT_TRUE(in);
  testing::GgufWriter w;
  w.String("general.architecture", "llama");
  w.String("tokenizer.ggml.model", "llama");
  w.Strings("tokenizer.ggml.tokens", tokens);
  w.Floats("tokenizer.ggml.scores", scores);
  w.Ints("tokenizer.ggml.token_type", types);
  w.U32("tokenizer.ggml.bos_token_id", 1);
  w.U32("tokenizer.ggml.eos_token_id", 2);
  w.U32("tokenizer.ggml.unknown_token_id", 0);
  auto gguf = LoadTokenizer(Write("vocab.gguf", w.Build()));
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto llama2c = LoadTokenizer(testing::Tok512(), 512);
  ASSERT_TRUE(llama2c.ok()) << llama2c.status();
  for (const std::string text :
       {"Once upon a time", "Lily and Tom went to the park.\nThey saw a big dog!",
        "  two spaces, then\ttab", "café 42 — ünïcödé", "x", "The end."}) {
    SCOPED_TRACE(text);
    const std::vector<int> ids = (*llama2c)->Encode(text, /*add_special_tokens=*/true);
    EXPECT_EQ((*gguf)->Encode(text, /*add_special_tokens=*/true), ids);
    // The text back: HF's decoder drops the dummy-prefix space of the first piece, llama2.c's
    // drops it after a BOS (and writes no BOS), so the text ids against the whole sequence.
    const std::vector<int> text_ids(ids.begin() + 1, ids.end());
    EXPECT_EQ((*gguf)->Decode(text_ids), (*llama2c)->Decode(ids));
  }
  EXPECT_EQ((*gguf)->bos_id(), 1);

  // A token that is not UTF-8 text: one clear error, not an exception.
  testing::GgufWriter bad;
  bad.String("general.architecture", "llama");
  bad.String("tokenizer.ggml.model", "gpt2");
  bad.Strings("tokenizer.ggml.tokens", {"a", "b", "\xE2"});
  bad.Strings("tokenizer.ggml.merges", {"a b"});
  auto refused = LoadTokenizer(Write("bad_vocab.gguf", bad.Build()));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("UTF-8"), std::string::npos) << refused.status();
}

}  // namespace
}  // namespace tandem
