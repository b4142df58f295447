// Every loader rejects truncated and corrupted files with an error, never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "engine/loaders/model_writer.h"
#include "engine/model.h"
#include "formats/safetensors.h"
#include "tests/test_util.h"
#include "text/llama2c_tokenizer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string Bytes(const std::string& path) { return *ReadFileToString(path); }

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override { backend_ = MakeCpuBackend(); }
  absl::Status LoadModel(const std::string& path) {
    return Model::Load(path, backend_.get()).status();
  }
  testing::TempDir tmp_;
  std::unique_ptr<Backend> backend_;
};

TEST_F(LoaderTest, Llama2cTruncatedAndCorrupt) {
  const std::string good = Bytes(testing::Stories260K());
  const std::string p = tmp_.path() + "/m.bin";
  for (size_t len : {size_t{0}, size_t{10}, size_t{28}, good.size() / 2, good.size() - 1}) {
    ASSERT_TRUE(WriteStringToFile(p, good.substr(0, len)).ok());
    const auto s = LoadModel(p);
    EXPECT_FALSE(s.ok()) << len;
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  }
  ASSERT_TRUE(WriteStringToFile(p, good + "xxxx").ok());
  EXPECT_FALSE(LoadModel(p).ok());
  // Header fields: zero, negative, absurd, inconsistent.
  const int32_t bad_values[] = {0, -5, 1 << 30, 3};
  for (int field = 0; field < 7; ++field) {
    for (int32_t v : bad_values) {
      std::string b = good;
      std::memcpy(&b[field * 4], &v, 4);
      if (b == good) continue;
      ASSERT_TRUE(WriteStringToFile(p, b).ok());
      EXPECT_FALSE(LoadModel(p).ok()) << "field " << field << " = " << v;
    }
  }
  EXPECT_EQ(LoadModel(tmp_.path() + "/missing.bin").code(), absl::StatusCode::kNotFound);
}

// A text file named .gguf is said to be no GGUF file, by its path; a llama2.c checkpoint under
// any other name still loads as one.
TEST_F(LoaderTest, GgufNameWithoutGgufMagicIsNamed) {
  for (const std::string name : {"model.gguf", "MODEL.GGUF"}) {
    const std::string p = tmp_.path() + "/" + name;
    ASSERT_TRUE(WriteStringToFile(p, "<html>404 Not Found</html>\n").ok());
    for (const absl::Status& s : {LoadModel(p), LoadModelConfig(p).status()}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find(p + ": not a GGUF file (bad magic"), std::string::npos) << s;
      EXPECT_EQ(s.message().find("llama2.c"), std::string::npos) << s;
    }
  }
  const std::string bin = tmp_.path() + "/stories.bin";
  ASSERT_TRUE(WriteStringToFile(bin, Bytes(testing::Stories260K())).ok());
  EXPECT_TRUE(LoadModel(bin).ok());
}

TEST_F(LoaderTest, SafetensorsCorruptions) {
  const std::string dir = tmp_.path() + "/hf";
  ASSERT_TRUE(ConvertLlama2cToHf(testing::Stories260K(), dir).ok());
  ASSERT_TRUE(LoadModel(dir).ok());
  const std::string st = dir + "/model.safetensors";
  const std::string good = Bytes(st);
  uint64_t header_len;
  std::memcpy(&header_len, good.data(), 8);
  auto try_bytes = [&](const std::string& b, const char* what) {
    ASSERT_TRUE(WriteStringToFile(st, b).ok());
    EXPECT_FALSE(LoadModel(dir).ok()) << what;
  };
  try_bytes(good.substr(0, 4), "shorter than the length field");
  try_bytes(good.substr(0, 8 + header_len / 2), "truncated header");
  try_bytes(good.substr(0, good.size() - 100), "truncated data");
  std::string b = good;
  const uint64_t huge = ~uint64_t{0};
  std::memcpy(&b[0], &huge, 8);
  try_bytes(b, "huge header length");
  b = good;
  b[8] = '[';
  try_bytes(b, "header not an object");
  b = good;
  const size_t pos = b.find("\"F32\"");
  ASSERT_NE(pos, std::string::npos);
  b.replace(pos, 5, "\"I64\"");
  try_bytes(b, "a required tensor with an unusable dtype");
  // Random byte flips inside the header never crash.
  std::mt19937 rng(1);
  for (int i = 0; i < 200; ++i) {
    b = good;
    b[8 + rng() % header_len] = static_cast<char>(rng());
    ASSERT_TRUE(WriteStringToFile(st, b).ok());
    (void)LoadModel(dir);
  }
  ASSERT_TRUE(WriteStringToFile(st, good).ok());
  ASSERT_TRUE(LoadModel(dir).ok());
}

// Found by safetensors_fuzzer: after a zero dimension any later one passed the size check, so
// 2^64 - 1 became a shape entry of -1.
TEST_F(LoaderTest, SafetensorsHugeDimensionAfterZero) {
  auto file_with = [](const std::string& header) {
    std::string bytes(8, '\0');
    const uint64_t len = header.size();
    std::memcpy(bytes.data(), &len, 8);
    return MappedFile::FromString("t.safetensors", bytes + header);
  };
  auto st = ParseSafetensors(file_with(
      R"({"a": {"dtype": "F32", "shape": [0, 18446744073709551615], "data_offsets": [0, 0]}})"));
  EXPECT_EQ(st.status().code(), absl::StatusCode::kDataLoss) << st.status();
  EXPECT_NE(st.status().message().find("\"a\""), std::string::npos) << st.status();
  st = ParseSafetensors(
      file_with(R"({"a": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]}})"));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->tensors.at("a").shape, (std::vector<int64_t>{0, 3}));
}

TEST_F(LoaderTest, ConfigErrors) {
  const std::string dir = tmp_.path() + "/hf";
  ASSERT_TRUE(ConvertLlama2cToHf(testing::Stories260K(), dir).ok());
  const std::string cfg = Bytes(dir + "/config.json");
  auto with = [&](const std::string& text) {
    EXPECT_TRUE(WriteStringToFile(dir + "/config.json", text).ok());
    return LoadModel(dir);
  };
  EXPECT_FALSE(with("{not json").ok());
  EXPECT_FALSE(with("[]").ok());
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string c = cfg;
    const size_t p = c.find(from);
    EXPECT_NE(p, std::string::npos) << from;
    c.replace(p, from.size(), to);
    return with(c);
  };
  auto s = replaced("\"LlamaForCausalLM\"", "\"GPT2LMHeadModel\"");
  EXPECT_NE(s.message().find("unsupported architecture"), std::string::npos) << s;
  EXPECT_FALSE(replaced("\"num_attention_heads\": 8", "\"num_attention_heads\": 3").ok());
  EXPECT_FALSE(replaced("\"hidden_size\": 64", "\"hidden_size\": 65").ok());
  EXPECT_FALSE(replaced("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"").ok());
  EXPECT_FALSE(replaced("\"vocab_size\": 512", "\"vocab_size\": \"x\"").ok());
  // Found by hf_config_fuzzer: a field of the wrong JSON type read with json::value() threw,
  // and the uncaught exception aborted the process. Each is now an error naming the field.
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"model_type\": \"llama\"", "\"model_type\": 16"},
           {"\"tie_word_embeddings\": true", "\"tie_word_embeddings\": \"yes\""},
           {"\"model_type\": \"llama\"", "\"model_type\": \"llama\", \"use_sliding_window\": 1"},
           {"\"model_type\": \"llama\"",
            "\"model_type\": \"llama\", \"rope_scaling\": {\"type\": 2}"},
           {"\"model_type\": \"llama\"",
            "\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": [], \"factor\": 2}"}}) {
    s = replaced(from, to);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << to << ": " << s;
  }
  // An EOS id outside int32 no longer wraps into a valid one (4294967298 would become 2).
  EXPECT_FALSE(replaced("\"model_type\": \"llama\"",
                        "\"model_type\": \"llama\", "
                        "\"eos_token_id\": 4294967298")
                   .ok());
  std::filesystem::remove(dir + "/config.json");
  EXPECT_EQ(LoadModel(dir).code(), absl::StatusCode::kNotFound);
}

TEST_F(LoaderTest, ShardIndexErrors) {
  const std::string dir = tmp_.path() + "/hf";
  ASSERT_TRUE(ConvertLlama2cToHf(testing::Stories260K(), dir).ok());
  fs::rename(dir + "/model.safetensors", dir + "/part.safetensors");
  ASSERT_TRUE(WriteStringToFile(dir + "/model.safetensors.index.json",
                                R"({"weight_map": {"model.norm.weight": "part.safetensors"}})")
                  .ok());
  EXPECT_TRUE(LoadModel(dir).ok());
  ASSERT_TRUE(WriteStringToFile(dir + "/model.safetensors.index.json",
                                R"({"weight_map": {"a": "../../etc/passwd"}})")
                  .ok());
  EXPECT_FALSE(LoadModel(dir).ok());
  ASSERT_TRUE(WriteStringToFile(dir + "/model.safetensors.index.json",
                                R"({"weight_map": {"a": "missing.safetensors"}})")
                  .ok());
  EXPECT_FALSE(LoadModel(dir).ok());
  ASSERT_TRUE(WriteStringToFile(dir + "/model.safetensors.index.json", "{}").ok());
  EXPECT_FALSE(LoadModel(dir).ok());
}

TEST_F(LoaderTest, Llama2cTokenizerCorruptions) {
  const std::string good = Bytes(testing::Tok512());
  const std::string p = tmp_.path() + "/tok.bin";
  for (size_t len : {size_t{0}, size_t{3}, size_t{100}, good.size() - 1}) {
    ASSERT_TRUE(WriteStringToFile(p, good.substr(0, len)).ok());
    EXPECT_FALSE(Llama2cTokenizer::Load(p, 512).ok()) << len;
  }
  std::string b = good;
  const int32_t neg = -1;
  std::memcpy(&b[4 + 4], &neg, 4);  // first entry's length
  ASSERT_TRUE(WriteStringToFile(p, b).ok());
  EXPECT_FALSE(Llama2cTokenizer::Load(p, 512).ok());
  ASSERT_TRUE(WriteStringToFile(p, good).ok());
  EXPECT_FALSE(Llama2cTokenizer::Load(p, 1000).ok());  // does not match the model
  EXPECT_TRUE(Llama2cTokenizer::Load(p, 512).ok());
}

TEST_F(LoaderTest, RandomModelRoundTrips) {
  for (const char* dt : {"f32", "bf16", "f16"}) {
    const std::string dir = tmp_.path() + "/rand_" + dt;
    auto c = RandomModelConfig("stories260K");
    ASSERT_TRUE(c.ok());
    const DType dtype = std::string(dt) == "f32"    ? DType::kF32
                        : std::string(dt) == "bf16" ? DType::kBF16
                                                    : DType::kF16;
    ASSERT_TRUE(WriteRandomModel(*c, dtype, 1, dir).ok());
    auto m = Model::Load(dir, backend_.get());
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->weights().token_embedding.dtype, dtype);
    EXPECT_EQ((*m)->config().dim, 64);
  }
  EXPECT_FALSE(RandomModelConfig("GPT-5").ok());
}

}  // namespace
}  // namespace tandem
