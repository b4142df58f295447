// `tandem bench` against a real local cluster: the accounting adds up and the token counts are
// what the requests asked for.
#include <gtest/gtest.h>

#include "tests/metrics/metrics_text.h"
#include "tests/serving/cluster.h"
#include "tools/bench_runner.h"

namespace tandem {
namespace {

TEST(BenchIntegrationTest, OpenLoopAccountingAddsUp) {
  testing::Cluster cluster(1, 1);
  ASSERT_TRUE(cluster.ready());
  bench::BenchConfig c;
  c.router = cluster.router();
  c.rate = 40;
  c.num_requests = 30;
  c.warmup = 2;
  c.input_len = "uniform:8:64";
  c.output_len = "16";
  c.seed = 3;
  c.progress = false;
  c.slo = {10.0, 1.0};
  auto run = bench::RunBench(c);
  ASSERT_TRUE(run.ok()) << run.status();
  const auto& s = run->summary;
  EXPECT_EQ(s.sent, 30);
  EXPECT_EQ(s.completed + s.rejected_total + s.failed, s.sent);
  EXPECT_EQ(s.completed, 30);
  EXPECT_EQ(s.output_tokens, 30 * 16);
  EXPECT_EQ(s.ttft.count, 30);
  EXPECT_GT(s.request_throughput, 0);
  EXPECT_DOUBLE_EQ(s.slo_attainment, 1.0);  // generous SLOs on a tiny model
  EXPECT_EQ(run->records.size(), 32u);      // warm-up records are kept, marked
  EXPECT_TRUE(cluster.AllBlocksFree());
  // The servers saw what the bench measured: the router's token counters (warm-up included)
  // equal the tokens the bench received and the prompts it sent.
  int64_t streamed = 0, prompts = 0;
  for (const auto& r : run->records) {
    streamed += r.output_tokens;
    prompts += r.prompt_tokens;
  }
  const auto samples = testing::Scrape(cluster.metrics()[0]);
  EXPECT_EQ(testing::MetricValue(samples, "tandem_generation_tokens_total", {{"role", "router"}}),
            static_cast<double>(streamed));
  EXPECT_EQ(testing::MetricValue(samples, "tandem_prompt_tokens_total", {{"role", "router"}}),
            static_cast<double>(prompts));
  EXPECT_EQ(testing::MetricValue(samples, "tandem_requests_total", {{"status", "OK"}}), 32.0);
}

TEST(BenchIntegrationTest, ClosedLoopWithOverloadCountsRejections) {
  // A decode worker with room for few requests and a router that queues none of the rest:
  // they are refused, and counted as such.
  testing::Cluster cluster(1, 1, {"--num-blocks", "40", "--max-running", "2"},
                           {"--max-queued", "0"});
  ASSERT_TRUE(cluster.ready());
  bench::BenchConfig c;
  c.router = cluster.router();
  c.concurrency = 12;
  c.num_requests = 48;
  c.input_len = "100";
  c.output_len = "100";
  c.progress = false;
  auto run = bench::RunBench(c);
  ASSERT_TRUE(run.ok()) << run.status();
  const auto& s = run->summary;
  EXPECT_EQ(s.sent, 48);
  EXPECT_EQ(s.completed + s.rejected_total + s.failed, s.sent);
  EXPECT_GT(s.completed, 0);
  EXPECT_GT(s.rejected_total, 0);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.output_tokens, static_cast<int64_t>(s.completed) * 100);
  EXPECT_TRUE(cluster.AllBlocksFree());
}

// --max-tokens: requests declare a limit far above their length and the client ends each
// stream at its length. Every request counts as complete with exactly its tokens, and the
// servers free what the cancelled streams held. Against a decode worker that reserves
// prompt + max_tokens at admission (--kv-admission=reserve) the same workload still completes,
// a few sequences at a time.
TEST(BenchIntegrationTest, RequestsThatEndBeforeTheirLimit) {
  for (const char* admission : {"on-demand", "reserve"}) {
    SCOPED_TRACE(admission);
    testing::Cluster cluster(1, 1, {"--num-blocks", "48", "--kv-admission", admission});
    ASSERT_TRUE(cluster.ready());
    bench::BenchConfig c;
    c.router = cluster.router();
    c.concurrency = 8;
    c.num_requests = 16;
    c.input_len = "20";
    c.output_len = "uniform:4:12";
    c.max_tokens = 200;
    c.seed = 5;
    c.progress = false;
    auto run = bench::RunBench(c);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->summary.completed, 16);
    EXPECT_EQ(run->summary.failed, 0);
    EXPECT_EQ(run->config.ToJson()["max_tokens"], 200);
    for (const auto& r : run->records) {
      EXPECT_TRUE(r.ok()) << r.status_message;
      EXPECT_GE(r.output_tokens, 4);
      EXPECT_LE(r.output_tokens, 12);
    }
    EXPECT_TRUE(cluster.AllBlocksFree());
  }
}

}  // namespace
}  // namespace tandem
