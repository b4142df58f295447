// The simulator: deterministic for a seed; with zero-cost steps it makes exactly the batching
// decisions of the schedulers driven directly; prefix hits, rejections, processor sharing and
// the layout search behave.
#include "planner/simulator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/loaders/model_writer.h"
#include "engine/scheduling/scheduler.h"
#include "planner/plan.h"

namespace tandem::planner {
namespace {

ModelConfig Stories260K() { return *RandomModelConfig("stories260K"); }  // context 512

HardwareProfile H100() { return *LoadProfile("h100-sxm"); }

std::vector<int> Prompt(int len, std::mt19937_64& rng) {
  return bench::RandomPrompt(len, 512, rng);
}

bench::BenchConfig Workload(double rate, uint64_t seed) {
  bench::BenchConfig w;
  w.rate = rate;
  w.num_requests = 150;
  w.warmup = 4;
  w.input_len = "uniform:16:300";
  w.output_len = "uniform:2:100";
  w.seed = seed;
  w.slo = {0.05, 0.002};
  return w;
}

TEST(Simulator, SameSeedSameRunDifferentSeedDifferentRun) {
  ClusterSpec c;
  c.prefill = 1;
  c.decode = 2;
  auto a = Simulate(Stories260K(), H100(), c, Workload(200, 3));
  auto b = Simulate(Stories260K(), H100(), c, Workload(200, 3));
  auto other = Simulate(Stories260K(), H100(), c, Workload(200, 4));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok() && other.ok());
  ASSERT_EQ(a->records.size(), 154u);
  ASSERT_EQ(a->records.size(), b->records.size());
  for (size_t i = 0; i < a->records.size(); ++i) {
    const auto &x = a->records[i], &y = b->records[i];
    EXPECT_EQ(x.sent, y.sent);
    EXPECT_EQ(x.first_token, y.first_token);
    EXPECT_EQ(x.done, y.done);
    EXPECT_EQ(x.token_times, y.token_times);
    EXPECT_EQ(x.output_tokens, y.output_tokens);
    EXPECT_EQ(x.status_code, y.status_code);
  }
  EXPECT_EQ(a->events, b->events);
  EXPECT_EQ(bench::ToJson(a->summary), bench::ToJson(b->summary));
  EXPECT_NE(bench::ToJson(a->summary), bench::ToJson(other->summary));
  // Every request ran to its length, as `tandem bench` asks (ignore_eos).
  EXPECT_EQ(a->summary.completed, 150);
  EXPECT_EQ(a->summary.rejected_total, 0);
}

// Groups of requests sent at the same instant, the groups far apart.
std::vector<TimedRequest> Groups(const std::vector<std::vector<std::pair<int, int>>>& groups,
                                 uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<TimedRequest> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& [prompt, output] : groups[g]) {
      out.push_back({static_cast<double>(g), Prompt(prompt, rng), output});
    }
  }
  return out;
}

TEST(Simulator, ZeroCostPrefillBatchesAreTheSchedulers) {
  // Prompt lengths around the chunk (512 context: up to 511) and the budget, so steps chunk
  // long prompts, share the budget, and hit the batch limit.
  ClusterSpec c;
  c.prefill_scheduler = {/*token_budget=*/600, /*chunk_size=*/256, /*max_batch=*/3};
  c.prefix_cache = false;
  const std::vector<std::vector<std::pair<int, int>>> groups = {
      {{100, 2}},
      {{509, 3}, {40, 2}, {300, 2}, {17, 5}, {256, 2}},
      {{257, 2}, {255, 2}, {8, 2}, {9, 2}, {10, 2}, {480, 2}, {1, 2}},
      {{200, 4}, {200, 4}, {200, 4}, {200, 4}}};
  SimOptions o;
  o.zero_cost = true;
  o.record_steps = true;
  auto r = SimulateRequests(Stories260K(), H100(), c, Groups(groups, 1), {}, o);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::vector<PrefillScheduler::Work>> simulated;
  for (const auto& s : r->steps) {
    if (s.prefill) simulated.push_back(s.work);
  }
  // The scheduler driven directly: each group added in order, then steps until it drains.
  PrefillScheduler direct(c.prefill_scheduler);
  std::vector<std::vector<PrefillScheduler::Work>> expected;
  uint64_t id = 1;
  for (const auto& g : groups) {
    for (const auto& [prompt, output] : g) ASSERT_TRUE(direct.Add(id++, prompt, 0).ok());
    while (!direct.empty()) expected.push_back(direct.Schedule());
  }
  ASSERT_EQ(simulated.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(simulated[i].size(), expected[i].size()) << "step " << i;
    for (size_t j = 0; j < expected[i].size(); ++j) {
      EXPECT_EQ(simulated[i][j].id, expected[i][j].id) << "step " << i;
      EXPECT_EQ(simulated[i][j].start, expected[i][j].start);
      EXPECT_EQ(simulated[i][j].count, expected[i][j].count);
      EXPECT_EQ(simulated[i][j].last, expected[i][j].last);
    }
  }
  // With no time passing, every token arrives the instant its request is sent.
  for (const auto& rec : r->records) {
    EXPECT_EQ(rec.first_token, rec.sent);
    EXPECT_EQ(rec.done, rec.sent);
  }
}

TEST(Simulator, ZeroCostDecodeBatchesAreTheSchedulers) {
  // Each group fits in one prefill step (default budget 2048, batch 64), so all its requests
  // start decoding together; outputs differ, so they leave the batch at different steps.
  ClusterSpec c;
  c.block_size = 16;
  c.max_running = 6;  // the admission limit turns some requests away
  c.max_queued = 0;   // at once: no line to wait in
  const std::vector<std::vector<std::pair<int, int>>> groups = {
      {{20, 5}, {33, 2}, {64, 9}},
      {{10, 3}, {10, 7}, {50, 4}, {5, 6}, {300, 2}, {7, 3}, {8, 8}, {9, 2}},
      {{100, 12}}};
  SimOptions o;
  o.zero_cost = true;
  o.record_steps = true;
  const ModelConfig model = Stories260K();
  auto r = SimulateRequests(model, H100(), c, Groups(groups, 2), {}, o);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::vector<uint64_t>> simulated;
  for (const auto& s : r->steps) {
    if (!s.prefill) simulated.push_back(s.batch);
  }
  // Direct: the simulator's decode worker has as many blocks as the H100's memory holds.
  const CostModel cost(model, H100());
  const int blocks = static_cast<int>(
      std::min(std::floor(cost.KvCapacityBytes() / (cost.KvBytesPerToken() * 16)), 4194304.0));
  DecodeScheduler direct(blocks, 16, c.max_running);
  std::vector<std::vector<uint64_t>> expected;
  std::vector<int> left(64, 0);
  std::vector<int> rejected;
  uint64_t id = 1;
  for (const auto& g : groups) {
    std::vector<uint64_t> admitted;
    for (const auto& [prompt, output] : g) {
      if (direct.Admit(id, prompt, prompt + output).ok()) {
        admitted.push_back(id);
        left[id] = output - 1;  // the prefill samples the first token
      } else {
        rejected.push_back(static_cast<int>(id));
      }
      ++id;
    }
    for (uint64_t a : admitted) ASSERT_TRUE(direct.Start(a).ok());
    while (!direct.running().empty()) {
      const DecodeScheduler::Step step = direct.Schedule();
      std::vector<uint64_t> batch;
      for (const auto& w : step.work) batch.push_back(w.id);
      expected.push_back(batch);
      direct.Complete(step);
      for (const auto& w : step.work) {
        if (w.sample && --left[w.id] == 0) direct.Release(w.id);
      }
    }
  }
  EXPECT_TRUE(direct.Idle());
  EXPECT_EQ(simulated, expected);
  ASSERT_EQ(rejected, (std::vector<int>{10, 11}));  // the 7th and 8th of the second group
  for (int i : rejected) EXPECT_EQ(r->records[i - 1].status_code, 8);  // RESOURCE_EXHAUSTED
  EXPECT_EQ(r->summary.rejected_total, 2);
  EXPECT_EQ(r->summary.completed, 10);
}

TEST(Simulator, PrefixCacheHitsSkipComputedBlocks) {
  ClusterSpec c;
  c.block_size = 16;
  std::mt19937_64 rng(5);
  const std::vector<int> shared = Prompt(100, rng);
  std::vector<TimedRequest> reqs = {{0, shared, 2}, {1, shared, 2}};
  reqs[1].prompt.push_back(77);  // 101 tokens: the first 6 full blocks (96) are cached
  SimOptions o;
  o.zero_cost = true;
  o.record_steps = true;
  auto r = SimulateRequests(Stories260K(), H100(), c, reqs, {}, o);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<PrefillScheduler::Work> works;
  for (const auto& s : r->steps) {
    if (s.prefill) works.insert(works.end(), s.work.begin(), s.work.end());
  }
  ASSERT_EQ(works.size(), 2u);
  EXPECT_EQ(works[0].start, 0);
  EXPECT_EQ(works[0].count, 100);
  EXPECT_EQ(works[1].start, 96);
  EXPECT_EQ(works[1].count, 5);
}

TEST(Simulator, SharedHostWorkersSlowEachOtherDown) {
  // The same cluster on one shared device (a CPU) and on separate ones: a decode stream
  // running while long prompts are prefilled is slower when the two share the device.
  HardwareProfile own = *LoadProfile("l40s");
  HardwareProfile shared = own;
  shared.shared_host = true;
  ClusterSpec c;
  c.prefill_kv_bytes = c.decode_kv_bytes = 16.0 * (1 << 30);  // room for every request
  std::mt19937_64 rng(9);
  std::vector<TimedRequest> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back({0.001 * i, Prompt(2000, rng), 10});
  const ModelConfig llama = *RandomModelConfig("Llama-2-7B");
  auto a = SimulateRequests(llama, own, c, reqs, {});
  auto b = SimulateRequests(llama, shared, c, reqs, {});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_GT(b->summary.tpot.mean, 1.2 * a->summary.tpot.mean);
  EXPECT_GT(b->summary.ttft.mean, a->summary.ttft.mean);
}

TEST(Simulator, TokenRelayCompetesForASharedHost) {
  // On a shared host the router's relay of each token takes CPU: tokens reach the clients at
  // the relay's pace, which falls with the number of streams.
  HardwareProfile host = *LoadProfile("l40s");
  host.shared_host = true;
  ClusterSpec c;
  c.prefill_kv_bytes = c.decode_kv_bytes = 1 << 30;
  std::mt19937_64 rng(4);
  std::vector<TimedRequest> reqs;
  for (int i = 0; i < 16; ++i) reqs.push_back({0, Prompt(32, rng), 50});
  const ModelConfig model = *RandomModelConfig("stories15M");
  auto quiet = SimulateRequests(model, host, c, reqs, {});
  host.relay_cpu = 1e-3;
  auto busy = SimulateRequests(model, host, c, reqs, {});
  ASSERT_TRUE(quiet.ok() && busy.ok());
  // 16 streams cost 16 ms of relay per token of each: the clients get their tokens at the
  // relay's pace, not the decode worker's (which is done long before).
  EXPECT_LT(quiet->summary.tpot.mean, 2e-3);
  EXPECT_GT(busy->summary.tpot.mean, 15e-3);
  EXPECT_LT(busy->summary.tpot.mean, 40e-3);
  // On separate hosts the relay costs nothing of the workers'.
  host.shared_host = false;
  auto apart = SimulateRequests(model, host, c, reqs, {});
  ASSERT_TRUE(apart.ok());
  EXPECT_LT(apart->summary.tpot.mean, quiet->summary.tpot.mean * 1.0001);
}

TEST(Simulator, DecodeStartDelaysTheSecondToken) {
  // The router's start message: the decode worker begins a request that long after its first
  // token (latency on a GPU profile), and the second token comes that much later.
  HardwareProfile p = H100();
  std::mt19937_64 rng(2);
  std::vector<TimedRequest> reqs = {{0, Prompt(64, rng), 8}};
  auto base = SimulateRequests(Stories260K(), p, ClusterSpec(), reqs, {});
  p.decode_start_overhead = 5e-3;
  auto later = SimulateRequests(Stories260K(), p, ClusterSpec(), reqs, {});
  ASSERT_TRUE(base.ok() && later.ok());
  const auto& a = base->records[0].token_times;
  const auto& b = later->records[0].token_times;
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  EXPECT_NEAR(b[0], a[0], 1e-12);
  EXPECT_NEAR(b[1] - a[1], 5e-3, 1e-9);
  EXPECT_NEAR(b[7] - b[1], a[7] - a[1], 1e-9);
}

TEST(Simulator, DecodeStartJitterOnlyWakesAnIdleDecodeLoop) {
  // A decode loop asleep (no running request) picks a new request up late by the decode-start
  // jitter; one already stepping takes it at its next step. Request 0 starts alone and decodes
  // for about 20 s (400 steps of 50 ms); requests 1-10 get their first token in the middle of
  // that, request 11 long after.
  HardwareProfile p = H100();
  p.step_overhead = 0.05;
  std::mt19937_64 rng(3);
  std::vector<TimedRequest> reqs = {{0, Prompt(32, rng), 400}};
  for (int i = 1; i <= 10; ++i) reqs.push_back({4.0 + i, Prompt(32, rng), 4});
  reqs.push_back({100, Prompt(32, rng), 4});
  auto base = SimulateRequests(Stories260K(), p, ClusterSpec(), reqs, {});
  p.decode_start_jitter = 0.5;  // a mean of ten steps
  auto jittered = SimulateRequests(Stories260K(), p, ClusterSpec(), reqs, {});
  ASSERT_TRUE(base.ok() && jittered.ok());
  auto gap = [](const SimResult& r, int i) {
    const auto& t = r.records[i].token_times;
    return t[1] - t[0];
  };
  double joined_base = 0, joined = 0;
  for (int i = 1; i <= 10; ++i) {
    for (const SimResult* r : {&*base, &*jittered}) {  // they join a running loop
      ASSERT_GT(r->records[i].first_token, r->records[0].token_times[1]);
      ASSERT_LT(r->records[i].first_token, r->records[0].done);
    }
    joined_base += gap(*base, i);
    joined += gap(*jittered, i);
  }
  // Joining: at most a step later each (the loop's phase differs between the runs); ten draws
  // of the jitter would add about 5 s.
  EXPECT_LT(joined, joined_base + 10 * 0.05);
  // Waking: requests 0 and 11 find the loop asleep and pay the jitter.
  EXPECT_GT(gap(*jittered, 0) + gap(*jittered, 11), gap(*base, 0) + gap(*base, 11) + 1e-3);
}

TEST(Simulator, RequestJitterSpreadsLatencyDeterministically) {
  // Fixed lengths at concurrency 1 leave no spread of their own; the request path's jitter
  // gives TTFT a p50-p90 spread of about ln 5 times its mean, the same for the same seed.
  HardwareProfile p = H100();
  p.request_jitter = 2e-3;
  bench::BenchConfig w;
  w.concurrency = 1;
  w.num_requests = 400;
  w.input_len = "64";
  w.output_len = "4";
  w.seed = 5;
  auto a = Simulate(Stories260K(), p, ClusterSpec(), w);
  auto b = Simulate(Stories260K(), p, ClusterSpec(), w);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->summary.ttft.p90, b->summary.ttft.p90);
  const double spread = a->summary.ttft.p90 - a->summary.ttft.p50;
  EXPECT_NEAR(spread, 2e-3 * std::log(5.0), 0.6e-3);
  p.request_jitter = 0;
  auto none = Simulate(Stories260K(), p, ClusterSpec(), w);
  ASSERT_TRUE(none.ok());
  EXPECT_NEAR(none->summary.ttft.p90, none->summary.ttft.p50, 1e-9);
}

TEST(Simulator, StepJitterSpreadsTpotAroundTheSameMean) {
  // Identical requests one at a time have one TPOT; step noise (mean one) spreads it without
  // moving the mean.
  HardwareProfile p = H100();
  bench::BenchConfig w;
  w.concurrency = 1;
  w.num_requests = 200;
  w.input_len = "64";
  w.output_len = "32";
  w.seed = 8;
  auto flat = Simulate(Stories260K(), p, ClusterSpec(), w);
  p.step_jitter = 0.5;
  auto noisy = Simulate(Stories260K(), p, ClusterSpec(), w);
  auto again = Simulate(Stories260K(), p, ClusterSpec(), w);
  ASSERT_TRUE(flat.ok() && noisy.ok() && again.ok());
  EXPECT_NEAR(flat->summary.tpot.p90, flat->summary.tpot.p50, 1e-9);
  EXPECT_GT(noisy->summary.tpot.p90, 1.05 * noisy->summary.tpot.p50);
  EXPECT_NEAR(noisy->summary.tpot.mean, flat->summary.tpot.mean, 0.05 * flat->summary.tpot.mean);
  EXPECT_EQ(noisy->summary.tpot.p90, again->summary.tpot.p90);
}

TEST(Simulator, PrefillStepJitterSpreadsOnlyThePrefillSteps) {
  // Requests far apart (none meets another) of one shape: without noise every TTFT is the same,
  // and every TPOT. The prefill steps' own sigma spreads TTFT and leaves TPOT; the step jitter
  // alone (prefill_step_jitter negative: the same) spreads both; the decode steps' alone
  // (prefill_step_jitter 0) only TPOT.
  HardwareProfile p = H100();
  std::mt19937_64 rng(8);
  std::vector<TimedRequest> reqs;
  for (int i = 0; i < 40; ++i) reqs.push_back({1.0 * i, Prompt(64, rng), 16});
  auto spread = [](const bench::Percentiles& s) { return s.p90 - s.p50; };
  p.prefill_step_jitter = 0.5;
  auto prefill_only = SimulateRequests(Stories260K(), p, ClusterSpec(), reqs, {});
  p.step_jitter = 0.5;
  p.prefill_step_jitter = -1;
  auto both = SimulateRequests(Stories260K(), p, ClusterSpec(), reqs, {});
  p.prefill_step_jitter = 0;
  auto decode_only = SimulateRequests(Stories260K(), p, ClusterSpec(), reqs, {});
  ASSERT_TRUE(prefill_only.ok() && both.ok() && decode_only.ok());
  EXPECT_GT(spread(prefill_only->summary.ttft), 0.1 * prefill_only->summary.ttft.p50);
  EXPECT_NEAR(spread(prefill_only->summary.tpot), 0, 1e-12);
  EXPECT_GT(spread(both->summary.ttft), 0.1 * both->summary.ttft.p50);
  EXPECT_GT(spread(both->summary.tpot), 0.01 * both->summary.tpot.p50);
  EXPECT_NEAR(spread(decode_only->summary.ttft), 0, 1e-12);
  EXPECT_GT(spread(decode_only->summary.tpot), 0.01 * decode_only->summary.tpot.p50);
}

TEST(Simulator, RunsDrawTheirOwnNoiseOverTheSameRequests) {
  // A noisy profile: every run of SimulateRuns sends the same requests (lengths, arrivals) and
  // draws its own jitter; MeanSummary is the runs' mean figure by figure. Without noise every
  // run is the same run.
  HardwareProfile p = H100();
  p.step_jitter = 0.4;
  p.request_jitter = 1e-3;
  ASSERT_TRUE(HasNoise(p));
  bench::BenchConfig w;
  w.rate = 20;
  w.num_requests = 60;
  w.input_len = "uniform:16:200";
  w.output_len = "uniform:4:40";
  w.seed = 5;
  auto runs = SimulateRuns(Stories260K(), p, ClusterSpec(), w, 4);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 4u);
  double ttft = 0, tpot = 0;
  for (const SimResult& r : *runs) {
    ASSERT_EQ(r.records.size(), (*runs)[0].records.size());
    for (size_t i = 0; i < r.records.size(); ++i) {
      EXPECT_EQ(r.records[i].prompt_tokens, (*runs)[0].records[i].prompt_tokens);
    }
    ttft += r.summary.ttft.p50 / 4;
    tpot += r.summary.tpot.p90 / 4;
  }
  EXPECT_NE((*runs)[0].summary.ttft.p50, (*runs)[1].summary.ttft.p50);
  const bench::BenchSummary mean = MeanSummary(*runs);
  EXPECT_NEAR(mean.ttft.p50, ttft, 1e-12);
  EXPECT_NEAR(mean.tpot.p90, tpot, 1e-12);
  EXPECT_EQ(mean.completed, (*runs)[0].summary.completed);
  // One run keeps the workload's noise: the same as Simulate.
  auto one = SimulateRuns(Stories260K(), p, ClusterSpec(), w, 1);
  auto plain = Simulate(Stories260K(), p, ClusterSpec(), w);
  ASSERT_TRUE(one.ok() && plain.ok());
  EXPECT_EQ(MeanSummary(*one).ttft.p50, plain->summary.ttft.p50);
  // No noise: every run the same.
  p.step_jitter = p.request_jitter = 0;
  p.prefill_step_jitter = -1;
  EXPECT_FALSE(HasNoise(p));
  auto quiet = SimulateRuns(Stories260K(), p, ClusterSpec(), w, 3);
  ASSERT_TRUE(quiet.ok());
  EXPECT_EQ((*quiet)[0].summary.ttft.p90, (*quiet)[2].summary.ttft.p90);
  EXPECT_FALSE(SimulateRuns(Stories260K(), p, ClusterSpec(), w, 0).ok());
}

TEST(Simulator, SharedHostRequestPathQueues) {
  // On a shared host the request path's hops are CPU work, one at a time: four requests sent
  // together take about four times one request's hops before their first token.
  HardwareProfile p = H100();
  p.shared_host = true;
  p.request_overhead = 4e-3;  // two hops of 2 ms
  ClusterSpec c;
  c.prefill_kv_bytes = c.decode_kv_bytes = 1 << 30;
  std::mt19937_64 rng(3);
  std::vector<TimedRequest> one = {{0, Prompt(16, rng), 2}};
  std::vector<TimedRequest> four;
  for (int i = 0; i < 4; ++i) four.push_back({0, Prompt(16, rng), 2});
  auto a = SimulateRequests(Stories260K(), p, c, one, {});
  auto b = SimulateRequests(Stories260K(), p, c, four, {});
  ASSERT_TRUE(a.ok() && b.ok());
  // Each of the two hops takes 8 ms instead of 2 when four share the CPU.
  EXPECT_GT(a->summary.ttft.mean, 4e-3);
  EXPECT_NEAR(b->summary.ttft.mean - a->summary.ttft.mean, 12e-3, 1e-3);
  // On separate hosts (a GPU cluster) the hops are latency only.
  p.shared_host = false;
  auto apart = SimulateRequests(Stories260K(), p, c, four, {});
  ASSERT_TRUE(apart.ok());
  EXPECT_NEAR(apart->summary.ttft.mean, a->summary.ttft.mean, 0.3e-3);
}

// Two decode workers on a shared host (l40s's step costs), each streaming one 16-token prompt's
// 200 tokens, both sent at once.
struct TwoStreams {
  HardwareProfile profile;
  ClusterSpec cluster;
  std::vector<TimedRequest> requests;
  ModelConfig model;
};
TwoStreams TwoDecodeStreams() {
  TwoStreams t{*LoadProfile("l40s"), ClusterSpec(), {}, *RandomModelConfig("stories15M")};
  t.profile.shared_host = true;
  t.cluster.decode = 2;
  t.cluster.prefill_kv_bytes = t.cluster.decode_kv_bytes = 1 << 30;
  std::mt19937_64 rng(6);
  for (int i = 0; i < 2; ++i) t.requests.push_back({0, Prompt(16, rng), 200});
  return t;
}

TEST(Simulator, HostStepSlotsLetCalibratedWorkersRunTogether) {
  // Two decode workers each streaming one request: with one step slot they share the host and
  // each stream is half as fast; with two (what the in-situ calibration measured) each runs at
  // its calibrated speed.
  auto [p, c, reqs, model] = TwoDecodeStreams();
  auto alone = SimulateRequests(model, p, c, {reqs[0]}, {});
  auto one_slot = SimulateRequests(model, p, c, reqs, {});
  p.host_step_slots = 2;
  auto two_slots = SimulateRequests(model, p, c, reqs, {});
  ASSERT_TRUE(alone.ok() && one_slot.ok() && two_slots.ok());
  EXPECT_NEAR(two_slots->summary.tpot.mean, alone->summary.tpot.mean,
              0.02 * alone->summary.tpot.mean);
  EXPECT_GT(one_slot->summary.tpot.mean, 1.8 * alone->summary.tpot.mean);
}

TEST(Simulator, OneProcessorHostSharesItsCoresByThreads) {
  // host_cores > 0: one processor for every step, hop and relay. Two decode workers each
  // streaming one request on 2 cores: steps that keep one core busy run side by side at their
  // speed alone; steps that keep both busy share them, each stream half as fast.
  auto [p, c, reqs, model] = TwoDecodeStreams();
  p.host_cores = 2;
  SimOptions o;
  o.record_token_times = false;
  auto alone = SimulateRequests(model, p, c, {reqs[0]}, {}, o);
  auto one_thread = SimulateRequests(model, p, c, reqs, {}, o);
  p.step_threads = 2;
  auto two_threads = SimulateRequests(model, p, c, reqs, {}, o);
  ASSERT_TRUE(alone.ok() && one_thread.ok() && two_threads.ok());
  EXPECT_NEAR(one_thread->summary.tpot.mean, alone->summary.tpot.mean,
              0.02 * alone->summary.tpot.mean);
  EXPECT_NEAR(two_threads->summary.tpot.mean, 2 * alone->summary.tpot.mean,
              0.1 * alone->summary.tpot.mean);
  // The steps' time over their time alone says how much the sharing cost them.
  EXPECT_NEAR(one_thread->decode_step_seconds / one_thread->decode_step_alone_seconds, 1, 0.02);
  EXPECT_NEAR(two_threads->decode_step_seconds / two_threads->decode_step_alone_seconds, 2, 0.1);
  // The relay (one core) beside a one-core step: still room for both on 2 cores.
  p.step_threads = 1;
  p.relay_cpu = 1e-4;
  auto relayed = SimulateRequests(model, p, c, {reqs[0]}, {}, o);
  ASSERT_TRUE(relayed.ok());
  EXPECT_NEAR(relayed->decode_step_seconds / relayed->decode_step_alone_seconds, 1, 1e-9);
  // A GPU profile's steps never share.
  auto gpu = SimulateRequests(model, *LoadProfile("l40s"), c, reqs, {}, o);
  ASSERT_TRUE(gpu.ok());
  EXPECT_NEAR(gpu->decode_step_seconds, gpu->decode_step_alone_seconds,
              1e-9 * gpu->decode_step_seconds);
}

TEST(Simulator, SamplingFollowsEachDecodeStepOnOneCore) {
  // sample_cpu: after each forward pass the decode loop samples every running request's token
  // on its own thread. A stream alone gets its tokens that much later each; the steps' figures
  // stay the forward pass's (the workers' metric).
  auto [p, c, reqs, model] = TwoDecodeStreams();
  c.decode = 1;
  p.host_cores = 2;
  p.step_threads = 2;
  SimOptions o;
  o.record_token_times = false;
  auto base = SimulateRequests(model, p, c, {reqs[0]}, {}, o);
  p.sample_cpu = 1e-3;
  auto sampled = SimulateRequests(model, p, c, {reqs[0]}, {}, o);
  ASSERT_TRUE(base.ok() && sampled.ok());
  EXPECT_NEAR(sampled->summary.tpot.mean, base->summary.tpot.mean + 1e-3, 1e-9);
  EXPECT_NEAR(sampled->decode_step_seconds, base->decode_step_seconds,
              1e-9 * base->decode_step_seconds);
  // Two streams in one batch: two tokens sampled a step, one after the other.
  auto both = SimulateRequests(model, p, c, reqs, {}, o);
  p.sample_cpu = 0;
  auto both_base = SimulateRequests(model, p, c, reqs, {}, o);
  ASSERT_TRUE(both.ok() && both_base.ok());
  ASSERT_NEAR(both->mean_decode_batch, 2, 0.05);
  EXPECT_NEAR(both->summary.tpot.mean, both_base->summary.tpot.mean + 2e-3, 0.05e-3);
  // The sampling keeps one core of two: a step of a second decode worker beside it runs on
  // the other, slowed by half while they overlap.
  c.decode = 2;
  p.sample_cpu = 1e-3;
  auto two = SimulateRequests(model, p, c, reqs, {}, o);
  ASSERT_TRUE(two.ok());
  EXPECT_GT(two->decode_step_seconds, 1.05 * two->decode_step_alone_seconds);
  // Zero-cost runs (the schedulers' decisions alone) have no sampling either.
  o.zero_cost = true;
  auto free = SimulateRequests(model, p, c, reqs, {}, o);
  ASSERT_TRUE(free.ok());
  EXPECT_EQ(free->summary.tpot.mean, 0);
}

TEST(Simulator, PrefillStepsServedFirstKeepTheirSpeed) {
  // prefill_threads > 0: a prefill step takes its cores first and runs as fast as alone; the
  // decode steps share what it leaves. One stream decoding while long prompts are prefilled,
  // on 2 cores, the decode steps keeping both busy.
  HardwareProfile p = *LoadProfile("l40s");
  p.shared_host = true;
  p.host_cores = 2;
  p.step_threads = 2;
  p.request_overhead = 0;  // no hops on the CPU: the steps alone share it
  // Prefill steps far longer than decode steps, so that some decode steps fall inside one.
  p.has_prefill_factors = true;
  p.prefill_factors = {0.002, 0.002, 1, 0};
  ClusterSpec c;
  c.prefill_kv_bytes = c.decode_kv_bytes = 4.0 * (1 << 30);
  std::mt19937_64 rng(5);
  std::vector<TimedRequest> reqs = {{0, Prompt(16, rng), 200}};
  for (int i = 0; i < 6; ++i) reqs.push_back({0.05, Prompt(240, rng), 2});  // one long step
  const ModelConfig model = *RandomModelConfig("stories15M");
  SimOptions o;
  o.record_steps = true;
  auto shared = SimulateRequests(model, p, c, reqs, {}, o);
  p.prefill_threads = 1;
  auto first = SimulateRequests(model, p, c, reqs, {}, o);
  p.prefill_threads = 2;
  auto all_first = SimulateRequests(model, p, c, reqs, {}, o);
  ASSERT_TRUE(shared.ok()) << shared.status();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(all_first.ok()) << all_first.status();
  // As an ordinary step a prefill slows down beside the decode steps; served first it does not.
  EXPECT_GT(shared->prefill_step_seconds, 1.2 * shared->prefill_step_alone_seconds);
  for (const SimResult* r : {&*first, &*all_first}) {
    EXPECT_NEAR(r->prefill_step_seconds, r->prefill_step_alone_seconds,
                1e-9 * r->prefill_step_seconds);
  }
  // The decode steps: alone before the prompts come; inside a prefill step served first on 1
  // core, at half speed (2 threads on the 1 core left); on 2, stopped until it ends.
  const auto check = [](const SimResult& r, double inside_factor) {
    double alone = 0;  // the first decode step's time, before any prefill but the stream's own
    int inside = 0, waited = 0;
    for (const StepTrace& st : r.steps) {
      if (st.prefill || st.end < 0.01) continue;
      if (alone == 0) alone = st.end - st.start;
      for (const StepTrace& pf : r.steps) {
        if (!pf.prefill) continue;
        if (inside_factor > 0 && pf.start <= st.start && st.end <= pf.end) {
          ++inside;
          EXPECT_NEAR(st.end - st.start, inside_factor * alone, 0.05 * alone);
        }
        if (inside_factor == 0 && pf.start > st.start && pf.start < st.end) {
          ++waited;  // a prefill step began during the decode step, which ended after it
          EXPECT_GE(st.end, pf.end - 1e-12);
        }
      }
    }
    EXPECT_GT(alone, 0);
    EXPECT_GT(inside + waited, 0);
  };
  check(*first, 2);
  check(*all_first, 0);
  // Served first on 1 core but giving way fully (prefill_yield 1): the 3 cores asked share the
  // 2 alike, so a prefill step beside a decode step runs at two thirds of its speed, and so do
  // the decode steps inside it; half way (0.5) the 2 cores still cover what it asks.
  p.prefill_threads = 1;
  p.prefill_yield = 1;
  auto yielding = SimulateRequests(model, p, c, reqs, {}, o);
  p.prefill_yield = 0.5;
  auto half = SimulateRequests(model, p, c, reqs, {}, o);
  ASSERT_TRUE(yielding.ok()) << yielding.status();
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_GT(yielding->prefill_step_seconds, 1.1 * yielding->prefill_step_alone_seconds);
  EXPECT_LT(yielding->prefill_step_seconds / yielding->prefill_step_alone_seconds,
            shared->prefill_step_seconds / shared->prefill_step_alone_seconds);
  check(*yielding, 1.5);
  EXPECT_NEAR(half->prefill_step_seconds, half->prefill_step_alone_seconds,
              1e-9 * half->prefill_step_seconds);
}

TEST(Simulator, LoadRaisesLatencyAndRequestsWaitForDecodeRoom) {
  ClusterSpec c;
  auto light = Simulate(Stories260K(), H100(), c, Workload(50, 1));
  auto heavy = Simulate(Stories260K(), H100(), c, Workload(5000, 1));
  ASSERT_TRUE(light.ok() && heavy.ok());
  EXPECT_GT(heavy->summary.ttft.p90, light->summary.ttft.p90);
  EXPECT_GT(heavy->mean_decode_batch, light->mean_decode_batch);
  // A decode cache of 64 blocks (1024 tokens) holds few requests at once: as at the router, the
  // rest wait in line for room (router/admission.h) and are all served, later.
  c.decode_kv_bytes = 64.0 * 16 * CostModel(Stories260K(), H100()).KvBytesPerToken();
  auto tiny = Simulate(Stories260K(), H100(), c, Workload(5000, 1));
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->summary.rejected_total, 0);
  EXPECT_EQ(tiny->summary.completed, 150);
  EXPECT_GT(tiny->summary.ttft.p90, heavy->summary.ttft.p90);
  // A short line turns the overflow away, as the router's --max-queued does.
  c.max_queued = 2;
  auto short_line = Simulate(Stories260K(), H100(), c, Workload(5000, 1));
  ASSERT_TRUE(short_line.ok()) << short_line.status();
  EXPECT_GT(short_line->summary.rejected_total, 0);
  EXPECT_EQ(short_line->summary.rejected_total + short_line->summary.completed, 150);
}

// A request larger than every decode worker's whole cache is refused at once, as the router
// refuses it, instead of waiting for room that can never come.
TEST(Simulator, ARequestNoCacheCanHoldIsRefusedAtOnce) {
  ClusterSpec c;
  // One block: 16 tokens, and every request reaches at least 18.
  c.decode_kv_bytes = 16 * CostModel(Stories260K(), H100()).KvBytesPerToken();
  auto r = Simulate(Stories260K(), H100(), c, Workload(50, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->summary.completed, 0);
  for (const auto& rec : r->records) EXPECT_EQ(rec.status_code, 8);  // RESOURCE_EXHAUSTED
}

TEST(Simulator, ClosedLoopKeepsConcurrencyInFlight) {
  ClusterSpec c;
  bench::BenchConfig w = Workload(0, 2);
  w.concurrency = 3;
  SimOptions o;
  auto r = Simulate(Stories260K(), H100(), c, w, o);
  ASSERT_TRUE(r.ok()) << r.status();
  // At every send, at most 3 measured requests are in flight.
  for (const auto& x : r->records) {
    if (x.warmup) continue;
    int in_flight = 0;
    for (const auto& y : r->records) {
      in_flight += !y.warmup && y.sent <= x.sent && y.done > x.sent;
    }
    EXPECT_LE(in_flight, 3);
  }
  EXPECT_EQ(r->summary.completed, 150);
}

// Speculative decoding on the decode workers: with every proposal kept, each verify step
// brings a stream 1 + K tokens for about the price of one step on a memory-bound GPU; with none
// kept it brings one token a step, a little dearer. Every request still gets all its tokens, and
// the decode workers' blocks all come back.
TEST(Simulator, SpeculativeDecodingTradesVerifyStepsForTokens) {
  ClusterSpec c;
  bench::BenchConfig w = Workload(0, 5);
  w.concurrency = 4;
  w.num_requests = 40;
  w.output_len = "64";
  SimOptions o;
  auto plain = Simulate(Stories260K(), H100(), c, w, o);
  c.spec_tokens = 4;
  c.spec_acceptance = 0.9;
  auto kept = Simulate(Stories260K(), H100(), c, w, o);
  c.spec_acceptance = 0;
  auto none = Simulate(Stories260K(), H100(), c, w, o);
  ASSERT_TRUE(plain.ok() && kept.ok() && none.ok()) << kept.status() << none.status();
  for (const auto* r : {&*plain, &*kept, &*none}) {
    EXPECT_EQ(r->summary.completed, 40);
    for (const auto& x : r->records) EXPECT_EQ(x.output_tokens, 64);
  }
  // a = 0.9, K = 4: 1 + .9 + .81 + .729 + .6561 = 4.1 tokens a verify step.
  EXPECT_LT(kept->decode_steps, plain->decode_steps / 3);
  EXPECT_LT(kept->summary.tpot.mean, plain->summary.tpot.mean / 2.5);
  EXPECT_EQ(none->decode_steps, plain->decode_steps);
  EXPECT_GE(none->summary.tpot.mean, plain->summary.tpot.mean);
  c.spec_acceptance = 1;
  EXPECT_EQ(Simulate(Stories260K(), H100(), c, w, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Simulator, BadConfigurationsAreNamed) {
  ClusterSpec c;
  c.decode = 0;
  auto r = Simulate(Stories260K(), H100(), c, Workload(1, 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("cluster.decode"), std::string::npos);
  c = ClusterSpec();
  c.prefill_tp = 16;  // above the H100 profile's 8
  EXPECT_EQ(Simulate(Stories260K(), H100(), c, Workload(1, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A 20M-token vocabulary makes a 164 GB classifier: no room on a 48 GB L40S.
  ModelConfig huge = *RandomModelConfig("Llama-2-7B");
  huge.vocab_size = 20'000'000;
  EXPECT_EQ(Simulate(huge, *LoadProfile("l40s"), ClusterSpec(), Workload(1, 1)).status().code(),
            absl::StatusCode::kResourceExhausted);
  bench::BenchConfig w = Workload(1, 1);
  w.input_len = "nonsense";
  EXPECT_EQ(Simulate(Stories260K(), H100(), ClusterSpec(), w).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Plan, RanksLayoutsByGoodputPerGpu) {
  bench::BenchConfig w;
  ASSERT_TRUE(ParseWorkloadSpec("in=uniform:100:400,out=uniform:10:60", &w).ok());
  w.slo = {0.02, 0.001};
  w.num_requests = 100;
  PlanOptions o;
  o.gpus = 2;
  o.tp = {1};
  o.min_seconds = 1;
  o.bisection_steps = 4;
  o.max_rate = 300;
  auto r = SearchPlans(Stories260K(), H100(), w, ClusterSpec(), o);
  ASSERT_TRUE(r.ok()) << r.status();
  // 1P1D and 1 or 2 colocated.
  ASSERT_EQ(r->ranked.size(), 3u);
  for (size_t i = 1; i < r->ranked.size(); ++i) {
    EXPECT_GE(r->ranked[i - 1].goodput_per_gpu, r->ranked[i].goodput_per_gpu);
  }
  for (const auto& cand : r->ranked) {
    EXPECT_GE(cand.summary.slo_attainment, 0.9) << cand.Describe();
    EXPECT_NEAR(cand.goodput_per_gpu * cand.gpus, cand.max_rate, 1e-9);
  }
  EXPECT_NE(FormatPlanTable(*r, 3).find("goodput/GPU"), std::string::npos);
  EXPECT_EQ(PlanToJson(*r, 2)["ranked"].size(), 2u);
  // Workload specs name their errors.
  bench::BenchConfig bad;
  EXPECT_NE(ParseWorkloadSpec("in=5", &bad).message().find("out="), std::string::npos);
  EXPECT_NE(ParseWorkloadSpec("in=5,out=x", &bad).message().find("out"), std::string::npos);
  EXPECT_NE(ParseWorkloadSpec("in=5,out=5,colour=red", &bad).message().find("colour"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::planner
