#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model_runner.h"
#include "engine/sampling/stop.h"
#include "engine/scheduling/scheduler.h"

namespace tandem {

absl::Status GeneratorOptions::Validate() const {
  if (block_size < 1 || block_size > 4096) {
    return absl::InvalidArgumentError("block_size must be in [1, 4096]");
  }
  if (num_blocks < 0) return absl::InvalidArgumentError("num_blocks must be >= 0");
  if (max_batch < 1) return absl::InvalidArgumentError("max_batch must be >= 1");
  if (prefill_chunk < 0) return absl::InvalidArgumentError("prefill_chunk must be >= 0");
  if (max_step_tokens < 1) return absl::InvalidArgumentError("max_step_tokens must be >= 1");
  return absl::OkStatus();
}

Generator::Generator(const Model* model, const Tokenizer* tokenizer, GeneratorOptions options)
    : model_(model), tokenizer_(tokenizer), options_(options) {}

namespace {

using Clock = std::chrono::steady_clock;

// One request's output side: its tokens and text. What is computed and where its KV lives is the
// scheduler's (engine/scheduling/scheduler.h), under the request's index as its id.
struct Seq {
  int index = 0;
  const GenerationRequest* req = nullptr;
  std::vector<int> tokens;  // prompt + generated
  int generated = 0;
  std::optional<IncrementalDecoder> decoder;
  std::optional<StopStringMatcher> stop;
  // Its input when it scores proposals this step (speculative decoding): the last token, then
  // the proposals (empty otherwise).
  std::vector<int> step_tokens;
};

// Compiles the constraints of requests asking for structured output (in a copy of the requests
// kept in `attached`, which `*requests` then views), then validates every request.
absl::Status PrepareRequests(std::span<const GenerationRequest>* requests,
                             OutputConstraints* constraints, const ModelConfig& config,
                             const Tokenizer* tokenizer, std::vector<GenerationRequest>* attached) {
  // Requests asking for structured output get their constraint compiled for this model.
  for (const GenerationRequest& r : *requests) {
    if (r.sampling.constrained() && r.sampling.constraint == nullptr) {
      attached->assign(requests->begin(), requests->end());
      for (size_t i = 0; i < attached->size(); ++i) {
        if (absl::Status s = AttachConstraint(constraints, &(*attached)[i].sampling); !s.ok()) {
          return absl::Status(s.code(), absl::StrFormat("request %d: %s", i, s.message()));
        }
      }
      *requests = *attached;
      break;
    }
  }
  for (size_t i = 0; i < requests->size(); ++i) {
    if (absl::Status s = ValidateRequest((*requests)[i], config, tokenizer); !s.ok()) {
      return absl::Status(s.code(), absl::StrFormat("request %d: %s", i, s.message()));
    }
  }
  return absl::OkStatus();
}

// The KV blocks of a cache sized for `requests` (num_blocks 0): enough for every prompt and its
// max_tokens within the context length, capped by max_kv_bytes, at least one.
int BlocksForRequests(std::span<const GenerationRequest> requests, const ModelConfig& config,
                      const GeneratorOptions& options, int bs) {
  const KvCacheSpec spec = KvCacheSpec::For(config, bs, options.kv_dtype);
  const KvTableLayout layout = spec.table_layout();
  int64_t num_blocks = 0;
  for (const auto& r : requests) {
    const int64_t len =
        std::min<int64_t>(static_cast<int64_t>(r.prompt.size()) + r.max_tokens, config.max_seq_len);
    num_blocks += layout.BlocksHeld(0, static_cast<int>(len));
  }
  num_blocks = std::min<int64_t>(num_blocks, spec.BlocksIn(options.max_kv_bytes));
  return static_cast<int>(std::max<int64_t>(num_blocks, 1));
}

// One Generate call: the scheduler, every sequence and the outputs.
struct BatchState {
  BatchState(DecodeScheduler::Options options, Clock::time_point start, Proposer* proposer)
      : scheduler(std::move(options)), start(start), proposer(proposer) {}

  DecodeScheduler scheduler;
  std::vector<GenerationOutput> outputs;
  std::vector<Seq> seqs;
  std::vector<uint64_t> finished;  // this step's: released once the step is complete
  bool first_token_seen = false;
  Clock::time_point start;
  Proposer* proposer;  // nullptr: no speculation
};

// The scheduler's options for a cache of `num_blocks` blocks laid out as `layout`: every request
// enqueued at once, prompts computed in chunks of options.prefill_chunk (0: whole) under the
// forward call's token and sequence limits, no blocks set aside for growth.
DecodeScheduler::Options SchedulerOptions(const GeneratorOptions& options, int num_blocks,
                                          const KvTableLayout& layout, size_t num_requests) {
  DecodeScheduler::Options o;
  o.num_blocks = num_blocks;
  o.block_size = layout.block_size;
  o.group_window = layout.group_window;
  o.max_running = static_cast<int>(std::min<size_t>(std::max<size_t>(num_requests, 1), INT32_MAX));
  o.watermark = 0;
  o.recompute_budget = INT32_MAX;
  o.max_batch = options.max_batch;
  o.chunk_size = options.prefill_chunk;
  o.step_tokens = options.max_step_tokens;
  return o;
}

// Ends a sequence with `reason`, emitting the text still held back when `flush_text`. Its blocks
// go back once the step is complete.
void Finish(BatchState* state, Seq* seq, FinishReason reason, bool flush_text,
            const Generator::TokenCallback& on_token) {
  Seq& s = *seq;
  GenerationOutput& out = state->outputs[s.index];
  out.finish = reason;
  if (flush_text && s.decoder) {
    bool stopped = false;
    std::string tail = s.stop->Add(s.decoder->Flush(), &stopped);
    if (!stopped) tail += s.stop->Flush();
    out.text += tail;
    if (!tail.empty() && on_token) on_token(s.index, -1, tail);
  }
  if (state->proposer != nullptr) state->proposer->Forget(s.index);
  state->finished.push_back(s.index);
}

// Appends `token`, sampled from `row`, to the sequence, emits it and its text, and ends the
// sequence when it finishes there. Returns whether it did.
bool EmitToken(BatchState* batch, const ModelConfig& config, Seq* seq, std::span<const float> row,
               int token, const Generator::TokenCallback& on_token, GenerationStats* stats) {
  BatchState& state = *batch;
  Seq& s = *seq;
  s.tokens.push_back(token);
  ++s.generated;
  ++stats->generated_tokens;
  GenerationOutput& out = state.outputs[s.index];
  out.tokens.push_back(token);
  if (s.req->sampling.logprobs) {
    out.logprobs.push_back(ComputeLogprobs(row, token, s.req->sampling.top_logprobs));
  }
  if (!state.first_token_seen && s.index == 0) {
    state.first_token_seen = true;
    stats->first_token_seconds = std::chrono::duration<double>(Clock::now() - state.start).count();
  }
  std::optional<FinishReason> reason =
      CheckFinish(config, *s.req, token, s.generated, static_cast<int>(s.tokens.size()));
  const bool is_eos = reason == FinishReason::kStop;
  bool stopped_by_string = false;
  if (is_eos) {
    if (on_token) on_token(s.index, token, "");
  } else {
    std::string emit;
    if (s.decoder) {
      emit = s.stop->Add(s.decoder->Add(token), &stopped_by_string);
      out.text += emit;
    }
    if (on_token) on_token(s.index, token, emit);
    if (stopped_by_string) reason = FinishReason::kStop;
  }
  if (!reason) return false;
  Finish(&state, &s, *reason, !is_eos && !stopped_by_string, on_token);
  return true;
}

// Speculative decoding: asks the proposer for the proposals of every sequence that decodes in
// `step` and widens its work to score those the scheduler grants (Speculate).
absl::Status ProposeForStep(BatchState* batch, const ModelConfig& config, int num_tokens,
                            DecodeScheduler::Step* step) {
  BatchState& state = *batch;
  std::vector<ProposalRequest> requests;
  std::vector<size_t> works;
  for (size_t i = 0; i < step->work.size(); ++i) {
    const DecodeScheduler::Work& w = step->work[i];
    if (!w.sample || w.count != 1) continue;  // not decoding
    const Seq& s = state.seqs[w.id];
    const int room = ProposalRoom(num_tokens, s.req->max_tokens, s.generated,
                                  static_cast<int>(s.tokens.size()), config.max_seq_len);
    if (room == 0) continue;
    requests.push_back({w.id, s.tokens, room});
    works.push_back(i);
  }
  if (requests.empty()) return absl::OkStatus();
  std::vector<std::vector<int>> proposals;
  if (absl::Status st = state.proposer->Propose(requests, &proposals); !st.ok()) return st;
  for (size_t j = 0; j < works.size(); ++j) {
    const int k = state.scheduler.Speculate(step, works[j], static_cast<int>(proposals[j].size()));
    if (k == 0) continue;
    Seq& s = state.seqs[step->work[works[j]].id];
    s.step_tokens.assign(1, s.tokens.back());
    s.step_tokens.insert(s.step_tokens.end(), proposals[j].begin(), proposals[j].begin() + k);
  }
  return absl::OkStatus();
}

// A sequence that scored proposals (s.step_tokens) over `rows` (one logit row per input token):
// the verify rule of engine/speculative/proposer.h. Returns the proposals kept.
absl::StatusOr<int> VerifyStep(BatchState* state, const ModelConfig& config, Seq* seq,
                               std::span<const float> rows,
                               const Generator::TokenCallback& on_token, GenerationStats* stats) {
  Seq& s = *seq;
  const std::span<const int> proposals = std::span<const int>(s.step_tokens).subspan(1);
  stats->proposed_tokens += static_cast<int64_t>(proposals.size());
  std::span<const float> row;
  const int kept = VerifyProposals(
      proposals,
      [&](int j) {
        row = rows.subspan(static_cast<size_t>(j) * config.vocab_size, config.vocab_size);
        return Sample(row, s.req->sampling, s.tokens.size(), HistoryOf(*s.req, s.tokens, config));
      },
      [&](int token) { return EmitToken(state, config, seq, row, token, on_token, stats); });
  stats->accepted_tokens += kept;
  s.step_tokens.clear();
  return kept;
}

// After a forward call over `step`: samples the next token of each work whose last position
// gives one (or checks its proposals) from `logits`, emits it and checks whether the sequence is
// done. kept[i]: the proposals work i kept.
absl::Status SampleStep(BatchState* batch, const ModelConfig& config,
                        const DecodeScheduler::Step& step, const std::vector<float>& logits,
                        const Generator::TokenCallback& on_token, GenerationStats* stats,
                        std::vector<int>* kept) {
  BatchState& state = *batch;
  kept->assign(step.work.size(), 0);
  size_t row = 0;  // the first logit row of work i
  for (size_t i = 0; i < step.work.size(); ++i) {
    const DecodeScheduler::Work& w = step.work[i];
    Seq& s = state.seqs[w.id];
    const size_t rows = 1 + w.draft;
    const std::span<const float> step_rows(logits.data() + row * config.vocab_size,
                                           rows * config.vocab_size);
    row += rows;
    if (w.draft > 0) {
      absl::StatusOr<int> k = VerifyStep(&state, config, &s, step_rows, on_token, stats);
      if (!k.ok()) return k.status();
      (*kept)[i] = *k;
    } else if (w.sample) {
      const int token =
          Sample(step_rows, s.req->sampling, s.tokens.size(), HistoryOf(*s.req, s.tokens, config));
      EmitToken(&state, config, &s, step_rows, token, on_token, stats);
    }
  }
  return absl::OkStatus();
}

// The error when nothing runs and the oldest waiting request cannot be readmitted into the empty
// cache.
absl::Status DoesNotFit(const DecodeScheduler& scheduler) {
  const uint64_t id = scheduler.preempted().empty() ? 0 : scheduler.preempted().front();
  return absl::ResourceExhaustedError(
      absl::StrFormat("request %d: %d tokens do not fit in the KV cache of %d blocks of %d", id,
                      scheduler.tokens(id), scheduler.num_blocks(), scheduler.block_size()));
}

// The forward call's input for `step`.
std::vector<SequenceChunk> StepBatch(const BatchState& state, const DecodeScheduler::Step& step) {
  std::vector<SequenceChunk> batch(step.work.size());
  for (size_t i = 0; i < step.work.size(); ++i) {
    const DecodeScheduler::Work& w = step.work[i];
    const Seq& s = state.seqs[w.id];
    batch[i].tokens = w.draft > 0 ? std::span<const int>(s.step_tokens)
                                  : std::span<const int>(s.tokens).subspan(w.start, w.count);
    batch[i].start_pos = w.start;
    batch[i].block_table = *state.scheduler.blocks(w.id);
    batch[i].all_logits = w.draft > 0;
  }
  return batch;
}

}  // namespace

absl::StatusOr<std::vector<GenerationOutput>> Generator::Generate(
    std::span<const GenerationRequest> requests, const TokenCallback& on_token) {
  const auto start = Clock::now();
  stats_ = GenerationStats();
  if (absl::Status s = options_.Validate(); !s.ok()) return s;
  const ModelConfig& config = model_->config();
  std::vector<GenerationRequest> attached;
  if (absl::Status s =
          PrepareRequests(&requests, options_.constraints.get(), config, tokenizer_, &attached);
      !s.ok()) {
    return s;
  }
  ModelRunner* runner = options_.runner;
  const int bs = runner != nullptr ? runner->block_size() : options_.block_size;
  int num_blocks = runner != nullptr ? runner->num_blocks() : options_.num_blocks;
  if (num_blocks == 0) num_blocks = BlocksForRequests(requests, config, options_, bs);
  absl::StatusOr<KvCache> cache = absl::FailedPreconditionError("the runner holds the cache");
  if (runner == nullptr) {
    cache = KvCache::Create(config, num_blocks, bs, options_.max_kv_bytes, options_.kv_dtype);
    if (!cache.ok()) return cache.status();
  }
  // A draft model runs where the model does, with room for as many tokens.
  DraftRunnerOptions draft;
  draft.device = runner != nullptr ? std::string(runner->device()) : "cpu";
  draft.num_blocks = num_blocks;
  draft.block_size = bs;
  draft.max_seqs = options_.max_batch;
  draft.max_step_tokens = options_.max_step_tokens;
  auto proposer = MakeProposer(options_.speculative, config, draft);
  if (!proposer.ok()) return proposer.status();
  const KvTableLayout layout =
      runner != nullptr ? runner->kv_spec().table_layout() : cache->spec().table_layout();
  BatchState state(SchedulerOptions(options_, num_blocks, layout, requests.size()), start,
                   proposer->get());
  DecodeScheduler& scheduler = state.scheduler;

  state.outputs.resize(requests.size());
  state.seqs.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    Seq& s = state.seqs[i];
    s.index = static_cast<int>(i);
    s.req = &requests[i];
    s.tokens = requests[i].prompt;
    if (tokenizer_ != nullptr) {
      s.decoder.emplace(tokenizer_, requests[i].prompt);
      s.stop.emplace(requests[i].stop_strings);
    }
    const int64_t prompt = static_cast<int64_t>(requests[i].prompt.size());
    const int64_t most = std::min<int64_t>(prompt + requests[i].max_tokens, config.max_seq_len);
    if (absl::Status st = scheduler.Enqueue(i, static_cast<int>(prompt), static_cast<int>(most));
        !st.ok()) {
      return absl::Status(st.code(), absl::StrFormat("request %d: %s", i, st.message()));
    }
    stats_.prompt_tokens += prompt;
  }

  std::vector<float> logits;
  std::vector<int> kept;
  while (scheduler.num_admitted() > 0) {
    DecodeScheduler::Step step = scheduler.Schedule();
    // Whenever a sequence runs, the step computes some of it (engine/scheduling/scheduler.h).
    if (step.work.empty()) return DoesNotFit(scheduler);
    if (state.proposer != nullptr) {
      if (absl::Status st = ProposeForStep(&state, config, options_.speculative.num_tokens, &step);
          !st.ok()) {
        return st;
      }
    }
    const std::vector<SequenceChunk> batch = StepBatch(state, step);
    absl::Status st = runner != nullptr ? runner->Forward(batch, &logits)
                                        : model_->Forward(batch, &*cache, &logits);
    if (!st.ok()) return st;
    ++stats_.steps;
    st = SampleStep(&state, config, step, logits, on_token, &stats_, &kept);
    if (!st.ok()) return st;
    scheduler.Complete(step, kept);
    for (const uint64_t id : state.finished) scheduler.Release(id);
    state.finished.clear();
  }
  stats_.preemptions = scheduler.preemptions();
  if (!scheduler.Idle()) return absl::InternalError("generator: KV blocks leaked");
  if (state.proposer != nullptr && !state.proposer->Idle()) {
    return absl::InternalError("generator: the draft model's KV blocks leaked");
  }
  stats_.total_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return std::move(state.outputs);
}

absl::StatusOr<std::vector<ScoredToken>> ScoreTokensTop(const Model& model,
                                                        std::span<const int> ids, int top_n,
                                                        DType kv_dtype) {
  const ModelConfig& c = model.config();
  if (absl::Status s = ValidateScore(c, ids, top_n); !s.ok()) return s;
  const int bs = 16;
  const KvTableLayout layout = KvCacheSpec::For(c, bs, kv_dtype).table_layout();
  const std::vector<int> table = ContiguousTable(layout, static_cast<int>(ids.size()));
  auto cache = KvCache::Create(c, static_cast<int>(table.size()), bs, 0, kv_dtype);
  if (!cache.ok()) return cache.status();
  SequenceChunk chunk{ids, 0, table, /*all_logits=*/true};
  std::vector<float> logits;
  if (absl::Status s = model.Forward({&chunk, 1}, &*cache, &logits); !s.ok()) return s;
  std::vector<ScoredToken> out;
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    out.push_back(ScoreRow({logits.data() + i * c.vocab_size, static_cast<size_t>(c.vocab_size)},
                           ids[i + 1], top_n));
  }
  return out;
}

absl::Status ValidateScore(const ModelConfig& c, std::span<const int> ids, int top_n) {
  if (ids.size() < 2) return absl::InvalidArgumentError("text: needs at least 2 tokens to score");
  if (static_cast<int64_t>(ids.size()) > c.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("text: %d tokens exceed the context length %d", ids.size(), c.max_seq_len));
  }
  if (absl::Status s = CheckTokenIds(ids, c.vocab_size, "token_ids"); !s.ok()) return s;
  if (top_n < 0 || top_n > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrFormat("top_logprobs: must be in [0, %d], got %d", kMaxTopLogprobs, top_n));
  }
  return absl::OkStatus();
}

ScoredToken ScoreRow(std::span<const float> row, int token, int top_n) {
  TokenLogprobs lp = ComputeLogprobs(row, token, top_n);
  ScoredToken t;
  t.logprob = lp.logprob;
  t.rank = 1 + static_cast<int>(
                   std::count_if(row.begin(), row.end(), [&](float v) { return v > row[token]; }));
  t.top = std::move(lp.top);
  return t;
}

absl::StatusOr<std::vector<float>> ScoreTokens(const Model& model, std::span<const int> ids,
                                               DType kv_dtype) {
  auto scored = ScoreTokensTop(model, ids, 0, kv_dtype);
  if (!scored.ok()) return scored.status();
  std::vector<float> out;
  for (const ScoredToken& t : *scored) out.push_back(t.logprob);
  return out;
}

}  // namespace tandem
