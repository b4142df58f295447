#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model_runner.h"
#include "engine/sampling/stop.h"

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

struct Seq {
  int index = 0;
  const GenerationRequest* req = nullptr;
  std::vector<int> tokens;  // prompt + generated
  int num_computed = 0;     // tokens whose KV is in the cache
  std::vector<int> blocks;  // block table
  int generated = 0;
  std::optional<IncrementalDecoder> decoder;
  std::optional<StopStringMatcher> stop;
  // This step's proposals (speculative decoding), then its input when it scores them: the last
  // token, then the proposals (empty otherwise).
  std::vector<int> proposals;
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

// The scheduler's state over one Generate call: every sequence, the queues, the KV blocks and
// the outputs.
struct BatchState {
  BatchState(int num_blocks, KvTableLayout layout, Clock::time_point start, Proposer* proposer)
      : pool(num_blocks), layout(std::move(layout)), start(start), proposer(proposer) {}

  BlockPool pool;
  KvTableLayout layout;  // the cache's (engine/kv/block_table.h)
  std::vector<GenerationOutput> outputs;
  std::vector<Seq> seqs;
  std::deque<int> waiting;
  std::vector<int> running;  // in admission order
  bool first_token_seen = false;
  Clock::time_point start;
  Proposer* proposer;  // nullptr: no speculation
};

// Gives a sequence's KV blocks back; it will be recomputed from scratch if it runs again.
absl::Status Release(BlockPool* pool, Seq* s) {
  FreeTable(pool, &s->blocks);
  s->num_computed = 0;
  return absl::OkStatus();
}

// Ends a sequence with `reason`, emitting the text still held back when `flush_text`.
absl::Status Finish(BatchState* state, Seq* seq, FinishReason reason, bool flush_text,
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
  return Release(&state->pool, seq);
}

// Admits waiting sequences (FIFO) while their computed-so-far tokens fit: each takes the blocks
// its tokens hold once computed (a sliding group's window at the end); the steps that compute
// them take the rest of what they read.
absl::Status AdmitWaiting(BatchState* batch, int max_batch, int num_blocks) {
  BatchState& state = *batch;
  while (!state.waiting.empty() && static_cast<int>(state.running.size()) < max_batch) {
    Seq& s = state.seqs[state.waiting.front()];
    const int tokens = static_cast<int>(s.tokens.size());
    // At most every block of the prompt is held at once, while its first chunks are computed.
    const int64_t need = state.layout.BlocksHeld(0, tokens);
    if (need > num_blocks) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "request %d: needs %d KV blocks, the cache has %d", s.index, need, num_blocks));
    }
    if (!GrowTable(state.layout, &state.pool, &s.blocks, tokens - 1, tokens).ok()) break;
    state.running.push_back(state.waiting.front());
    state.waiting.pop_front();
  }
  if (state.running.empty()) {
    return absl::ResourceExhaustedError("KV cache too small for the next request");
  }
  return absl::OkStatus();
}

// Schedules one step: decodes first (one token each), then prefill chunks under the token
// budget. Fills the sequences to run and their chunk lengths.
absl::Status ScheduleStep(BatchState* batch, const GeneratorOptions& options, int bs,
                          GenerationStats* stats, std::vector<int>* scheduled,
                          std::vector<int>* chunk_len) {
  BatchState& state = *batch;
  std::vector<int>& running = state.running;
  int budget = options.max_step_tokens;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t r = 0; r < running.size(); ++r) {
      const int id = running[r];
      Seq& s = state.seqs[id];
      int n = static_cast<int>(s.tokens.size()) - s.num_computed;
      const bool is_decode = n == 1 && s.num_computed > 0;
      if (is_decode != (pass == 0)) continue;
      if (options.prefill_chunk > 0) n = std::min(n, options.prefill_chunk);
      n = std::min(n, budget);
      if (n <= 0) continue;
      s.step_tokens.clear();
      if (is_decode && !s.proposals.empty()) {
        // Within the step's token budget: the last token and as many proposals as fit.
        const int k = std::min(static_cast<int>(s.proposals.size()), budget - 1);
        if (k > 0) {
          s.step_tokens.push_back(s.tokens.back());
          s.step_tokens.insert(s.step_tokens.end(), s.proposals.begin(), s.proposals.begin() + k);
          n = k + 1;
        }
      }
      s.proposals.clear();
      // Grow the block table; preempt the most recently admitted sequences if needed.
      const int need = MissingBlocks(state.layout, s.blocks, s.num_computed, s.num_computed + n);
      bool preempted_self = false;
      while (need > 0 && !state.pool.CanAllocate(need)) {
        const int victim = running.back();
        // Never preempt a sequence already scheduled in this step.
        if (std::find(scheduled->begin(), scheduled->end(), victim) != scheduled->end()) break;
        running.pop_back();
        if (absl::Status st = Release(&state.pool, &state.seqs[victim]); !st.ok()) return st;
        state.waiting.push_front(victim);
        ++stats->preemptions;
        if (victim == id) {
          preempted_self = true;
          break;
        }
      }
      if (preempted_self) break;
      if (!GrowTable(state.layout, &state.pool, &s.blocks, s.num_computed, s.num_computed + n)
               .ok()) {
        continue;  // everything left is scheduled: wait for the next step
      }
      scheduled->push_back(id);
      chunk_len->push_back(n);
      budget -= n;
    }
  }
  return absl::OkStatus();
}

// Appends `token`, sampled from `row`, to the sequence, emits it and its text, and ends the
// sequence when it finishes there. Returns whether it did.
absl::StatusOr<bool> EmitToken(BatchState* batch, const ModelConfig& config, Seq* seq,
                               std::span<const float> row, int token,
                               const Generator::TokenCallback& on_token, GenerationStats* stats) {
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
  if (absl::Status st = Finish(&state, &s, *reason, !is_eos && !stopped_by_string, on_token);
      !st.ok()) {
    return st;
  }
  return true;
}

// Asks the proposer for the proposals of every running sequence that decodes this step.
absl::Status ProposeForRunning(BatchState* batch, const ModelConfig& config, int num_tokens) {
  BatchState& state = *batch;
  std::vector<ProposalRequest> requests;
  std::vector<int> ids;
  for (const int id : state.running) {
    Seq& s = state.seqs[id];
    s.proposals.clear();
    const int len = static_cast<int>(s.tokens.size());
    if (s.num_computed == 0 || len - s.num_computed != 1) continue;  // not decoding
    const int room =
        ProposalRoom(num_tokens, s.req->max_tokens, s.generated, len, config.max_seq_len);
    if (room == 0) continue;
    requests.push_back({static_cast<uint64_t>(s.index), s.tokens, room});
    ids.push_back(id);
  }
  if (requests.empty()) return absl::OkStatus();
  std::vector<std::vector<int>> proposals;
  if (absl::Status st = state.proposer->Propose(requests, &proposals); !st.ok()) return st;
  for (size_t i = 0; i < ids.size(); ++i) state.seqs[ids[i]].proposals = std::move(proposals[i]);
  return absl::OkStatus();
}

// A sequence that scored proposals (s.step_tokens) over `rows` (one logit row per input token):
// the verify rule of engine/speculative/proposer.h, then the blocks that held only rejected
// proposals' rows are freed. Returns whether the sequence finished.
absl::StatusOr<bool> VerifyStep(BatchState* state, const ModelConfig& config, int bs, Seq* seq,
                                std::span<const float> rows,
                                const Generator::TokenCallback& on_token, GenerationStats* stats) {
  Seq& s = *seq;
  const std::span<const int> proposals = std::span<const int>(s.step_tokens).subspan(1);
  stats->proposed_tokens += static_cast<int64_t>(proposals.size());
  absl::Status error;
  bool finished = false;
  std::span<const float> row;
  const int kept = VerifyProposals(
      proposals,
      [&](int j) {
        row = rows.subspan(static_cast<size_t>(j) * config.vocab_size, config.vocab_size);
        return Sample(row, s.req->sampling, s.tokens.size(), HistoryOf(*s.req, s.tokens, config));
      },
      [&](int token) {
        ++s.num_computed;  // the row's input: its KV is now part of the sequence
        absl::StatusOr<bool> done = EmitToken(state, config, seq, row, token, on_token, stats);
        if (!done.ok()) error = done.status();
        finished = !done.ok() || *done;
        return finished;
      });
  stats->accepted_tokens += kept;
  if (!error.ok()) return error;
  if (finished) return true;
  // Blocks past the next input's position held only rejected proposals' rows.
  ShrinkTable(state->layout, &state->pool, &s.blocks, static_cast<int>(s.tokens.size()));
  return false;
}

// After a forward call over `scheduled`: advances each sequence by its chunk and, for those whose
// prompt is now all computed, samples the next token (or checks its proposals) from `logits`,
// emits it and checks whether the sequence is done. Finished sequences leave `running`.
absl::Status SampleStep(BatchState* batch, const ModelConfig& config, int bs,
                        const std::vector<int>& scheduled, const std::vector<int>& chunk_len,
                        const std::vector<float>& logits, const Generator::TokenCallback& on_token,
                        GenerationStats* stats) {
  BatchState& state = *batch;
  std::vector<int> done;
  size_t row = 0;  // the first logit row of scheduled[i]
  for (size_t i = 0; i < scheduled.size(); ++i) {
    Seq& s = state.seqs[scheduled[i]];
    const size_t rows = s.step_tokens.empty() ? 1 : s.step_tokens.size();
    const std::span<const float> step_rows(logits.data() + row * config.vocab_size,
                                           rows * config.vocab_size);
    row += rows;
    absl::StatusOr<bool> finished = false;
    if (!s.step_tokens.empty()) {
      finished = VerifyStep(&state, config, bs, &s, step_rows, on_token, stats);
    } else {
      s.num_computed += chunk_len[i];
      if (s.num_computed < static_cast<int>(s.tokens.size())) continue;  // mid-prefill
      const int token =
          Sample(step_rows, s.req->sampling, s.tokens.size(), HistoryOf(*s.req, s.tokens, config));
      finished = EmitToken(&state, config, &s, step_rows, token, on_token, stats);
    }
    if (!finished.ok()) return finished.status();
    if (*finished) done.push_back(s.index);
  }
  if (!done.empty()) {
    std::erase_if(state.running,
                  [&](int id) { return std::find(done.begin(), done.end(), id) != done.end(); });
  }
  return absl::OkStatus();
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
  BatchState state(
      num_blocks,
      runner != nullptr ? runner->kv_spec().table_layout() : cache->spec().table_layout(), start,
      proposer->get());

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
    state.waiting.push_back(static_cast<int>(i));
    stats_.prompt_tokens += static_cast<int64_t>(requests[i].prompt.size());
  }

  std::vector<float> logits;
  while (!state.waiting.empty() || !state.running.empty()) {
    if (absl::Status st = AdmitWaiting(&state, options_.max_batch, num_blocks); !st.ok()) {
      return st;
    }
    if (state.proposer != nullptr) {
      if (absl::Status st = ProposeForRunning(&state, config, options_.speculative.num_tokens);
          !st.ok()) {
        return st;
      }
    }
    std::vector<int> scheduled;
    std::vector<int> chunk_len;
    if (absl::Status st = ScheduleStep(&state, options_, bs, &stats_, &scheduled, &chunk_len);
        !st.ok()) {
      return st;
    }
    if (scheduled.empty()) continue;

    std::vector<SequenceChunk> batch(scheduled.size());
    for (size_t i = 0; i < scheduled.size(); ++i) {
      Seq& s = state.seqs[scheduled[i]];
      batch[i].tokens = s.step_tokens.empty()
                            ? std::span<const int>(s.tokens).subspan(s.num_computed, chunk_len[i])
                            : std::span<const int>(s.step_tokens);
      batch[i].start_pos = s.num_computed;
      batch[i].block_table = s.blocks;
      batch[i].all_logits = !s.step_tokens.empty();
    }
    absl::Status st = runner != nullptr ? runner->Forward(batch, &logits)
                                        : model_->Forward(batch, &*cache, &logits);
    if (!st.ok()) return st;
    ++stats_.steps;
    st = SampleStep(&state, config, bs, scheduled, chunk_len, logits, on_token, &stats_);
    if (!st.ok()) return st;
    // Blocks behind the sliding windows of what the sequences compute next.
    for (int id : state.running) {
      Seq& s = state.seqs[id];
      TrimTable(state.layout, &state.pool, &s.blocks, s.num_computed);
    }
  }
  if (!state.pool.NoneInUse()) return absl::InternalError("generator: KV blocks leaked");
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
  if (ids.size() < 2) return absl::InvalidArgumentError("text: needs at least 2 tokens to score");
  if (static_cast<int64_t>(ids.size()) > c.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("text: %d tokens exceed the context length %d", ids.size(), c.max_seq_len));
  }
  if (top_n < 0 || top_n > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrFormat("top_logprobs: must be in [0, %d], got %d", kMaxTopLogprobs, top_n));
  }
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
    std::span<const float> row(logits.data() + i * c.vocab_size, c.vocab_size);
    const int token = ids[i + 1];
    TokenLogprobs lp = ComputeLogprobs(row, token, top_n);
    ScoredToken t;
    t.logprob = lp.logprob;
    t.rank = 1 + static_cast<int>(std::count_if(row.begin(), row.end(),
                                                [&](float v) { return v > row[token]; }));
    t.top = std::move(lp.top);
    out.push_back(std::move(t));
  }
  return out;
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
