#include "tools/bench_runner.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "absl/strings/str_format.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem::bench {

nlohmann::json BenchRun::ToJson() const {
  nlohmann::json requests = nlohmann::json::array();
  for (const auto& r : records) requests.push_back(bench::ToJson(r));
  return {{"config", config.ToJson()}, {"summary", bench::ToJson(summary)}, {"requests", requests}};
}

namespace {

using Clock = std::chrono::steady_clock;

// Runs one request to the end and fills `rec`.
void RunOne(v1::Generation::Stub* stub, const WorkItem& w, const BenchConfig& c,
            const std::string& api_key, Clock::time_point t0, RequestRecord* rec) {
  auto since = [t0] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  v1::GenerateRequest req;
  if (!w.prompt.empty()) {
    req.mutable_tokens()->mutable_ids()->Add(w.prompt.begin(), w.prompt.end());
  } else {
    req.set_text(w.text);
  }
  // With a declared limit the stream ends early, at the output length (the client cancels).
  const bool ends_early = c.max_tokens > w.output_tokens;
  req.set_max_tokens(ends_early ? c.max_tokens : w.output_tokens);
  req.set_ignore_eos(true);
  req.mutable_sampling()->set_temperature(c.temperature);
  req.mutable_sampling()->set_seed(c.seed + rec->id);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(c.timeout * 1000)));
  AddApiKey(api_key, &ctx);
  rec->sent = since();
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    const double now = since();
    if (resp.token_ids_size() > 0 && rec->first_token < 0) rec->first_token = now;
    const int n = ends_early ? std::min(resp.token_ids_size(), w.output_tokens - rec->output_tokens)
                             : resp.token_ids_size();
    for (int i = 0; i < n; ++i) rec->token_times.push_back(now);
    rec->output_tokens += n;
    if (resp.has_usage() && resp.usage().prompt_tokens() > 0) {
      rec->prompt_tokens = resp.usage().prompt_tokens();
    }
    if (ends_early && rec->output_tokens >= w.output_tokens) break;
  }
  const bool ended_early = ends_early && rec->output_tokens >= w.output_tokens;
  if (ended_early) ctx.TryCancel();
  grpc::Status s = reader->Finish();
  if (ended_early) s = grpc::Status::OK;  // the cancel was ours: the answer is complete
  rec->done = since();
  rec->status_code = static_cast<int>(s.error_code());
  rec->status_message = s.error_message();
}

}  // namespace

absl::StatusOr<BenchRun> RunBench(const BenchConfig& c, const ClientSecurity& security) {
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  auto credentials = ClientChannelCredentials(security.tls);
  if (!credentials.ok()) return credentials.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // Several channels, so one HTTP/2 connection's stream limit does not cap the concurrency.
  std::vector<std::unique_ptr<v1::Generation::Stub>> stubs;
  for (int i = 0; i < 4; ++i) {
    args.SetInt("tandem.channel_index", i);  // distinct args: distinct connections
    stubs.push_back(
        v1::Generation::NewStub(grpc::CreateCustomChannel(c.router, *credentials, args)));
  }
  v1::ModelInfo info;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    AddApiKey(security.api_key, &ctx);
    grpc::Status s = stubs[0]->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    if (!s.ok()) {
      return absl::UnavailableError(absl::StrFormat("router %s: %s", c.router, s.error_message()));
    }
  }
  // The workload, fixed by the seed.
  const int total = c.warmup + c.num_requests;
  auto built = BuildWorkload(c, info.vocab_size(), info.max_context());
  if (!built.ok()) return built.status();
  std::vector<WorkItem> items = std::move(*built);
  BenchRun run;
  run.config = c;
  run.records.resize(total);
  for (int i = 0; i < total; ++i) {
    run.records[i].id = i;
    run.records[i].warmup = i < c.warmup;
    run.records[i].prompt_tokens = static_cast<int>(items[i].prompt.size());
  }
  const Clock::time_point t0 = Clock::now();
  std::atomic<int> started{0}, finished{0}, failed{0};
  // The progress line's throughput is the summary's: output tokens of measured (not warm-up)
  // requests that completed, over the time since the first measured request was sent.
  std::atomic<int64_t> tokens{0};
  std::atomic<double> first_measured{-1};  // seconds since t0
  std::atomic<bool> all_sent{false};

  // Progress on stderr.
  std::thread progress;
  std::atomic<bool> stop_progress{false};
  if (c.progress) {
    progress = std::thread([&] {
      const bool tty = ::isatty(2);
      while (!stop_progress) {
        std::this_thread::sleep_for(std::chrono::milliseconds(tty ? 500 : 5000));
        const double now = std::chrono::duration<double>(Clock::now() - t0).count();
        const double since = first_measured.load();
        const double rate = since >= 0 && now > since ? tokens.load() / (now - since) : 0;
        const int done = finished.load();
        const int bar = total > 0 ? 30 * done / total : 0;
        std::fprintf(
            stderr, "%s[bench] [%s%s] %d/%d done, %d failed, %d in flight, %.1f output tok/s%s",
            tty ? "\r" : "", std::string(bar, '#').c_str(), std::string(30 - bar, '.').c_str(),
            done, total, failed.load(), started.load() - done, rate, tty ? "   " : "\n");
      }
      if (tty) std::fputc('\n', stderr);
    });
  }

  auto run_index = [&](int i) {
    ++started;
    RequestRecord& rec = run.records[i];
    if (!rec.warmup) {
      double unset = -1;
      first_measured.compare_exchange_strong(
          unset, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    RunOne(stubs[i % stubs.size()].get(), items[i], c, security.api_key, t0, &rec);
    if (!rec.warmup && rec.ok()) tokens += rec.output_tokens;
    if (!rec.ok()) ++failed;
    ++finished;
  };
  // Warm-up: closed loop, not measured.
  {
    std::vector<std::thread> threads;
    std::atomic<int> next{0};
    for (int t = 0; t < std::min(std::max(1, c.concurrency), std::max(1, c.warmup)); ++t) {
      threads.emplace_back([&] {
        for (int i; (i = next++) < c.warmup;) run_index(i);
      });
    }
    for (auto& t : threads) t.join();
  }
  const Clock::time_point measure_start = Clock::now();
  auto out_of_time = [&] {
    return c.duration > 0 &&
           std::chrono::duration<double>(Clock::now() - measure_start).count() >= c.duration;
  };
  int sent_count = c.warmup;
  if (c.rate > 0) {
    ArrivalProcess arrivals(c.arrival, c.rate, c.burstiness, c.seed ^ 0x5eed);
    std::vector<std::thread> threads;
    std::mutex mu;
    std::condition_variable cv;
    int inflight = 0;
    Clock::time_point next = Clock::now();
    for (int i = c.warmup; i < total && !out_of_time(); ++i) {
      next += std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(arrivals.NextGap()));
      std::this_thread::sleep_until(next);
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return inflight < c.max_inflight; });
        ++inflight;
      }
      threads.emplace_back([&, i] {
        run_index(i);
        std::lock_guard<std::mutex> lock(mu);
        --inflight;
        cv.notify_one();
      });
      ++sent_count;
    }
    for (auto& t : threads) t.join();
  } else {
    std::vector<std::thread> threads;
    std::atomic<int> next{c.warmup};
    std::atomic<int> sent{c.warmup};
    for (int t = 0; t < c.concurrency; ++t) {
      threads.emplace_back([&] {
        for (;;) {
          if (out_of_time()) return;
          const int i = next++;
          if (i >= total) return;
          ++sent;
          run_index(i);
        }
      });
    }
    for (auto& t : threads) t.join();
    sent_count = sent.load();
  }
  all_sent = true;
  stop_progress = true;
  if (progress.joinable()) progress.join();
  run.records.resize(sent_count);  // requests never sent (duration limit) are not records
  run.summary = Summarize(run.records, c.slo);
  return run;
}

}  // namespace tandem::bench
