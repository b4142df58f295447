// The default decode KV budget (engine/kv/kv_budget.h): cgroup limits and /proc/meminfo as the
// kernel writes them, the fraction less the weights, and the weights of a loaded model.
#include "engine/kv/kv_budget.h"

#include <gtest/gtest.h>

#include "engine/model.h"
#include "kernels/backend.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

TEST(KvBudgetTest, CgroupLimitsAndMemTotal) {
  EXPECT_EQ(ParseCgroupMemoryLimit("max\n"), std::nullopt);                  // v2, no limit
  EXPECT_EQ(ParseCgroupMemoryLimit("8589934592\n"), int64_t{8} << 30);       // v2 / v1
  EXPECT_EQ(ParseCgroupMemoryLimit("9223372036854771712\n"), std::nullopt);  // v1, no limit
  EXPECT_EQ(ParseCgroupMemoryLimit(""), std::nullopt);
  EXPECT_EQ(ParseCgroupMemoryLimit("0"), std::nullopt);
  EXPECT_EQ(ParseCgroupMemoryLimit("lots"), std::nullopt);
  const char meminfo[] =
      "MemFree:         1234 kB\n"
      "MemTotal:       25165824 kB\n"
      "MemAvailable:   20000000 kB\n";
  EXPECT_EQ(ParseMemTotal(meminfo), int64_t{24} << 30);
  EXPECT_EQ(ParseMemTotal("MemFree: 1 kB\n"), std::nullopt);
  EXPECT_EQ(ParseMemTotal("MemTotal: 12 MB\n"), std::nullopt);
  // This machine: something between a few MiB and a few TiB.
  auto host = HostMemoryBytes();
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_GT(*host, int64_t{64} << 20);
  EXPECT_LT(*host, int64_t{1} << 45);
}

TEST(KvBudgetTest, FractionLessTheWeights) {
  EXPECT_EQ(KvBytesFromFraction(0.5, int64_t{16} << 30, int64_t{2} << 30), int64_t{6} << 30);
  EXPECT_EQ(KvBytesFromFraction(0.1, int64_t{16} << 30, int64_t{4} << 30), 0);
  EXPECT_EQ(KvBytesFromFraction(1.0, 1000, 0), 1000);
}

TEST(KvBudgetTest, WeightBytesOfALoadedModel) {
  auto backend = MakeCpuBackend(1);
  auto model = Model::Load(testing::Stories260K(), backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  // stories260K in f32, tied classifier: embedding, 7 matrices and 2 norms a layer, the final
  // norm.
  const int64_t per_layer = int64_t{c.dim} * (c.n_heads * c.head_dim) * 2 +
                            int64_t{c.dim} * (c.n_kv_heads * c.head_dim) * 2 +
                            int64_t{3} * c.dim * c.hidden_dim + 2 * c.dim;
  const int64_t want = 4 * (int64_t{c.vocab_size} * c.dim + c.n_layers * per_layer + c.dim);
  EXPECT_EQ(WeightBytes((*model)->config(), (*model)->weights()), want);
}

}  // namespace
}  // namespace tandem
