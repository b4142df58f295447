// DecodeScheduler: blocks on demand, the watermark, preemption of the newest sequences and
// their readmission ahead of new requests, and refusal of a request the cache cannot hold. Every
// test ends with the leak check: no request and no block in use.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <map>
#include <vector>

#include "engine/scheduling/scheduler.h"

namespace tandem {
namespace {

using Work = DecodeScheduler::Work;

DecodeScheduler::Options Opts(int blocks, int block_size = 4, int max_running = 16,
                              double watermark = 0, int recompute_budget = 512) {
  DecodeScheduler::Options o;
  o.num_blocks = blocks;
  o.block_size = block_size;
  o.max_running = max_running;
  o.watermark = watermark;
  o.recompute_budget = recompute_budget;
  return o;
}

// Runs steps until every request has `want[id]` tokens (and releases it then); returns the
// work of every step and counts the tokens each sequence sampled.
struct Driver {
  DecodeScheduler& s;
  std::map<uint64_t, int> want;  // tokens each request finishes at
  std::vector<DecodeScheduler::Step> steps = {};

  void Run(int max_steps = 10000) {
    for (int i = 0; i < max_steps && !want.empty(); ++i) {
      DecodeScheduler::Step step = s.Schedule();
      s.Complete(step);
      for (const Work& w : step.work) {
        if (w.sample && s.tokens(w.id) >= want.at(w.id)) {
          EXPECT_TRUE(s.Release(w.id));
          want.erase(w.id);
        }
      }
      steps.push_back(std::move(step));
    }
  }
};

// 300 rounds of a request arriving (prompts of 1 to 13 tokens, up to 30 more) while the
// scheduler runs a step, more than the cache holds at once; `check` sees each step's work
// before it completes. Finished requests are released; the rest stay in `d.want`.
void AdmitAndStepUnderPressure(Driver& d, int* admitted,
                               const std::function<void(const Work&)>& check) {
  DecodeScheduler& s = d.s;
  uint64_t next = 1;
  for (int round = 0; round < 300; ++round) {
    const int prompt = 1 + (round * 7) % 13;
    const int length = prompt + 1 + (round * 11) % 30;
    if (s.Admit(next, prompt, length).ok()) {
      ASSERT_TRUE(s.Start(next).ok());
      d.want[next] = length;
      ++*admitted;
    }
    ++next;
    DecodeScheduler::Step step = s.Schedule();
    for (const Work& w : step.work) {
      check(w);
      if (::testing::Test::HasFatalFailure()) return;
    }
    s.Complete(step);
    for (const Work& w : step.work) {
      if (w.sample && s.tokens(w.id) >= d.want.at(w.id)) {
        ASSERT_TRUE(s.Release(w.id));
        d.want.erase(w.id);
      }
    }
  }
}

TEST(DecodeSchedulerTest, AdmissionReservesThePromptAndGrowthCrossesBlockBoundaries) {
  DecodeScheduler s(Opts(10));
  // 6 prompt tokens + the first token: 7 tokens, 2 blocks of 4.
  auto blocks = s.Admit(1, 6, 40);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_EQ(blocks->size(), 2u);
  EXPECT_EQ(s.num_free_blocks(), 8);
  ASSERT_TRUE(s.Start(1).ok());
  EXPECT_EQ(s.tokens(1), 7);
  // Step 1 computes position 6 (the first token) into block 1; tokens 7 and 8 follow.
  for (int step = 0; step < 2; ++step) {
    DecodeScheduler::Step plan = s.Schedule();
    ASSERT_EQ(plan.work.size(), 1u);
    EXPECT_EQ(plan.work[0].start, 6 + step);
    EXPECT_EQ(plan.work[0].count, 1);
    EXPECT_TRUE(plan.work[0].sample);
    s.Complete(plan);
  }
  EXPECT_EQ(s.blocks(1)->size(), 2u);         // positions 0..7 fit in 2 blocks
  DecodeScheduler::Step plan = s.Schedule();  // position 8: a third block
  EXPECT_EQ(plan.work[0].start, 8);
  EXPECT_EQ(s.blocks(1)->size(), 3u);
  EXPECT_EQ(s.num_free_blocks(), 7);
  s.Complete(plan);
  EXPECT_TRUE(s.Release(1));
  EXPECT_FALSE(s.Release(1));
  EXPECT_TRUE(s.Idle());
}

TEST(DecodeSchedulerTest, TheWatermarkStaysFreeAtAdmission) {
  DecodeScheduler s(Opts(100, 4, 64, /*watermark=*/0.1));
  EXPECT_EQ(s.watermark_blocks(), 10);
  // 9 requests of 10 blocks (39 prompt tokens + the first): 90 blocks, 10 left = the watermark.
  for (uint64_t id = 1; id <= 9; ++id) ASSERT_TRUE(s.Admit(id, 39, 200).ok()) << id;
  const auto refused = s.Admit(10, 3, 200);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("free for growth"), std::string::npos)
      << refused.status();
  for (uint64_t id = 1; id <= 9; ++id) EXPECT_TRUE(s.Release(id));
  EXPECT_TRUE(s.Idle());
}

TEST(DecodeSchedulerTest, ARequestTheWholeCacheCannotHoldIsRefusedAtOnce) {
  DecodeScheduler s(Opts(10));  // 40 tokens
  EXPECT_TRUE(s.Admit(1, 3, 40).ok());
  const auto refused = s.Admit(2, 3, 41);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("whole cache"), std::string::npos) << refused.status();
  EXPECT_EQ(s.Admit(1, 3, 10).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(s.Release(1));
  EXPECT_TRUE(s.Idle());
}

// When a sequence needs a block and none is free, the most recently admitted running sequence
// is preempted (not the oldest, not one already in the step); it is readmitted, its tokens
// recomputed, before any new request gets in, and every sequence reaches its length.
TEST(DecodeSchedulerTest, PreemptsTheNewestAndReadmitsItBeforeNewRequests) {
  DecodeScheduler s(Opts(6, 4));  // 24 tokens
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(s.Admit(id, 3, 12).ok());  // 4 tokens with the first: 1 block each
    ASSERT_TRUE(s.Start(id).ok());
  }
  s.Complete(s.Schedule());  // position 3: still the first block
  // Position 4: every sequence takes its second block; 6 blocks in use, none free.
  DecodeScheduler::Step plan = s.Schedule();
  ASSERT_EQ(plan.work.size(), 3u);
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_EQ(s.num_free_blocks(), 0);
  s.Complete(plan);
  for (int step = 0; step < 3; ++step) s.Complete(s.Schedule());  // positions 5..7
  // Position 8 needs a third block each: request 3, the newest, is preempted, and its two
  // blocks go to requests 1 and 2.
  plan = s.Schedule();
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{3}));
  ASSERT_EQ(plan.work.size(), 2u);
  EXPECT_EQ(plan.work[0].id, 1u);
  EXPECT_EQ(plan.work[1].id, 2u);
  EXPECT_EQ(s.num_preempted(), 1);
  EXPECT_EQ(s.preemptions(), 1);
  EXPECT_EQ(s.tokens(3), 9);
  s.Complete(plan);
  // A new request waits behind the preempted one, even once blocks are free.
  ASSERT_TRUE(s.Release(1));
  const auto newer = s.Admit(4, 3, 12);
  EXPECT_EQ(newer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(newer.status().message().find("preempted"), std::string::npos);
  // Readmission: request 3 recomputes its 9 tokens' KV in one chunk, the last position's
  // logits giving its next token; request 2 decodes beside it.
  plan = s.Schedule();
  ASSERT_EQ(plan.work.size(), 2u);
  EXPECT_EQ(plan.work[0].id, 2u);
  EXPECT_EQ(plan.work[0].count, 1);
  EXPECT_EQ(plan.work[1].id, 3u);
  EXPECT_EQ(plan.work[1].start, 0);
  EXPECT_EQ(plan.work[1].count, 9);
  EXPECT_TRUE(plan.work[1].sample);
  s.Complete(plan);
  EXPECT_EQ(s.tokens(3), 10);
  EXPECT_EQ(s.num_preempted(), 0);
  Driver d{s, {{2, 12}, {3, 12}}};
  d.Run();
  EXPECT_TRUE(d.want.empty());
  EXPECT_TRUE(s.Admit(4, 3, 12).ok());  // nothing preempted waits any more
  EXPECT_TRUE(s.Release(4));
  EXPECT_TRUE(s.Idle());
}

// A cancelled request leaves at the next step boundary, but its place is free at once: the
// request taking it is admitted while the leaver still holds its blocks, and the batch the next
// step plans (after the leaver's release) is back within max_running.
TEST(DecodeSchedulerTest, ALeavingRequestHoldsNoPlace) {
  DecodeScheduler s(Opts(20, 4, /*max_running=*/2));
  for (uint64_t id = 1; id <= 2; ++id) {
    ASSERT_TRUE(s.Admit(id, 3, 12).ok());
    ASSERT_TRUE(s.Start(id).ok());
  }
  EXPECT_EQ(s.Admit(3, 3, 12).status().code(), absl::StatusCode::kResourceExhausted);
  s.MarkLeaving(2);
  s.MarkLeaving(2);  // once is enough
  s.MarkLeaving(9);  // unknown: ignored
  EXPECT_EQ(s.num_holding_places(), 1);
  const int free_before = s.num_free_blocks();
  ASSERT_TRUE(s.Admit(3, 3, 12).ok());
  EXPECT_EQ(s.num_free_blocks(), free_before - 1) << "the leaver's blocks are still taken";
  EXPECT_EQ(s.Admit(4, 3, 12).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(s.Release(2));
  EXPECT_EQ(s.num_holding_places(), 2);
  ASSERT_TRUE(s.Start(3).ok());
  EXPECT_EQ(s.Schedule().work.size(), 2u);
  EXPECT_EQ(s.Admit(4, 3, 12).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(s.Release(1));
  ASSERT_TRUE(s.Release(3));
  EXPECT_TRUE(s.Idle());
}

// A recompute larger than the step's budget goes in chunks; only the chunk reaching the end of
// the sequence samples.
TEST(DecodeSchedulerTest, RecomputeIsChunkedUnderTheBudget) {
  DecodeScheduler s(Opts(20, 4, 16, 0, /*recompute_budget=*/5));
  ASSERT_TRUE(s.Admit(1, 11, 60).ok());  // 12 tokens: 3 blocks
  ASSERT_TRUE(s.Start(1).ok());
  ASSERT_TRUE(s.Admit(2, 40, 60).ok());  // 41 tokens: 11 blocks
  ASSERT_TRUE(s.Start(2).ok());
  // 14 blocks held, 6 free; a step computes positions 11 and 40 without growth...
  DecodeScheduler::Step plan = s.Schedule();
  s.Complete(plan);
  // ...and a third request takes the rest, so growth soon preempts it.
  ASSERT_TRUE(s.Admit(3, 23, 60).ok());  // 24 tokens: 6 blocks
  ASSERT_TRUE(s.Start(3).ok());
  EXPECT_EQ(s.num_free_blocks(), 0);
  Driver d{s, {{1, 30}, {2, 45}, {3, 30}}};
  d.Run();
  EXPECT_TRUE(d.want.empty());
  EXPECT_GT(s.preemptions(), 0);
  bool chunked = false;
  for (const auto& step : d.steps) {
    for (const Work& w : step.work) {
      if (w.count > 1) {
        EXPECT_LE(w.count, 5);
        chunked |= !w.sample;
      }
    }
  }
  EXPECT_TRUE(chunked) << "a recompute ran in chunks";
  EXPECT_TRUE(s.Idle());
}

// Many sequences through a small cache, in random lengths: every one finishes, every step's
// blocks cover its positions, and nothing leaks.
TEST(DecodeSchedulerTest, PressureNeverLosesASequence) {
  DecodeScheduler s(Opts(40, 4, 32, 0.05, 16));
  Driver d{s, {}};
  int admitted = 0;
  AdmitAndStepUnderPressure(d, &admitted, [&](const Work& w) {
    ASSERT_GE(static_cast<int>(s.blocks(w.id)->size()) * 4, w.start + w.count);
  });
  ASSERT_FALSE(HasFatalFailure());
  d.Run();
  EXPECT_TRUE(d.want.empty());
  EXPECT_GT(admitted, 50);
  EXPECT_GT(s.preemptions(), 0);
  EXPECT_TRUE(s.Idle());
}

// --kv-admission=reserve: admission takes every block the request may reach, so sequences never
// grow into new blocks and nothing is ever preempted; a request that does not fit waits.
TEST(DecodeSchedulerTest, ReserveAdmissionTakesMaxTokensAndNeverPreempts) {
  DecodeScheduler::Options o = Opts(10, 4, 16, /*watermark=*/0.5);
  o.admission = DecodeScheduler::Admission::kReserve;
  DecodeScheduler s(o);
  EXPECT_EQ(s.watermark_blocks(), 0);  // nothing to grow into
  // 6 prompt tokens, at most 20 tokens: 2 blocks now, 3 more set aside.
  auto blocks = s.Admit(1, 6, 20);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_EQ(blocks->size(), 2u);
  EXPECT_EQ(s.growth_promised(), 3);
  ASSERT_TRUE(s.Admit(2, 2, 17).ok());  // 1 block now, 4 set aside: the cache is spoken for
  EXPECT_EQ(s.num_free_blocks(), 7);
  EXPECT_EQ(s.growth_promised(), 7);
  const auto refused = s.Admit(3, 1, 2);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("7 of them promised"), std::string::npos)
      << refused.status();
  ASSERT_TRUE(s.Start(1).ok());
  ASSERT_TRUE(s.Start(2).ok());
  Driver d{s, {{1, 20}, {2, 17}}};
  d.Run();
  EXPECT_TRUE(d.want.empty());
  EXPECT_EQ(s.preemptions(), 0);
  EXPECT_TRUE(s.Idle());
  EXPECT_EQ(ParseKvAdmission("reserve").value(), DecodeScheduler::Admission::kReserve);
  EXPECT_EQ(ParseKvAdmission("on-demand").value(), DecodeScheduler::Admission::kOnDemand);
  const auto bad = ParseKvAdmission("greedy");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--kv-admission"), std::string::npos);
}

// Speculative decoding: a decode work widened by proposals takes blocks only from free ones
// (never preempting), no further than the request's most tokens; after the step the sequence
// gains 1 + the proposals kept and the blocks past it go back to the pool.
TEST(DecodeSchedulerTest, SpeculationGrowsFromFreeBlocksAndTrimsAfter) {
  DecodeScheduler s(Opts(12));
  ASSERT_TRUE(s.Admit(1, 6, 40).ok());  // 7 tokens: blocks 0..1 (positions 0..7)
  ASSERT_TRUE(s.Start(1).ok());
  DecodeScheduler::Step step = s.Schedule();
  ASSERT_EQ(step.work.size(), 1u);
  EXPECT_EQ(s.Speculate(&step, 0, 5), 5);  // positions 6..11: a third block
  EXPECT_EQ(step.work[0].count, 6);
  EXPECT_EQ(step.work[0].draft, 5);
  EXPECT_EQ(s.blocks(1)->size(), 3u);
  EXPECT_EQ(s.Speculate(&step, 0, 2), 0);  // once per work
  const int kept[] = {2};
  s.Complete(step, kept);
  EXPECT_EQ(s.tokens(1), 10);          // 7 + the token + 2 proposals
  EXPECT_EQ(s.blocks(1)->size(), 3u);  // positions 0..9
  step = s.Schedule();
  EXPECT_EQ(step.work[0].start, 9);
  // At most to position 38: the step may bring the sequence to its most tokens, 40.
  EXPECT_EQ(s.Speculate(&step, 0, 64), 29);
  EXPECT_EQ(s.num_free_blocks(), 2);
  const int none[] = {0};
  s.Complete(step, none);
  EXPECT_EQ(s.tokens(1), 11);
  EXPECT_EQ(s.blocks(1)->size(), 3u);  // the rejected proposals' blocks are free again
  EXPECT_EQ(s.num_free_blocks(), 9);
  Driver{s, {{1, 38}}}.Run();
  ASSERT_TRUE(s.Admit(2, 36, 40).ok());
  ASSERT_TRUE(s.Start(2).ok());
  step = s.Schedule();
  EXPECT_EQ(s.Speculate(&step, 0, 8), 2);  // 37 tokens: the step may reach 40
  s.Complete(step, {});                    // no kept values: none kept
  EXPECT_EQ(s.tokens(2), 38);
  EXPECT_TRUE(s.Release(2));
  EXPECT_TRUE(s.Idle());
}

TEST(DecodeSchedulerTest, SpeculationNeverPreemptsAndKeepsReservedBlocks) {
  // Two sequences fill the cache: neither's proposals get a block the other holds.
  DecodeScheduler s(Opts(4));
  ASSERT_TRUE(s.Admit(1, 6, 16).ok());
  ASSERT_TRUE(s.Admit(2, 6, 16).ok());
  ASSERT_TRUE(s.Start(1).ok());
  ASSERT_TRUE(s.Start(2).ok());
  DecodeScheduler::Step step = s.Schedule();
  ASSERT_EQ(step.work.size(), 2u);
  EXPECT_EQ(s.Speculate(&step, 0, 4), 1);  // position 7: the last of its own blocks
  EXPECT_EQ(s.Speculate(&step, 1, 4), 1);
  EXPECT_TRUE(step.preempted.empty());
  s.Complete(step, std::vector<int>{1, 0});
  EXPECT_EQ(s.tokens(1), 9);
  EXPECT_EQ(s.tokens(2), 8);
  EXPECT_TRUE(s.Release(1));
  EXPECT_TRUE(s.Release(2));
  // kReserve: proposals take only blocks no request is promised (its own included), and the
  // rejected ones' blocks go back.
  DecodeScheduler::Options reserve = Opts(14);
  reserve.admission = DecodeScheduler::Admission::kReserve;
  DecodeScheduler r(reserve);
  ASSERT_TRUE(r.Admit(1, 6, 40).ok());  // 2 blocks now, 8 more promised: 4 are nobody's
  ASSERT_TRUE(r.Start(1).ok());
  step = r.Schedule();
  EXPECT_EQ(r.Speculate(&step, 0, 64), 17);  // positions 6..23: the 4 blocks nobody is promised
  EXPECT_EQ(r.num_free_blocks(), 8);
  r.Complete(step, std::vector<int>{0});
  EXPECT_EQ(r.blocks(1)->size(), 2u);
  EXPECT_EQ(r.num_free_blocks(), 12);
  EXPECT_EQ(r.growth_promised(), 8);
  EXPECT_TRUE(r.Release(1));
  EXPECT_TRUE(r.Idle());
  EXPECT_TRUE(s.Idle());
}

// A cache of a full-attention group and a sliding one (window 8, blocks of 4): a long sequence
// holds its full group's blocks and only its window's in the sliding group, and under pressure
// (preemption, recompute, readmission) no sequence is lost or leaks a block.
TEST(DecodeSchedulerTest, SlidingGroupsHoldOnlyTheirWindow) {
  DecodeScheduler::Options o = Opts(200, 4, 16);
  o.group_window = {0, 8};
  DecodeScheduler s(o);
  // A 20-token prompt: full blocks 0..5, sliding blocks from position 13 (3..5).
  auto table = s.Admit(1, 20, 100);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(LiveBlocks(*table), 6 + 3);
  ASSERT_TRUE(s.Start(1).ok());
  Driver d{s, {{1, 100}}};
  int most_sliding = 0;
  for (int i = 0; i < 200 && !d.want.empty(); ++i) {
    DecodeScheduler::Step step = s.Schedule();
    s.Complete(step);
    if (const std::vector<int>* t = s.blocks(1)) {
      const std::vector<int> sliding = GroupTable(s.layout(), *t, 1);
      most_sliding = std::max(most_sliding, LiveBlocks(sliding));
      // The full group covers every computed position (the newest token's comes next step).
      EXPECT_EQ(LiveBlocks(GroupTable(s.layout(), *t, 0)), s.BlocksFor(s.tokens(1) - 1));
    }
    if (s.tokens(1) >= 100) {
      EXPECT_TRUE(s.Release(1));
      d.want.clear();
    }
  }
  EXPECT_TRUE(d.want.empty());
  EXPECT_LE(most_sliding, 3);  // 8 positions span at most 3 blocks of 4
  EXPECT_TRUE(s.Idle());
}

// kReserve over a full group and a sliding one (window 8, blocks of 4): a request sets aside
// what it may hold at once (10 full blocks and 3 sliding ones for 40 tokens), not its sliding
// group's whole length (7 more), so four fit in 60 blocks where three would; every step finds
// its blocks and nothing is preempted.
TEST(DecodeSchedulerTest, ReserveWithSlidingGroupsSetsAsideOnlyTheWindow) {
  DecodeScheduler::Options o = Opts(60, 4, 16);
  o.group_window = {0, 8};
  o.admission = DecodeScheduler::Admission::kReserve;
  DecodeScheduler s(o);
  EXPECT_EQ(s.layout().PeakBlocks(40), 13);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(s.Admit(id, 20, 40).ok()) << id;
  EXPECT_EQ(s.Admit(5, 20, 40).status().code(), absl::StatusCode::kResourceExhausted);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(s.Start(id).ok());
  std::map<uint64_t, int> want = {{1, 40}, {2, 40}, {3, 40}, {4, 40}};
  for (int i = 0; i < 100 && !want.empty(); ++i) {
    DecodeScheduler::Step step = s.Schedule();
    EXPECT_TRUE(step.preempted.empty());
    EXPECT_EQ(step.work.size(), want.size()) << "every running request steps";
    for (const Work& w : step.work) {
      EXPECT_EQ(MissingBlocks(s.layout(), *s.blocks(w.id), w.start, w.start + w.count), 0);
      EXPECT_LE(LiveBlocks(*s.blocks(w.id)), 13);
    }
    s.Complete(step);
    for (const Work& w : step.work) {
      if (s.tokens(w.id) >= want.at(w.id)) {
        EXPECT_TRUE(s.Release(w.id));
        want.erase(w.id);
      }
    }
  }
  EXPECT_TRUE(want.empty());
  EXPECT_EQ(s.preemptions(), 0);
  EXPECT_TRUE(s.Idle());
}

TEST(DecodeSchedulerTest, SlidingGroupsUnderPressureNeverLoseASequence) {
  DecodeScheduler::Options o = Opts(60, 4, 32, 0.05, 16);
  o.group_window = {0, 5, 5};
  DecodeScheduler s(o);
  Driver d{s, {}};
  int admitted = 0;
  AdmitAndStepUnderPressure(d, &admitted, [&](const Work& w) {
    // Every block the step reads or writes is held.
    ASSERT_EQ(MissingBlocks(s.layout(), *s.blocks(w.id), w.start, w.start + w.count), 0);
  });
  ASSERT_FALSE(HasFatalFailure());
  d.Run();
  EXPECT_TRUE(d.want.empty());
  EXPECT_GT(admitted, 50);
  EXPECT_GT(s.preemptions(), 0);
  EXPECT_TRUE(s.Idle());
}

// Enqueued requests (the single-process engine): each waits with nothing computed and its
// prompt is computed in chunks of at most chunk_size, oldest first; the chunk that reaches the
// prompt's end samples its first token. Every step stays within step_tokens (decodes included)
// and max_batch sequences; the decodes of older sequences come before a newer prompt's chunk.
TEST(DecodeSchedulerTest, EnqueuedPromptsAreComputedInChunksUnderTheStepLimits) {
  DecodeScheduler::Options o = Opts(40, 4, 16, 0, /*recompute_budget=*/INT32_MAX);
  o.chunk_size = 6;
  o.step_tokens = 10;
  o.max_batch = 3;
  DecodeScheduler s(o);
  for (uint64_t id = 1; id <= 5; ++id) ASSERT_TRUE(s.Enqueue(id, 9 + int(id), 40).ok());
  EXPECT_EQ(s.num_preempted(), 5);
  EXPECT_EQ(s.preemptions(), 0) << "enqueueing is not a preemption";
  EXPECT_EQ(s.Enqueue(3, 4, 10).code(), absl::StatusCode::kAlreadyExists);
  // The first step: request 1's first chunk (6 of its 10 tokens), then 4 of request 2's.
  DecodeScheduler::Step first = s.Schedule();
  ASSERT_EQ(first.work.size(), 2u);
  EXPECT_EQ(first.work[0].id, 1u);
  EXPECT_EQ(first.work[0].start, 0);
  EXPECT_EQ(first.work[0].count, 6);
  EXPECT_FALSE(first.work[0].sample);
  EXPECT_EQ(first.work[1].id, 2u);
  EXPECT_EQ(first.work[1].count, 4);
  EXPECT_EQ(s.running().size(), 3u) << "readmission stops at max_batch";
  s.Complete(first);

  Driver d{s, {{1, 14}, {2, 15}, {3, 16}, {4, 17}, {5, 18}}};
  std::map<uint64_t, int> computed = {{1, 6}, {2, 4}};
  bool decode_before_chunk = false;
  for (int i = 0; i < 200 && !d.want.empty(); ++i) {
    DecodeScheduler::Step step = s.Schedule();
    ASSERT_FALSE(step.work.empty());
    int tokens = 0;
    bool decoded = false;
    for (const Work& w : step.work) {
      tokens += w.count;
      EXPECT_EQ(w.start, computed[w.id]) << "a prompt's chunks follow each other";
      EXPECT_LE(w.count, 6);
      computed[w.id] = w.start + w.count;
      if (w.count == 1 && w.sample) decoded = true;
      if (w.count > 1 && decoded) decode_before_chunk = true;
    }
    EXPECT_LE(tokens, 10);
    EXPECT_LE(static_cast<int>(s.running().size()), 3);
    s.Complete(step);
    for (const Work& w : step.work) {
      if (w.sample && s.tokens(w.id) >= d.want.at(w.id)) {
        EXPECT_TRUE(s.Release(w.id));
        d.want.erase(w.id);
      }
    }
  }
  EXPECT_TRUE(d.want.empty());
  EXPECT_TRUE(decode_before_chunk);
  EXPECT_EQ(s.preemptions(), 0);
  EXPECT_TRUE(s.Idle());
}

// Enqueue refuses what the whole cache cannot hold and what passes the request limit; a request
// enqueued behind a preempted sequence keeps the order of admission.
TEST(DecodeSchedulerTest, EnqueueRefusesWhatCannotFitAndKeepsAdmissionOrder) {
  DecodeScheduler s(Opts(10, 4, /*max_running=*/3));
  EXPECT_EQ(s.Enqueue(1, 30, 41).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.Enqueue(1, 0, 4).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.Enqueue(1, 15, 20).ok());  // 4 blocks, up to 5
  ASSERT_TRUE(s.Enqueue(2, 15, 20).ok());
  ASSERT_TRUE(s.Enqueue(3, 3, 8).ok());
  EXPECT_EQ(s.Enqueue(4, 3, 8).code(), absl::StatusCode::kResourceExhausted);
  Driver d{s, {{1, 20}, {2, 20}, {3, 8}}};
  d.Run();
  EXPECT_TRUE(d.want.empty());
  EXPECT_GT(s.preemptions(), 0) << "two sequences of 5 blocks and a third share 10 blocks";
  // Whatever was preempted, a sequence's first token comes after every older one's.
  std::vector<uint64_t> first_sampled;
  for (const auto& step : d.steps) {
    for (const Work& w : step.work) {
      if (w.sample &&
          std::find(first_sampled.begin(), first_sampled.end(), w.id) == first_sampled.end()) {
        first_sampled.push_back(w.id);
      }
    }
  }
  EXPECT_EQ(first_sampled, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_TRUE(s.Idle());
}

// Proposals count against the step's tokens.
TEST(DecodeSchedulerTest, SpeculationStaysWithinTheStepTokens) {
  DecodeScheduler::Options o = Opts(40, 4, 16);
  o.step_tokens = 5;
  DecodeScheduler s(o);
  for (uint64_t id = 1; id <= 2; ++id) {
    ASSERT_TRUE(s.Admit(id, 3, 30).ok());
    ASSERT_TRUE(s.Start(id).ok());
  }
  DecodeScheduler::Step step = s.Schedule();
  ASSERT_EQ(step.work.size(), 2u);
  EXPECT_EQ(s.Speculate(&step, 0, 4), 3);  // 2 decodes and 3 proposals: the step's 5 tokens
  EXPECT_EQ(s.Speculate(&step, 1, 4), 0);
  const std::vector<int> kept = {1, 0};
  s.Complete(step, kept);
  EXPECT_EQ(s.tokens(1), 6);  // 4, then the token and the one proposal kept
  EXPECT_EQ(s.tokens(2), 5);
  EXPECT_TRUE(s.Release(1));
  EXPECT_TRUE(s.Release(2));
  EXPECT_TRUE(s.Idle());
}

}  // namespace
}  // namespace tandem
