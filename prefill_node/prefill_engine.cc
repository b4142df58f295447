#include "prefill_node/prefill_engine.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/generator.h"
#include "kernels/cpu/core_share.h"
#include "kv_transfer/kv_pack.h"
#include "kv_transfer/runner_kv.h"

namespace tandem {

absl::Status PrefillEngineOptions::Validate() const {
  if (num_blocks < 0) return absl::InvalidArgumentError("num_blocks must be >= 0");
  if (block_size < 1 || block_size > 4096) {
    return absl::InvalidArgumentError("block_size must be in [1, 4096]");
  }
  if (scheduler.token_budget < 1 || scheduler.chunk_size < 1 || scheduler.max_batch < 1) {
    return absl::InvalidArgumentError("token_budget, chunk_size and max_batch must be >= 1");
  }
  return absl::OkStatus();
}

ModelRunnerOptions PrefillEngineOptions::Runner() const {
  ModelRunnerOptions ro;
  ro.num_blocks = num_blocks;
  ro.block_size = block_size;
  ro.max_batch_tokens = scheduler.token_budget;
  ro.max_seqs = scheduler.max_batch;
  ro.kv_dtype = kv_dtype;
  return ro;
}

absl::StatusOr<std::unique_ptr<PrefillEngine>> PrefillEngine::Create(const Model* model,
                                                                     KvSender* sender,
                                                                     PrefillEngineOptions options,
                                                                     PrefillMetrics* metrics) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  const ModelConfig& c = model->config();
  const KvCacheSpec spec = KvCacheSpec::For(c, options.block_size, options.kv_dtype);
  if (options.num_blocks == 0) options.num_blocks = spec.BlocksIn(options.max_kv_bytes);
  // At least one context-length prompt must fit (every block of it: a prefill holds them all).
  const int min_blocks = spec.table_layout().Entries(c.max_seq_len);
  if (options.num_blocks < min_blocks) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("the prefill KV cache (%d blocks) cannot hold one %d-token prompt "
                        "(%d blocks): raise --kv-bytes or --num-blocks",
                        options.num_blocks, c.max_seq_len, min_blocks));
  }
  auto runner = MakeModelRunner(options.device, model, options.Runner());
  if (!runner.ok()) return runner.status();
  std::unique_ptr<PrefillEngine> e(
      new PrefillEngine(model, sender, options, std::move(*runner), metrics));
  e->loop_ = std::thread([p = e.get()] { p->Loop(); });
  return e;
}

PrefillEngine::PrefillEngine(const Model* model, KvSender* sender, PrefillEngineOptions options,
                             std::unique_ptr<ModelRunner> runner, PrefillMetrics* metrics)
    : model_(model),
      sender_(sender),
      options_(options),
      metrics_(metrics),
      runner_(std::move(runner)),
      scheduler_(options.scheduler),
      cache_(options.num_blocks, runner_->kv_spec().table_layout()),
      send_spec_(KvCacheSpec::For(model->config(), options.block_size, options.kv_dtype)),
      health_(options.faults) {}

PrefillEngine::~PrefillEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    health_.Stop();
  }
  work_cv_.notify_all();
  if (loop_.joinable()) loop_.join();
}

absl::StatusOr<PrefillResult> PrefillEngine::Prefill(uint64_t request_id, std::vector<int> prompt,
                                                     const SamplingParams& sampling,
                                                     const KvTarget& target, absl::Time deadline,
                                                     const std::function<bool()>& cancelled,
                                                     int output_tokens,
                                                     absl::Duration compute_timeout) {
  GenerationRequest check;
  check.prompt = prompt;
  check.sampling = sampling;
  if (absl::Status s = AttachConstraint(options_.constraints.get(), &check.sampling); !s.ok()) {
    return s;
  }
  check.output_tokens = output_tokens;
  check.max_tokens = model_->config().max_seq_len;  // the decode worker checks the real one
  if (absl::Status s = ValidateRequest(check, model_->config(), nullptr); !s.ok()) return s;
  if (cancelled && cancelled()) return absl::CancelledError("prefill cancelled");
  const int len = static_cast<int>(prompt.size());
  auto job = std::make_shared<Job>();
  job->id = request_id;
  job->sampling = check.sampling;
  job->output_tokens = output_tokens;
  job->target = target;
  job->enqueued = absl::Now();
  if (absl::Status s = RunJob(job, std::move(prompt), deadline, cancelled, compute_timeout);
      !s.ok()) {
    sender_->Forget(target);
    return s;
  }
  const absl::Time computed = absl::Now();
  // The transfer is part of the prefill's work: its acknowledgements are waited for within the
  // same timeout after the compute (a chunk the decode side never acknowledges must not hold
  // the request).
  const absl::Time ack_deadline = compute_timeout == absl::InfiniteDuration()
                                      ? deadline
                                      : std::min(deadline, computed + compute_timeout);
  absl::Status acked = sender_->Wait(target, ack_deadline);
  sender_->Forget(target);
  if (!acked.ok()) {
    if (metrics_) metrics_->kv_transfer_failures.Increment();
    // The router resumes ABORTED and DATA_LOSS elsewhere without blaming this worker: the
    // decode side refused, lost or never acknowledged the KV. The deadline stays itself.
    if (acked.code() == absl::StatusCode::kDeadlineExceeded ||
        acked.code() == absl::StatusCode::kDataLoss) {
      return acked;
    }
    return absl::AbortedError(
        absl::StrFormat("kv transfer to %s failed: %s", target.endpoint, acked.message()));
  }
  if (metrics_) {
    metrics_->prompt_tokens.Increment(len);
    if (job->first_send != absl::InfinitePast()) {
      metrics_->kv_transfer_time.Observe(absl::ToDoubleSeconds(absl::Now() - job->first_send));
    }
  }
  PrefillResult r;
  r.first_token = job->first_token;
  r.first_logprobs = job->first_logprobs;
  r.cached_tokens = job->cached;
  r.queue_seconds = absl::ToDoubleSeconds(job->started - job->enqueued);
  r.compute_seconds = job->compute_seconds;
  r.transfer_seconds = absl::ToDoubleSeconds(absl::Now() - computed);
  return r;
}

absl::Status PrefillEngine::TakeBlocksLocked(Job& job, std::span<const int> prompt) {
  const int len = static_cast<int>(prompt.size());
  job.blocks.clear();
  job.cached = 0;
  // Prefix cache: reuse full blocks of the prompt, but always compute the last token (its logits
  // give the first token). A prompt scored needs every position's logits: it reuses none.
  if (options_.prefix_cache && !job.scoring()) {
    KvCacheManager::Prefix hit = cache_.MatchPrefix(prompt, (len - 1) / options_.block_size);
    job.blocks = std::move(hit.blocks);
    job.cached = hit.tokens;
  }
  auto fresh = cache_.Allocate(cache_.layout().Entries(len) - static_cast<int>(job.blocks.size()));
  if (!fresh.ok()) {
    cache_.Free(job.blocks).IgnoreError();
    job.blocks.clear();
    job.cached = 0;
    return fresh.status();
  }
  job.blocks.insert(job.blocks.end(), fresh->begin(), fresh->end());
  return absl::OkStatus();
}

absl::Status PrefillEngine::SendRange(Job& job, int layer, int start, int count) {
  if (job.scoring()) return absl::OkStatus();  // its KV stays here
  // A sliding-window layer is sent from the window the decode worker reads on.
  const int from = send_spec_.KeepFrom(layer, static_cast<int>(job.prompt.size()));
  if (start < from) {
    count -= from - start;
    start = from;
  }
  if (count <= 0) return absl::OkStatus();
  auto payload = PackRunnerKv(*runner_, layer, job.blocks, start, count);
  if (!payload.ok()) return payload.status();
  KvChunkHeader h = MakeRunnerKvHeader(*runner_, job.id, layer, start, count);
  const size_t bytes = payload->size();
  if (job.first_send == absl::InfinitePast()) job.first_send = absl::Now();
  absl::Status s = sender_->Send(job.target, h, std::move(*payload));
  if (s.ok() && metrics_) metrics_->kv_transfer_bytes.Increment(static_cast<double>(bytes));
  return s;
}

void PrefillEngine::FinishLocked(Job& job) {
  // Full blocks of a completed prompt become reusable prefixes; the rest go back to the pool.
  if (job.status.ok() && options_.prefix_cache) cache_.Publish(job.prompt, job.blocks);
  cache_.Free(job.blocks).IgnoreError();
  job.blocks.clear();
  job.done = true;
  done_cv_.notify_all();
}

void PrefillEngine::Loop() {
  const ModelConfig& c = model_->config();
  std::vector<float> logits;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    health_.Beat();
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if (it->second->cancelled) {
        scheduler_.Remove(it->first);
        FinishLocked(*it->second);
        jobs_.erase(it++);
      } else {
        ++it;
      }
    }
    std::vector<PrefillScheduler::Work> work = scheduler_.Schedule();
    if (work.empty()) {
      work_cv_.wait_for(lock, std::chrono::milliseconds(50));
      continue;
    }
    std::vector<std::shared_ptr<Job>> batch_jobs;
    std::vector<SequenceChunk> batch;
    for (const auto& w : work) {
      std::shared_ptr<Job> job = jobs_.at(w.id);
      if (job->started == absl::Time()) {
        job->started = absl::Now();
        if (metrics_) {
          metrics_->num_requests_waiting.Decrement();
          metrics_->num_requests_running.Increment();
          metrics_->queue_time.Observe(absl::ToDoubleSeconds(job->started - job->enqueued));
        }
      }
      const int64_t computing = std::min<int64_t>(w.count, job->uncomputed);
      job->uncomputed -= computing;
      if (metrics_) metrics_->prompt_tokens_waiting.Decrement(static_cast<double>(computing));
      batch_jobs.push_back(job);
      batch.push_back({std::span<const int>(job->prompt).subspan(w.start, w.count), w.start,
                       job->blocks, /*all_logits=*/job->scoring()});
    }
    lock.unlock();
    // KV of a prefix-cache hit is sent as it is: the decode worker has none of it.
    for (auto& job : batch_jobs) {
      if (job->cached > 0 && !job->cached_sent) {
        for (int l = 0; l < c.n_layers; ++l) SendRange(*job, l, 0, job->cached).IgnoreError();
        job->cached_sent = true;
      }
    }
    const absl::Time t0 = absl::Now();
    // The step's loops and layers note progress to health (kernels/step_progress.h).
    const StepProgress::Scope progress = health_.StepScope();
    absl::Status st = health_.BeforeStep();
    if (st.ok()) {
      // Colocated with a decode engine on the CPU, this step's loops take turns with its steps
      // (kernels/cpu/core_share.h).
      CoreShare::PrefillStep turn(CoreShare::Process());
      st = runner_->Forward(batch, &logits, [&](int layer) {
        StepProgress::NoteHere();
        for (size_t i = 0; i < work.size(); ++i) {
          if (batch_jobs[i]->cancelled) continue;
          // Errors surface in the sender's Wait; a refused lease stops further sends there.
          SendRange(*batch_jobs[i], layer, work[i].start, work[i].count).IgnoreError();
        }
      });
    }
    const double step_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    if (metrics_) {
      int tokens = 0;
      for (const auto& w : work) tokens += w.count;
      metrics_->batch_tokens.Observe(tokens);
      metrics_->iteration_tokens.Observe(tokens);
      metrics_->step_time.Observe(step_seconds);
    }
    lock.lock();
    health_.StepDone(st);
    // The logits rows: one per work, or one per position of a scored prompt's chunk.
    size_t row0 = 0;
    for (size_t i = 0; i < work.size(); ++i) {
      Job& job = *batch_jobs[i];
      const size_t first_row = row0;
      row0 += job.scoring() ? static_cast<size_t>(work[i].count) : 1;
      job.compute_seconds += step_seconds;
      if (job.done) continue;
      if (st.ok() && job.scoring() && !job.cancelled) ScoreChunk(job, work[i], logits, first_row);
      if (!st.ok()) {
        job.status = st;
      } else if (!work[i].last || job.cancelled) {
        continue;
      } else if (!job.scoring()) {
        std::span<const float> row(logits.data() + first_row * c.vocab_size, c.vocab_size);
        job.first_token = Sample(row, job.sampling, job.prompt.size(),
                                 HistoryOf(job.prompt, job.prompt.size() - job.output_tokens, c));
        if (job.sampling.logprobs) {
          job.first_logprobs = ComputeLogprobs(row, job.first_token, job.sampling.top_logprobs);
        }
      }
      scheduler_.Remove(work[i].id);
      FinishLocked(job);
      jobs_.erase(work[i].id);
    }
  }
}

absl::Status PrefillEngine::RunJob(const std::shared_ptr<Job>& job, std::vector<int> prompt,
                                   absl::Time deadline, const std::function<bool()>& cancelled,
                                   absl::Duration compute_timeout) {
  const int len = static_cast<int>(prompt.size());
  const int bs = options_.block_size;
  std::unique_lock<std::mutex> lock(mu_);
  if (health_.draining())
    return absl::UnavailableError("prefill worker is draining (shutting down)");
  // The prompt's blocks. While other prompts hold the pool, wait for them to finish (within
  // the deadline) rather than fail: an empty pool holds any prompt (Create's check).
  while (true) {
    absl::Status taken = TakeBlocksLocked(*job, prompt);
    if (taken.ok()) break;
    if (jobs_.empty() || !absl::IsResourceExhausted(taken)) return taken;
    done_cv_.wait_for(lock, std::chrono::milliseconds(10));
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrFormat("prefill deadline passed waiting for KV blocks: %s", taken.message()));
    }
    if (cancelled && cancelled()) return absl::CancelledError("prefill cancelled");
    if (health_.draining())
      return absl::UnavailableError("prefill worker is draining (shutting down)");
  }
  if (options_.prefix_cache && !job->scoring()) {
    // Full blocks looked up until the first miss, and the hits.
    const int hits = job->cached / bs;
    prefix_queries_ += std::min((len - 1) / bs, hits + 1);
    prefix_hits_ += hits;
    if (metrics_) {
      metrics_->prefix_cache_queries.Increment(len);
      metrics_->prefix_cache_hits.Increment(job->cached);
    }
  }
  job->prompt = std::move(prompt);
  uint64_t id = next_job_++;
  if (absl::Status s = scheduler_.Add(id, len, job->cached); !s.ok()) {
    cache_.Free(job->blocks).IgnoreError();
    return s;
  }
  jobs_[id] = job;
  job->uncomputed = len - job->cached;
  if (metrics_) {
    metrics_->num_requests_waiting.Increment();
    metrics_->prompt_tokens_waiting.Increment(static_cast<double>(job->uncomputed));
  }
  work_cv_.notify_one();
  // Wait for the compute, watching for cancellation and the deadline.
  while (!job->done) {
    done_cv_.wait_for(lock, std::chrono::milliseconds(10));
    if (job->done) break;
    const absl::Time now = absl::Now();
    const bool expired = now >= deadline;
    // Computing (however slowly: a loaded machine, other prompts' chunks between this one's)
    // is not stalling: the timeout counts from the later of the start and the engine's last
    // progress.
    const bool stalled =
        job->started != absl::Time() &&
        now - std::max(job->started, now - health_.SinceProgress()) >= compute_timeout;
    if (expired || stalled || (cancelled && cancelled())) {
      job->cancelled = true;
      job->status = expired   ? absl::DeadlineExceededError("prefill deadline passed")
                    : stalled ? absl::DeadlineExceededError(
                                    absl::StrFormat("prefill made no progress for %s after it "
                                                    "started (--prefill-timeout-ms)",
                                                    absl::FormatDuration(compute_timeout)))
                              : absl::CancelledError("prefill cancelled");
      work_cv_.notify_one();
      done_cv_.wait(lock, [&] { return job->done; });
    }
  }
  if (metrics_) {
    (job->started == absl::Time() ? metrics_->num_requests_waiting : metrics_->num_requests_running)
        .Decrement();
    metrics_->prompt_tokens_waiting.Decrement(static_cast<double>(job->uncomputed));
  }
  job->uncomputed = 0;
  return job->status;
}

void PrefillEngine::ScoreChunk(Job& job, const PrefillScheduler::Work& w,
                               const std::vector<float>& logits, size_t first_row) {
  const int vocab = model_->config().vocab_size;
  const int len = static_cast<int>(job.prompt.size());
  for (int p = w.start; p < w.start + w.count && p + 1 < len; ++p) {
    const size_t row = first_row + static_cast<size_t>(p - w.start);
    job.scored.push_back(ScoreRow({logits.data() + row * vocab, static_cast<size_t>(vocab)},
                                  job.prompt[p + 1], job.score_top));
  }
}

absl::StatusOr<std::vector<ScoredToken>> PrefillEngine::Score(
    std::span<const int> ids, int top_n, absl::Time deadline,
    const std::function<bool()>& cancelled) {
  if (absl::Status s = ValidateScore(model_->config(), ids, top_n); !s.ok()) return s;
  // The device runner's logit rows are sized for sampling, not a chunk's every position: there,
  // the model's host forward pass scores, in the worker's KV dtype.
  if (options_.device != "cpu") return ScoreTokensTop(*model_, ids, top_n, options_.kv_dtype);
  auto job = std::make_shared<Job>();
  job->score_top = top_n;
  job->enqueued = absl::Now();
  if (absl::Status s = RunJob(job, std::vector<int>(ids.begin(), ids.end()), deadline, cancelled,
                              absl::InfiniteDuration());
      !s.ok()) {
    return s;
  }
  if (metrics_) metrics_->prompt_tokens.Increment(static_cast<double>(ids.size()));
  return std::move(job->scored);
}

WorkerLoadSnapshot PrefillEngine::Load() const {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerLoadSnapshot l;
  l.queue_depth = scheduler_.num_waiting();
  l.running = static_cast<int>(jobs_.size());
  l.free_blocks = cache_.num_available();
  l.total_blocks = cache_.num_blocks();
  l.block_size = options_.block_size;
  return l;
}

bool PrefillEngine::Idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.empty() && scheduler_.empty() && cache_.NoneInUse();
}

}  // namespace tandem
