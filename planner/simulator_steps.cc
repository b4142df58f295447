// The simulator's worker steps, the router's token relay and the devices' processor sharing
// (planner/sim_internal.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "planner/sim_internal.h"

namespace tandem::planner::sim_internal {

void Sim::Wake(int w) {
  Worker& wk = workers_[w];
  if (wk.busy || wk.start_pending) return;
  wk.start_pending = true;
  Push(now_, Kind::kStepStart, w, /*priority=*/1);
}

void Sim::StepStart(int w) {
  Worker& wk = workers_[w];
  wk.start_pending = false;
  std::vector<ChunkShape> shapes;
  wk.step_requests.clear();
  wk.transfer_tokens = 0;
  wk.step = StepTrace{};
  wk.step.worker = w;
  wk.step.prefill = wk.prefill;
  if (wk.prefill) {
    wk.step.work = wk.prefill_scheduler->Schedule();
    for (const auto& work : wk.step.work) {
      const int r = static_cast<int>(work.id - 1);
      Request& q = requests_[r];
      shapes.push_back({work.start, work.count});
      wk.step_requests.push_back(r);
      wk.transfer_tokens += work.count;
      if (q.cached > 0 && !q.cached_sent) {  // a prefix hit's KV is sent as it is
        wk.transfer_tokens += q.cached;
        q.cached_sent = true;
      }
    }
  } else {
    // The decode worker's own plan: a token per running sequence, recompute chunks of readmitted
    // preempted ones, blocks grown and the newest sequences preempted as the cache fills.
    DecodeScheduler::Step plan = wk.decode_scheduler->Schedule();
    result_.preemptions += static_cast<int64_t>(plan.preempted.size());
    wk.step_kept.assign(plan.work.size(), 0);
    for (size_t i = 0; i < plan.work.size(); ++i) {
      const int r = static_cast<int>(plan.work[i].id - 1);
      if (cluster_.spec_tokens > 0) wk.step_kept[i] = Speculate(&plan, i, r, wk);
      const DecodeScheduler::Work& work = plan.work[i];
      wk.step.batch.push_back(work.id);
      shapes.push_back({work.start, work.count, work.draft > 0 ? work.count : 1});
      wk.step_requests.push_back(r);
    }
    wk.step.decode = std::move(plan.work);
    wk.step.preempted = std::move(plan.preempted);
  }
  if (shapes.empty()) return;  // idle until woken
  wk.busy = true;
  wk.step_start = now_;
  wk.step.start = now_;
  const double seconds =
      options_.zero_cost ? 0 : wk.cost->Step(shapes).seconds * StepNoise(wk.prefill);
  wk.step_alone = seconds;
  if (wk.prefill) {
    ++result_.prefill_steps;
  } else {
    ++result_.decode_steps;
    batch_sum_ += shapes.size();
  }
  AddToDevice(w, seconds);
}

void Sim::StepEnd(int w) {
  Worker& wk = workers_[w];
  wk.busy = false;
  if (wk.relay) {
    // A decode step's tokens reach their clients once the relay has done their work.
    const double out = now_ + profile_.token_overhead;
    for (int r : wk.relaying) Deliver(r, out);
    wk.relaying.clear();
    if (!wk.relay_queue.empty()) StartRelay(w);
    return;
  }
  if (!wk.sampling) {
    // The step's figures are its forward pass's, as the workers' metrics are.
    (wk.prefill ? result_.prefill_step_seconds : result_.decode_step_seconds) +=
        now_ - wk.step_start;
    (wk.prefill ? result_.prefill_step_alone_seconds : result_.decode_step_alone_seconds) +=
        wk.step_alone;
    if (!wk.prefill && profile_.sample_cpu > 0 && !options_.zero_cost) {
      // Then the loop samples each running request's token on its thread, one core.
      wk.sampling = wk.busy = true;
      // A verify step samples a row per token it emits.
      double rows = static_cast<double>(wk.step_requests.size());
      for (int kept : wk.step_kept) rows += kept;
      AddToDevice(w, profile_.sample_cpu * rows);
      return;
    }
  }
  wk.sampling = false;
  wk.step.end = now_;
  if (wk.prefill) {
    // Colocated: the in-process transport copies within the step.
    const double transferred =
        options_.zero_cost || cluster_.colocated
            ? now_
            : wk.cost->TransferDone(wk.step_start, now_ - wk.step_start, wk.transfer_tokens, link_,
                                    &wk.link_free);
    for (size_t i = 0; i < wk.step.work.size(); ++i) {
      if (!wk.step.work[i].last) continue;
      Request& q = requests_[wk.step_requests[i]];
      // The engine's FinishLocked: full blocks become reusable prefixes, the rest are freed.
      if (cluster_.prefix_cache) wk.pool->Publish(q.item.prompt, q.blocks, BlockHashes(q));
      wk.pool->Free(q.blocks).IgnoreError();
      q.blocks.clear();
      --wk.prefill_jobs;
      StartHop(std::max(transferred, now_), profile_.request_overhead / 2, 0, Kind::kFirstToken,
               wk.step_requests[i]);
    }
    // Prompts waiting for the blocks just freed, in arrival order.
    while (!wk.waiting_blocks.empty()) {
      const int r = wk.waiting_blocks.front();
      if (!requests_[r].ended && !TakePrefillBlocks(r, w)) break;
      wk.waiting_blocks.pop_front();
    }
    if (!wk.prefill_scheduler->empty()) Wake(w);
  } else {
    const bool relayed = relay_ >= 0 && !options_.zero_cost;
    const double out = now_ + (options_.zero_cost ? 0 : profile_.token_overhead);
    wk.decode_scheduler->Complete({wk.step.decode, {}}, wk.step_kept);
    std::vector<int> delivered;  // a recompute chunk short of its sequence's end sends nothing
    for (size_t i = 0; i < wk.step.decode.size(); ++i) {
      if (!wk.step.decode[i].sample) continue;
      const int r = wk.step_requests[i];
      Request& q = requests_[r];
      // The token, and the proposals kept before it.
      for (int t = 0; t <= wk.step_kept[i]; ++t) {
        ++q.generated;
        delivered.push_back(r);
        if (!relayed) Deliver(r, out);
      }
      if (q.generated >= q.item.output_tokens) {
        wk.decode_scheduler->Release(q.id);  // the worker is done with it; the client not yet
      }
    }
    if (relayed && !delivered.empty()) {
      workers_[relay_].relay_queue.push_back(std::move(delivered));
      if (!workers_[relay_].busy) StartRelay(relay_);
    }
    if (!wk.decode_scheduler->running().empty() || wk.decode_scheduler->num_preempted() > 0) {
      Wake(w);
    }
  }
  if (options_.record_steps) result_.steps.push_back(std::move(wk.step));
}

void Sim::StartRelay(int w) {
  Worker& wk = workers_[w];
  wk.busy = true;
  wk.relaying = std::move(wk.relay_queue.front());
  wk.relay_queue.pop_front();
  AddToDevice(w, profile_.relay_cpu * wk.relaying.size());
}

// One more token of request `r` reaches its client at `t`; the last one ends the request.
void Sim::Deliver(int r, double t) {
  Request& q = requests_[r];
  bench::RequestRecord& rec = result_.records[r];
  ++rec.output_tokens;
  if (options_.record_token_times) rec.token_times.push_back(t);
  if (rec.output_tokens >= q.item.output_tokens) End(r, t, 0);
}

void Sim::Advance(Device& d) {
  for (const Task& t : d.active) Remaining(t.id) -= (now_ - d.last) * d.Rate(t);
  d.last = now_;
}

void Sim::AddToDevice(int w, double seconds) {
  Device& d = devices_[workers_[w].device];
  Advance(d);
  Worker& wk = workers_[w];
  wk.remaining = seconds;
  const bool first = wk.prefill && prefill_cores_ > 0;
  d.Add({w, wk.relay || wk.sampling ? 1.0 : first ? prefill_cores_ : step_cores_, first});
  Reschedule(workers_[w].device);
}

void Sim::Reschedule(int device) {
  Device& d = devices_[device];
  d.done_pending = false;
  if (d.active.empty()) return;
  double soonest = 1e300;  // a task with no cores left to it waits for those served first
  for (const Task& t : d.active) {
    const double rate = d.Rate(t);
    if (rate > 0) soonest = std::min(soonest, std::max(0.0, Remaining(t.id)) / rate);
  }
  d.done_pending = soonest < 1e300;
  if (d.done_pending) d.done = {now_ + soonest, 0, seq_++, Kind::kDeviceDone, device};
}

void Sim::DeviceDone(int device) {
  Device& d = devices_[device];
  Advance(d);
  // Every task that ran out of work (the one this event was timed for, and any other within a
  // nanosecond: what the clock's rounding leaves).
  const std::vector<int> done = d.Remove([&](int t) { return Remaining(t) <= 1e-9; });
  Reschedule(device);
  for (int t : done) {
    if (t >= 0) {
      StepEnd(t);
      continue;
    }
    const Hop& hop = hops_[-1 - t];
    Push(now_ + hop.latency, hop.next, hop.r);
  }
}

}  // namespace tandem::planner::sim_internal
