#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/model_runner.h"
#include "engine/stop.h"

namespace tandem {

std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kContext:
      return "context";
  }
  return "?";
}

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

absl::Status ValidateRequest(const GenerationRequest& r, const ModelConfig& config,
                             const Tokenizer* tokenizer) {
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt: must not be empty");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("prompt: token id %d at index %d is outside the vocabulary [0, %d)",
                          r.prompt[i], i, config.vocab_size));
    }
  }
  if (static_cast<int64_t>(r.prompt.size()) >= config.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("prompt: %d tokens leave no room in the context length %d", r.prompt.size(),
                        config.max_seq_len));
  }
  if (r.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_tokens: must be >= 1, got %d", r.max_tokens));
  }
  if (absl::Status s = r.sampling.Validate(config.vocab_size); !s.ok()) return s;
  if (r.output_tokens < 0 || r.output_tokens >= static_cast<int64_t>(r.prompt.size())) {
    return absl::InvalidArgumentError(absl::StrFormat("output_tokens: must be in [0, %d), got %d",
                                                      r.prompt.size(), r.output_tokens));
  }
  if (r.sampling.min_tokens > r.max_tokens + r.output_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat("min_tokens: %d is more than max_tokens (%d)",
                                                      r.sampling.min_tokens,
                                                      r.max_tokens + r.output_tokens));
  }
  if (!r.sampling.json_schema.empty()) {
    if (r.ignore_eos) {
      return absl::InvalidArgumentError("ignore_eos: cannot be combined with json_schema");
    }
    if (r.sampling.min_tokens > 0) {
      return absl::InvalidArgumentError("min_tokens: cannot be combined with json_schema");
    }
    if (r.sampling.constraint == nullptr) {
      return absl::FailedPreconditionError("json_schema: not compiled for this model");
    }
  }
  if (!r.stop_strings.empty() && tokenizer == nullptr) {
    return absl::InvalidArgumentError("stop_strings: need a tokenizer");
  }
  return absl::OkStatus();
}

std::optional<FinishReason> CheckFinish(const ModelConfig& config, const GenerationRequest& r,
                                        int token, int generated, int total_len) {
  if (!r.ignore_eos && std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), token) !=
                           config.eos_token_ids.end()) {
    return FinishReason::kStop;
  }
  if (generated >= r.max_tokens) return FinishReason::kLength;
  if (total_len >= config.max_seq_len) return FinishReason::kContext;
  return std::nullopt;
}

SamplingHistory HistoryOf(std::span<const int> tokens, size_t prompt_tokens,
                          const ModelConfig& config) {
  const size_t prompt = std::min(tokens.size(), prompt_tokens);
  return {tokens.first(prompt), tokens.subspan(prompt), config.eos_token_ids};
}

SamplingHistory HistoryOf(const GenerationRequest& r, std::span<const int> tokens,
                          const ModelConfig& config) {
  return HistoryOf(tokens, r.prompt.size() - r.output_tokens, config);
}

Generator::Generator(const Model* model, const Tokenizer* tokenizer, GeneratorOptions options)
    : model_(model), tokenizer_(tokenizer), options_(options) {}

namespace {

struct Seq {
  int index = 0;
  const GenerationRequest* req = nullptr;
  std::vector<int> tokens;  // prompt + generated
  int num_computed = 0;     // tokens whose KV is in the cache
  std::vector<int> blocks;  // block table
  int generated = 0;
  std::optional<IncrementalDecoder> decoder;
  std::optional<StopStringMatcher> stop;
};

int BlocksFor(int tokens, int block_size) { return (tokens + block_size - 1) / block_size; }

}  // namespace

absl::StatusOr<std::vector<GenerationOutput>> Generator::Generate(
    std::span<const GenerationRequest> requests, const TokenCallback& on_token) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  stats_ = GenerationStats();
  if (absl::Status s = options_.Validate(); !s.ok()) return s;
  const ModelConfig& config = model_->config();
  // Requests asking for structured output get their constraint compiled for this model.
  std::vector<GenerationRequest> attached;
  for (const GenerationRequest& r : requests) {
    if (!r.sampling.json_schema.empty() && r.sampling.constraint == nullptr) {
      attached.assign(requests.begin(), requests.end());
      for (size_t i = 0; i < attached.size(); ++i) {
        if (absl::Status s = AttachConstraint(options_.constraints.get(), &attached[i].sampling);
            !s.ok()) {
          return absl::Status(s.code(), absl::StrFormat("request %d: %s", i, s.message()));
        }
      }
      requests = attached;
      break;
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (absl::Status s = ValidateRequest(requests[i], config, tokenizer_); !s.ok()) {
      return absl::Status(s.code(), absl::StrFormat("request %d: %s", i, s.message()));
    }
  }
  ModelRunner* runner = options_.runner;
  const int bs = runner != nullptr ? runner->block_size() : options_.block_size;
  int num_blocks = runner != nullptr ? runner->num_blocks() : options_.num_blocks;
  if (num_blocks == 0) {
    for (const auto& r : requests) {
      const int64_t len = std::min<int64_t>(static_cast<int64_t>(r.prompt.size()) + r.max_tokens,
                                            config.max_seq_len);
      num_blocks += BlocksFor(static_cast<int>(len), bs);
    }
    num_blocks =
        std::min(num_blocks,
                 KvCacheSpec::For(config, bs, options_.kv_dtype).BlocksIn(options_.max_kv_bytes));
    num_blocks = std::max(num_blocks, 1);
  }
  absl::StatusOr<KvCache> cache = absl::FailedPreconditionError("the runner holds the cache");
  if (runner == nullptr) {
    cache = KvCache::Create(config, num_blocks, bs, options_.max_kv_bytes, options_.kv_dtype);
    if (!cache.ok()) return cache.status();
  }
  BlockPool pool(num_blocks);

  std::vector<GenerationOutput> outputs(requests.size());
  std::vector<Seq> seqs(requests.size());
  std::deque<int> waiting;
  for (size_t i = 0; i < requests.size(); ++i) {
    Seq& s = seqs[i];
    s.index = static_cast<int>(i);
    s.req = &requests[i];
    s.tokens = requests[i].prompt;
    if (tokenizer_ != nullptr) {
      s.decoder.emplace(tokenizer_, requests[i].prompt);
      s.stop.emplace(requests[i].stop_strings);
    }
    waiting.push_back(static_cast<int>(i));
    stats_.prompt_tokens += static_cast<int64_t>(requests[i].prompt.size());
  }
  std::vector<int> running;  // in admission order
  bool first_token_seen = false;

  auto release = [&](Seq& s) -> absl::Status {
    absl::Status st = pool.Free(s.blocks);
    s.blocks.clear();
    s.num_computed = 0;
    return st;
  };
  auto finish = [&](Seq& s, FinishReason reason, bool flush_text) -> absl::Status {
    GenerationOutput& out = outputs[s.index];
    out.finish = reason;
    if (flush_text && s.decoder) {
      bool stopped = false;
      std::string tail = s.stop->Add(s.decoder->Flush(), &stopped);
      if (!stopped) tail += s.stop->Flush();
      out.text += tail;
      if (!tail.empty() && on_token) on_token(s.index, -1, tail);
    }
    return release(s);
  };

  std::vector<float> logits;
  while (!waiting.empty() || !running.empty()) {
    // Admit waiting sequences (FIFO) while their computed-so-far tokens fit.
    while (!waiting.empty() && static_cast<int>(running.size()) < options_.max_batch) {
      Seq& s = seqs[waiting.front()];
      const int need = BlocksFor(static_cast<int>(s.tokens.size()), bs);
      if (need > num_blocks) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "request %d: needs %d KV blocks, the cache has %d", s.index, need, num_blocks));
      }
      if (!pool.CanAllocate(need)) break;
      auto blocks = pool.Allocate(need);
      if (!blocks.ok()) return blocks.status();
      s.blocks = *blocks;
      running.push_back(waiting.front());
      waiting.pop_front();
    }
    if (running.empty()) {
      return absl::ResourceExhaustedError("KV cache too small for the next request");
    }

    // Schedule: decodes first (one token each), then prefill chunks under the token budget.
    std::vector<int> scheduled;
    std::vector<int> chunk_len;
    int budget = options_.max_step_tokens;
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t r = 0; r < running.size(); ++r) {
        const int id = running[r];
        Seq& s = seqs[id];
        int n = static_cast<int>(s.tokens.size()) - s.num_computed;
        const bool is_decode = n == 1 && s.num_computed > 0;
        if (is_decode != (pass == 0)) continue;
        if (options_.prefill_chunk > 0) n = std::min(n, options_.prefill_chunk);
        n = std::min(n, budget);
        if (n <= 0) continue;
        // Grow the block table; preempt the most recently admitted sequences if needed.
        const int need = BlocksFor(s.num_computed + n, bs) - static_cast<int>(s.blocks.size());
        bool preempted_self = false;
        while (need > 0 && !pool.CanAllocate(need)) {
          const int victim = running.back();
          // Never preempt a sequence already scheduled in this step.
          if (std::find(scheduled.begin(), scheduled.end(), victim) != scheduled.end()) break;
          running.pop_back();
          if (absl::Status st = release(seqs[victim]); !st.ok()) return st;
          waiting.push_front(victim);
          ++stats_.preemptions;
          if (victim == id) {
            preempted_self = true;
            break;
          }
        }
        if (preempted_self) break;
        if (need > 0) {
          auto more = pool.Allocate(need);
          if (!more.ok()) continue;  // everything left is scheduled: wait for the next step
          s.blocks.insert(s.blocks.end(), more->begin(), more->end());
        }
        scheduled.push_back(id);
        chunk_len.push_back(n);
        budget -= n;
      }
    }
    if (scheduled.empty()) continue;

    std::vector<SequenceChunk> batch(scheduled.size());
    for (size_t i = 0; i < scheduled.size(); ++i) {
      Seq& s = seqs[scheduled[i]];
      batch[i].tokens = std::span<const int>(s.tokens).subspan(s.num_computed, chunk_len[i]);
      batch[i].start_pos = s.num_computed;
      batch[i].block_table = s.blocks;
    }
    absl::Status st = runner != nullptr ? runner->Forward(batch, &logits)
                                        : model_->Forward(batch, &*cache, &logits);
    if (!st.ok()) return st;
    ++stats_.steps;

    std::vector<int> done;
    for (size_t i = 0; i < scheduled.size(); ++i) {
      Seq& s = seqs[scheduled[i]];
      s.num_computed += chunk_len[i];
      if (s.num_computed < static_cast<int>(s.tokens.size())) continue;  // mid-prefill
      std::span<const float> row(logits.data() + i * config.vocab_size, config.vocab_size);
      const int token =
          Sample(row, s.req->sampling, s.tokens.size(), HistoryOf(*s.req, s.tokens, config));
      s.tokens.push_back(token);
      ++s.generated;
      ++stats_.generated_tokens;
      GenerationOutput& out = outputs[s.index];
      out.tokens.push_back(token);
      if (s.req->sampling.logprobs) {
        out.logprobs.push_back(ComputeLogprobs(row, token, s.req->sampling.top_logprobs));
      }
      if (!first_token_seen && s.index == 0) {
        first_token_seen = true;
        stats_.first_token_seconds = std::chrono::duration<double>(Clock::now() - start).count();
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
      if (reason) {
        if (absl::Status st = finish(s, *reason, !is_eos && !stopped_by_string); !st.ok())
          return st;
        done.push_back(s.index);
      }
    }
    if (!done.empty()) {
      std::erase_if(running,
                    [&](int id) { return std::find(done.begin(), done.end(), id) != done.end(); });
    }
  }
  if (!pool.NoneInUse()) return absl::InternalError("generator: KV blocks leaked");
  stats_.total_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return outputs;
}

absl::StatusOr<std::vector<float>> ScoreTokens(const Model& model, std::span<const int> ids,
                                               DType kv_dtype) {
  const ModelConfig& c = model.config();
  if (ids.size() < 2) return absl::InvalidArgumentError("text: needs at least 2 tokens to score");
  if (static_cast<int64_t>(ids.size()) > c.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("text: %d tokens exceed the context length %d", ids.size(), c.max_seq_len));
  }
  const int bs = 16;
  const int nb = BlocksFor(static_cast<int>(ids.size()), bs);
  auto cache = KvCache::Create(c, nb, bs, 0, kv_dtype);
  if (!cache.ok()) return cache.status();
  std::vector<int> table(nb);
  for (int i = 0; i < nb; ++i) table[i] = i;
  SequenceChunk chunk{ids, 0, table, /*all_logits=*/true};
  std::vector<float> logits;
  if (absl::Status s = model.Forward({&chunk, 1}, &*cache, &logits); !s.ok()) return s;
  std::vector<float> out;
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    std::span<const float> row(logits.data() + i * c.vocab_size, c.vocab_size);
    out.push_back(ComputeLogprobs(row, ids[i + 1], 0).logprob);
  }
  return out;
}

}  // namespace tandem
