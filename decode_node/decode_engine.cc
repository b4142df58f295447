#include "decode_node/decode_engine.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/sampling/sampler.h"
#include "kernels/cpu/core_share.h"
#include "kv_transfer/kv_pack.h"
#include "kv_transfer/runner_kv.h"

namespace tandem {

absl::Status DecodeEngineOptions::Validate() const {
  if (num_blocks < 0) return absl::InvalidArgumentError("num_blocks must be >= 0");
  if (block_size < 1 || block_size > 4096) {
    return absl::InvalidArgumentError("block_size must be in [1, 4096]");
  }
  if (max_running < 1) return absl::InvalidArgumentError("max_running must be >= 1");
  if (lease_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease_timeout must be positive");
  }
  return absl::OkStatus();
}

ModelRunnerOptions DecodeEngineOptions::Runner() const {
  const int per_seq = speculative.enabled() ? 1 + speculative.num_tokens : 1;
  ModelRunnerOptions ro;
  ro.num_blocks = num_blocks;
  ro.block_size = block_size;
  ro.max_batch_tokens = max_running * per_seq + recompute_budget;
  ro.max_seqs = max_running;
  ro.max_logit_rows = max_running * per_seq;
  ro.kv_dtype = kv_dtype;
  return ro;
}

// A draft model runs on the worker's device, with room for as many tokens as its cache.
DraftRunnerOptions DecodeEngineOptions::Draft() const {
  DraftRunnerOptions draft;
  draft.device = device;
  draft.num_blocks = num_blocks;
  draft.block_size = block_size;
  draft.max_seqs = max_running;
  draft.max_step_tokens = max_running + recompute_budget;
  return draft;
}

DecodeScheduler::Options DecodeEngineOptions::Scheduler(
    const std::vector<int>& group_window) const {
  return DecodeScheduler::Options{num_blocks,       block_size, max_running, watermark,
                                  recompute_budget, admission,  group_window};
}

absl::StatusOr<std::unique_ptr<DecodeEngine>> DecodeEngine::Create(const Model* model,
                                                                   DecodeEngineOptions options,
                                                                   DecodeMetrics* metrics) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  const ModelConfig& c = model->config();
  const KvCacheSpec spec = KvCacheSpec::For(c, options.block_size, options.kv_dtype);
  if (options.num_blocks == 0) {
    options.num_blocks = spec.BlocksIn(options.max_kv_bytes);
    if (options.num_blocks < 1) return absl::ResourceExhaustedError("max_kv_bytes holds no block");
  }
  auto proposer = MakeProposer(options.speculative, c, options.Draft());
  if (!proposer.ok()) return proposer.status();
  const ModelRunnerOptions ro = options.Runner();
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner;
  if (options.cpu_samples_rows && options.device == "cpu") {
    auto cache = KvCache::Create(c, ro.num_blocks, ro.block_size, 0, ro.kv_dtype);
    if (!cache.ok()) return cache.status();
    runner = MakeCpuModelRunner(model, std::move(*cache), /*samples_rows=*/true);
  } else {
    runner = MakeModelRunner(options.device, model, ro);
  }
  if (!runner.ok()) return runner.status();
  std::unique_ptr<DecodeEngine> e(new DecodeEngine(model, options, std::move(*runner), metrics));
  e->proposer_ = std::move(*proposer);
  auto receiver = options.make_receiver ? options.make_receiver(e.get())
                                        : MakeKvReceiver(options.transport, options.listen, e.get(),
                                                         options.receiver);
  if (!receiver.ok()) return receiver.status();
  e->receiver_ = std::move(*receiver);
  e->kv_endpoint_ = e->receiver_->endpoint();
  if (options.transport == "tcp" && !options.advertise_host.empty()) {
    // "tcp://HOST:PORT": keep the bound port, replace the host.
    const std::string port = e->kv_endpoint_.substr(e->kv_endpoint_.rfind(':') + 1);
    e->kv_endpoint_ = options.advertise_host.find(':') == std::string::npos
                          ? absl::StrCat("tcp://", options.advertise_host, ":", port)
                          : absl::StrCat("tcp://[", options.advertise_host, "]:", port);
  }
  e->loop_ = std::thread([p = e.get()] { p->Loop(); });
  e->notifier_ = std::thread([p = e.get()] { p->Notifier(); });
  return e;
}

DecodeEngine::DecodeEngine(const Model* model, DecodeEngineOptions options,
                           std::unique_ptr<ModelRunner> runner, DecodeMetrics* metrics)
    : model_(model),
      options_(options),
      metrics_(metrics),
      runner_(std::move(runner)),
      kv_spec_(runner_->kv_spec()),
      scheduler_(options.Scheduler(kv_spec_.group_window)),
      health_(options.faults) {}

DecodeEngine::~DecodeEngine() {
  if (receiver_) receiver_->Shutdown();  // no sink call after this
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    health_.Stop();
  }
  work_cv_.notify_all();
  notify_cv_.notify_all();
  if (loop_.joinable()) loop_.join();
  if (notifier_.joinable()) notifier_.join();
}

absl::StatusOr<DecodeEngine::Admission> DecodeEngine::Admit(GenerationRequest request) {
  const ModelConfig& c = model_->config();
  if (absl::Status s = AttachConstraint(options_.constraints.get(), &request.sampling); !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateRequest(request, c, nullptr); !s.ok()) return s;
  const int prompt_len = static_cast<int>(request.prompt.size());
  const int total =
      static_cast<int>(std::min<int64_t>(int64_t{prompt_len} + request.max_tokens, c.max_seq_len));
  std::lock_guard<std::mutex> lock(mu_);
  if (health_.draining())
    return absl::UnavailableError("decode worker is draining (shutting down)");
  if (kv_endpoint_.empty()) {
    return absl::UnavailableError("decode worker: KV endpoint not set yet (still starting)");
  }
  const uint64_t handle = next_handle_++;
  auto blocks = scheduler_.Admit(handle, prompt_len, total);
  if (!blocks.ok()) return blocks.status();
  // A sliding-window layer's KV is expected from its window on: the rest is never read here.
  std::vector<int> layer_from(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) layer_from[l] = kv_spec_.KeepFrom(l, prompt_len);
  auto lease = leases_.Create(*blocks, prompt_len, std::move(layer_from),
                              absl::Now() + options_.lease_timeout);
  if (!lease.ok()) {
    scheduler_.Release(handle);
    return lease.status();
  }
  Request& r = requests_[handle];
  r.req = request;
  r.tokens = request.prompt;
  r.lease_id = lease->id;
  lease_to_handle_[lease->id] = handle;
  UpdateGaugesLocked();
  return Admission{handle, KvTarget{kv_endpoint_, lease->id, lease->generation, lease->capability}};
}

absl::Status DecodeEngine::CheckHeader(const KvChunkHeader& h) {
  std::lock_guard<std::mutex> lock(mu_);
  return CheckHeaderLocked(h).status();
}

absl::StatusOr<std::span<const int>> DecodeEngine::CheckHeaderLocked(const KvChunkHeader& h) {
  absl::StatusOr<std::span<const int>> blocks = leases_.CheckChunk(h);
  if (blocks.ok()) {
    if (absl::Status s = CheckKvChunk(h, kv_spec_); !s.ok()) blocks = s;
  }
  if (!blocks.ok() && metrics_) metrics_->kv_chunks_rejected.Increment();
  return blocks;
}

absl::Status DecodeEngine::Accept(const KvChunkHeader& h, std::span<const char> payload) {
  std::lock_guard<std::mutex> lock(mu_);
  auto blocks = CheckHeaderLocked(h);
  if (!blocks.ok()) return blocks.status();
  // Copy the table: ScatterKv must not see it change, and OnChunk may invalidate the span.
  const std::vector<int> table(blocks->begin(), blocks->end());
  if (absl::Status s = UnpackRunnerKv(*runner_, payload, h, table); !s.ok()) return s;
  absl::Status s = leases_.OnChunk(h);
  if (s.ok() && metrics_)
    metrics_->kv_transfer_bytes.Increment(static_cast<double>(payload.size()));
  if (s.ok() && leases_.IsComplete(h.lease_id)) kv_cv_.notify_all();
  return s;
}

void DecodeEngine::Undeliverable(const KvChunkHeader& h, const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto handle = lease_to_handle_.find(h.lease_id);
  if (handle == lease_to_handle_.end() || leases_.IsComplete(h.lease_id)) return;
  // A chunk of an earlier lease, or without the lease's capability, says nothing about it.
  auto check = leases_.CheckChunk(h);
  if (!check.ok() && absl::IsAborted(check.status())) return;
  auto it = requests_.find(handle->second);
  // An ended request has left the scheduler: only an admitted one is still waiting for its KV.
  if (it == requests_.end() || scheduler_.state(it->first) != DecodeScheduler::State::kAdmitted ||
      !it->second.error.ok()) {
    return;
  }
  it->second.error = absl::AbortedError(
      absl::StrFormat("KV of layer %d tokens [%d, %d) arrived but was not delivered: %s", h.layer,
                      h.token_start, h.token_start + h.token_count, why.message()));
  kv_cv_.notify_all();
}

std::string DecodeEngine::kv_endpoint() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kv_endpoint_;
}

void DecodeEngine::SetKvEndpoint(std::string endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_endpoint_ = std::move(endpoint);
}

absl::Status DecodeEngine::Start(uint64_t handle, int first_token) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = requests_.find(handle);
  if (it == requests_.end()) return absl::NotFoundError("request not admitted or already ended");
  if (options_.kv_settle_timeout > absl::ZeroDuration()) {
    kv_cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.kv_settle_timeout), [&] {
      auto r = requests_.find(handle);
      return r == requests_.end() ||
             scheduler_.state(handle) != DecodeScheduler::State::kAdmitted ||
             !r->second.error.ok() || leases_.IsComplete(r->second.lease_id);
    });
    it = requests_.find(handle);
    if (it == requests_.end()) return absl::NotFoundError("request ended");
  }
  Request& r = it->second;
  if (scheduler_.state(handle) != DecodeScheduler::State::kAdmitted) {
    return absl::FailedPreconditionError("request already started");
  }
  if (!r.error.ok()) return r.error;
  if (first_token < 0 || first_token >= model_->config().vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("first_token %d outside the vocabulary", first_token));
  }
  if (!leases_.IsComplete(r.lease_id)) {
    return absl::FailedPreconditionError("the prompt's KV has not fully arrived");
  }
  leases_.Release(r.lease_id).IgnoreError();  // the blocks stay with the request
  lease_to_handle_.erase(r.lease_id);
  r.tokens.push_back(first_token);
  r.generated = 1;
  // The first token may already end the request (the router normally handles this).
  if (auto f =
          CheckFinish(model_->config(), r.req, first_token, 1, static_cast<int>(r.tokens.size()))) {
    r.finish = *f;
    EndLocked(handle, r, RequestState::kFinished);
    return absl::OkStatus();
  }
  if (absl::Status s = scheduler_.Start(handle); !s.ok()) return s;
  UpdateGaugesLocked();
  work_cv_.notify_one();
  return absl::OkStatus();
}

DecodeEngine::Output DecodeEngine::Next(uint64_t handle, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  Output out;
  auto ready = [&] {
    auto it = requests_.find(handle);
    return it == requests_.end() || !it->second.out.empty() || it->second.end.has_value();
  };
  output_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), ready);
  auto it = requests_.find(handle);
  if (it == requests_.end()) {
    out.error = absl::NotFoundError("request ended");
    return out;
  }
  Request& r = it->second;
  out.tokens.assign(r.out.begin(), r.out.end());
  r.out.clear();
  out.logprobs.assign(std::make_move_iterator(r.out_logprobs.begin()),
                      std::make_move_iterator(r.out_logprobs.end()));
  r.out_logprobs.clear();
  if (r.end) {
    out.finish = r.finish;
    out.error = r.error;
    requests_.erase(it);  // the reader has seen the end: forget the request
  }
  return out;
}

bool DecodeEngine::Watch(uint64_t handle, std::function<void()> ready) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find(handle);
  if (it == requests_.end()) return false;
  Request& r = it->second;
  r.on_output = std::move(ready);
  if (!r.out.empty() || r.end) {
    NotifyLocked(handle, r);
    notify_cv_.notify_one();
  }
  return true;
}

void DecodeEngine::NotifyLocked(uint64_t handle, Request& r) {
  if (!r.on_output || r.notify_queued) return;
  r.notify_queued = true;
  notify_.push_back(handle);
}

void DecodeEngine::WakeReadersLocked() {
  output_cv_.notify_all();
  if (!notify_.empty()) notify_cv_.notify_one();
}

void DecodeEngine::Notifier() {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<uint64_t> due;
  std::vector<std::function<void()>> calls;
  for (;;) {
    notify_cv_.wait(lock, [&] { return stop_ || !notify_.empty(); });
    if (notify_.empty()) return;  // stopping, nothing left to deliver
    due.swap(notify_);
    for (const uint64_t handle : due) {
      auto it = requests_.find(handle);
      if (it == requests_.end()) continue;
      it->second.notify_queued = false;
      if (it->second.on_output) calls.push_back(it->second.on_output);
    }
    due.clear();
    lock.unlock();
    for (const std::function<void()>& ready : calls) ready();
    calls.clear();
    lock.lock();
  }
}

void DecodeEngine::Cancel(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find(handle);
  if (it == requests_.end()) return;
  Request& r = it->second;
  if (StartedLocked(handle)) {
    // The loop ends it between steps (its blocks may be in use); its place is free now.
    r.cancel_requested = true;
    scheduler_.MarkLeaving(handle);
  } else if (!r.end) {
    r.error = absl::CancelledError("cancelled");
    EndLocked(handle, r, RequestState::kCancelled);
  }
  if (r.end) requests_.erase(it);  // nobody will read it
}

bool DecodeEngine::StartedLocked(uint64_t handle) const {
  const auto state = scheduler_.state(handle);
  return state == DecodeScheduler::State::kRunning || state == DecodeScheduler::State::kPreempted;
}

std::optional<DecodeEngine::RequestState> DecodeEngine::state(uint64_t handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find(handle);
  if (it == requests_.end()) return std::nullopt;
  if (it->second.end) return it->second.end;
  switch (scheduler_.state(handle).value_or(DecodeScheduler::State::kAdmitted)) {
    case DecodeScheduler::State::kAdmitted:
      return RequestState::kAdmitted;
    case DecodeScheduler::State::kRunning:
      return RequestState::kRunning;
    case DecodeScheduler::State::kPreempted:
      return RequestState::kPreempted;
  }
  return std::nullopt;
}

void DecodeEngine::EndLocked(uint64_t handle, Request& r, RequestState how) {
  if (r.end) return;
  const auto state = scheduler_.state(handle);
  if (state == DecodeScheduler::State::kAdmitted) {
    leases_.Release(r.lease_id).IgnoreError();
    lease_to_handle_.erase(r.lease_id);
  } else if (state.has_value() && proposer_) {
    // Only a started request ever proposed (and only the loop, which is here, proposes).
    proposer_->Forget(handle);
  }
  scheduler_.Release(handle);
  r.end = how;
  UpdateGaugesLocked();
  NotifyLocked(handle, r);
  WakeReadersLocked();
  kv_cv_.notify_all();
}

void DecodeEngine::UpdateGaugesLocked() {
  if (metrics_ == nullptr) return;
  const int running = static_cast<int>(scheduler_.running().size());
  metrics_->num_requests_running.Set(running);
  metrics_->num_requests_waiting.Set(scheduler_.num_admitted() - running);
  metrics_->kv_leases_waiting.Set(static_cast<double>(leases_.size()));
  const int total = scheduler_.num_blocks();
  metrics_->kv_cache_usage.Set(
      total > 0 ? 1.0 - static_cast<double>(scheduler_.num_free_blocks()) / total : 0.0);
}

void DecodeEngine::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    health_.Beat();
    ExpireLeasesLocked();
    UpdateGaugesLocked();
    EndCancelledLocked();
    // The step: a token for every running sequence, the recompute of readmitted preempted ones,
    // blocks grown (and the newest sequences preempted when the cache is full) as needed.
    DecodeScheduler::Step step = scheduler_.Schedule();
    if (metrics_ && !step.preempted.empty()) {
      metrics_->preemptions.Increment(static_cast<double>(step.preempted.size()));
    }
    if (step.work.empty()) {
      const bool started = !scheduler_.running().empty() || scheduler_.num_preempted() > 0;
      work_cv_.wait_for(lock, std::chrono::milliseconds(started ? 5 : 50));
      continue;
    }
    if (proposer_) SpeculateLocked(&step, lock);
    RunStepLocked(step, lock);
  }
}

void DecodeEngine::ExpireLeasesLocked() {
  for (ExpiredLease& e : leases_.Expire(absl::Now())) {
    if (metrics_) metrics_->kv_leases_expired.Increment();
    auto h = lease_to_handle_.find(e.lease.id);
    if (h == lease_to_handle_.end()) continue;
    const uint64_t handle = h->second;
    lease_to_handle_.erase(h);
    auto it = requests_.find(handle);
    if (it == requests_.end()) continue;
    it->second.error =
        absl::DeadlineExceededError("KV transfer did not complete before the lease deadline");
    EndLocked(handle, it->second, RequestState::kFailed);  // Expire already ended the lease
  }
}

void DecodeEngine::EndCancelledLocked() {
  // Requests cancelled while running (or waiting, preempted) leave between steps.
  std::vector<uint64_t> cancelled;
  for (const auto& [handle, r] : requests_) {
    if (r.cancel_requested && !r.end) cancelled.push_back(handle);
  }
  for (const uint64_t handle : cancelled) {
    auto it = requests_.find(handle);
    it->second.error = absl::CancelledError("cancelled");
    EndLocked(handle, it->second, RequestState::kCancelled);
    requests_.erase(it);
  }
}

void DecodeEngine::SpeculateLocked(DecodeScheduler::Step* step,
                                   std::unique_lock<std::mutex>& lock) {
  const ModelConfig& c = model_->config();
  std::vector<ProposalRequest> asks;
  std::vector<size_t> works;
  for (size_t i = 0; i < step->work.size(); ++i) {
    const DecodeScheduler::Work& w = step->work[i];
    Request& r = requests_.at(w.id);
    r.step_input.clear();
    if (!w.sample || w.count != 1 || !r.req.speculative) continue;
    const int room = ProposalRoom(options_.speculative.num_tokens, r.req.max_tokens, r.generated,
                                  static_cast<int>(r.tokens.size()), c.max_seq_len);
    if (room == 0) continue;
    asks.push_back({w.id, r.tokens, room});
    works.push_back(i);
  }
  if (asks.empty()) return;
  std::vector<std::vector<int>> proposals;
  // Running requests' tokens change only on this thread: they can be read unlocked.
  lock.unlock();
  const absl::Status st = proposer_->Propose(asks, &proposals);
  lock.lock();
  // A proposer that fails (a draft model's forward error) costs this step its proposals only:
  // the plain decode steps go on.
  if (!st.ok()) return;
  for (size_t j = 0; j < works.size(); ++j) {
    const std::vector<int>& p = proposals[j];
    const int k = scheduler_.Speculate(step, works[j], static_cast<int>(p.size()));
    if (k == 0) continue;
    Request& r = requests_.at(asks[j].id);
    r.step_input.push_back(r.tokens.back());
    r.step_input.insert(r.step_input.end(), p.begin(), p.begin() + k);
  }
}

bool DecodeEngine::EmitLocked(uint64_t handle, Request& r, std::span<const float> row, int token) {
  r.tokens.push_back(token);
  ++r.generated;
  r.out.push_back(token);
  NotifyLocked(handle, r);
  if (r.req.sampling.logprobs) {  // never sampled on the device
    r.out_logprobs.push_back(ComputeLogprobs(row, token, r.req.sampling.top_logprobs));
  }
  const std::optional<FinishReason> f =
      CheckFinish(model_->config(), r.req, token, r.generated, static_cast<int>(r.tokens.size()));
  if (!f) return false;
  r.finish = *f;
  EndLocked(handle, r, RequestState::kFinished);
  return true;
}

void DecodeEngine::RunStepLocked(const DecodeScheduler::Step& step,
                                 std::unique_lock<std::mutex>& lock) {
  const ModelConfig& c = model_->config();
  std::vector<SequenceChunk> batch;
  std::vector<Request*> reqs;
  bool on_device = runner_->samples_on_device();
  for (const DecodeScheduler::Work& w : step.work) {
    Request& r = requests_.at(w.id);
    const std::span<const int> input =
        w.draft > 0 ? std::span<const int>(r.step_input) : std::span<const int>(r.tokens);
    batch.push_back({input.subspan(w.draft > 0 ? 0 : w.start, w.count), w.start,
                     *scheduler_.blocks(w.id), w.draft > 0});
    reqs.push_back(&r);
    // The device samples decode steps (a row, or a row per token of a verify step) without
    // logprobs or logit processors (whose history would change from row to row).
    on_device = on_device && (w.count == 1 || w.draft > 0) && !r.req.sampling.logprobs &&
                !r.req.sampling.HasLogitProcessors();
  }
  // Where the logits live on a device and no request wants logprobs, the device samples and
  // only the tokens come back (the same draw as Sample below): row j of a verify step draws the
  // token at the sequence's position + j.
  std::vector<SamplingParams> sample_params;
  std::vector<uint64_t> sample_positions;
  if (on_device) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      const int rows = step.work[i].draft > 0 ? step.work[i].count : 1;
      for (int j = 0; j < rows; ++j) {
        sample_params.push_back(reqs[i]->req.sampling);
        sample_positions.push_back(reqs[i]->tokens.size() + j);
      }
    }
  }
  lock.unlock();  // Admit, Accept and readers proceed during the step
  const absl::Time t0 = absl::Now();
  // The step's loops note progress to health (kernels/step_progress.h).
  const StepProgress::Scope progress = health_.StepScope();
  absl::Status st = health_.BeforeStep();
  if (st.ok()) {
    // Colocated with a prefill engine on the CPU, the step runs whole (kernels/cpu/core_share.h).
    CoreShare::DecodeStep turn(CoreShare::Process());
    st = on_device ? runner_->ForwardSample(batch, sample_params, sample_positions, &sampled_)
                   : runner_->Forward(batch, &logits_);
  }
  if (metrics_) {
    metrics_->step_time.Observe(absl::ToDoubleSeconds(absl::Now() - t0));
    metrics_->batch_size.Observe(static_cast<double>(batch.size()));
    size_t tokens = 0;
    for (const SequenceChunk& chunk : batch) tokens += chunk.tokens.size();
    metrics_->iteration_tokens.Observe(static_cast<double>(tokens));
  }
  lock.lock();
  ++steps_;
  health_.StepDone(st);
  std::vector<int> kept(step.work.size(), 0);
  int generated = 0;     // tokens emitted
  size_t first_row = 0;  // the logit row of step.work[i]'s first input
  for (size_t i = 0; i < step.work.size(); ++i) {
    const DecodeScheduler::Work& w = step.work[i];
    Request& r = *reqs[i];  // running requests are only erased by this thread
    const size_t rows = w.draft > 0 ? static_cast<size_t>(w.count) : 1;
    const size_t row0 = first_row;
    first_row += rows;
    if (!st.ok()) {
      r.error = st;
      EndLocked(w.id, r, RequestState::kFailed);
      continue;
    }
    if (!w.sample) continue;  // a recompute chunk short of the sequence's end
    auto row = [&](size_t j) {
      if (on_device) return std::span<const float>();
      return std::span<const float>(logits_.data() + (row0 + j) * c.vocab_size, c.vocab_size);
    };
    // Row j's token: drawn on the device, or here from its logits.
    auto draw = [&](size_t j) {
      return on_device
                 ? sampled_[row0 + j]
                 : Sample(row(j), r.req.sampling, r.tokens.size(), HistoryOf(r.req, r.tokens, c));
    };
    if (w.draft == 0) {
      const int token = draw(0);
      ++generated;
      EmitLocked(w.id, r, row(0), token);
      continue;
    }
    // Scored proposals: the verify rule (engine/speculative/proposer.h).
    size_t drawn_row = 0;
    kept[i] = VerifyProposals(
        std::span<const int>(r.step_input).subspan(1),
        [&](int j) {
          drawn_row = static_cast<size_t>(j);
          return draw(drawn_row);
        },
        [&](int token) {
          ++generated;
          return EmitLocked(w.id, r, row(drawn_row), token);
        });
    ++speculation_.verify_steps;
    speculation_.proposed_tokens += w.draft;
    speculation_.accepted_tokens += kept[i];
    if (metrics_) {
      metrics_->spec_num_drafts.Increment();
      metrics_->spec_draft_tokens.Increment(w.draft);
      metrics_->spec_accepted_tokens.Increment(kept[i]);
      metrics_->spec_acceptance_length.Observe(kept[i]);
    }
  }
  // Requests that ended above were released: the scheduler skips them.
  if (st.ok()) scheduler_.Complete(step, kept);
  if (metrics_ && generated > 0) metrics_->generation_tokens.Increment(generated);
  WakeReadersLocked();
}

WorkerLoadSnapshot DecodeEngine::Load() const {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerLoadSnapshot l;
  l.running = static_cast<int>(scheduler_.running().size());
  l.queue_depth = scheduler_.num_admitted() - l.running;
  l.free_blocks = scheduler_.num_free_blocks();
  l.total_blocks = scheduler_.num_blocks();
  l.block_size = scheduler_.block_size();
  l.growth_blocks = scheduler_.growth_promised();
  l.watermark_blocks = scheduler_.watermark_blocks();
  l.reserves_max_tokens = scheduler_.admission() == DecodeScheduler::Admission::kReserve;
  l.kv_group_window = scheduler_.layout().group_window;
  return l;
}

SpeculationStats DecodeEngine::speculation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return speculation_;
}

int64_t DecodeEngine::preemptions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_.preemptions();
}

bool DecodeEngine::Idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_.Idle() && leases_.size() == 0 && lease_to_handle_.empty() &&
         requests_.empty() && (proposer_ == nullptr || proposer_->Idle());
}

int64_t DecodeEngine::steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_;
}

}  // namespace tandem
