// The router's public gRPC API under thousands of concurrent Generate streams: N streams opened at
// once (over a few connections, as a client library's channel pool would), each greedy with
// ignore_eos for --max-tokens tokens, read to the end on gRPC's callback API (a handful of
// threads for any N). Per run: streams done / refused (RESOURCE_EXHAUSTED, UNAVAILABLE) / failed
// (anything else), streams in flight at once (first token received, end not yet), TTFT p50/p99,
// inter-token p99, and the router process (--router-pid) sampled every 100 ms: CPU seconds, RSS
// and threads at idle and at peak. Prints one line and writes the row as JSON (--out), the
// fields of bench/serving/concurrency.py's rows.
//   grpc_concurrency --target HOST:PORT --clients 10000 --router-pid PID --out row.json
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tandem/v1/generation.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string target;
  int clients = 1000;
  int max_tokens = 200;
  int channels = 64;
  int router_pid = 0;
  std::string out;
  std::string prompt = "Once upon a time";
};

struct ProcSample {
  double cpu = 0;
  long rss = 0;
  int threads = 0;
};

ProcSample Sample(int pid) {
  ProcSample s;
  if (pid <= 0) return s;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::vector<std::string> f;
  for (std::string x; rest >> x;) f.push_back(x);
  if (f.size() > 12) {
    s.cpu = (std::stod(f[11]) + std::stod(f[12])) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss = std::stol(line.substr(6)) * 1024;
    if (line.rfind("Threads:", 0) == 0) s.threads = std::stoi(line.substr(8));
  }
  return s;
}

double Percentile(std::vector<double> xs, double p) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  const size_t i = std::min(xs.size() - 1, static_cast<size_t>(p / 100.0 * xs.size()));
  return xs[i];
}

struct Results {
  std::mutex mu;
  std::condition_variable cv;
  int ended = 0, done = 0, refused = 0, failed = 0;
  std::atomic<int> streaming{0};
  int peak_streaming = 0;
  std::vector<double> ttft, itl;
  std::string first_failure;
};

class Stream final : public grpc::ClientReadReactor<tandem::v1::GenerateResponse> {
 public:
  Stream(tandem::v1::Generation::Stub* stub, const tandem::v1::GenerateRequest& req, Results* r)
      : req_(req), r_(r), start_(Clock::now()), last_(start_) {
    stub->async()->Generate(&ctx_, &req_, this);
    StartRead(&resp_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    const int n = resp_.token_ids_size();
    if (n > 0) {
      const auto now = Clock::now();
      const double gap = std::chrono::duration<double>(now - last_).count();
      if (tokens_ == 0) {
        ttft_ = gap;
        const int s = ++r_->streaming;
        std::lock_guard<std::mutex> lock(r_->mu);
        r_->peak_streaming = std::max(r_->peak_streaming, s);
      } else {
        for (int i = 0; i < n; ++i) itl_.push_back(gap / n);
      }
      last_ = now;
      tokens_ += n;
    }
    StartRead(&resp_);
  }

  void OnDone(const grpc::Status& s) override {
    if (tokens_ > 0) --r_->streaming;
    {
      std::lock_guard<std::mutex> lock(r_->mu);
      if (s.ok() && tokens_ > 0) {
        ++r_->done;
        r_->ttft.push_back(ttft_);
        r_->itl.insert(r_->itl.end(), itl_.begin(), itl_.end());
      } else if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                 s.error_code() == grpc::StatusCode::UNAVAILABLE) {
        ++r_->refused;
      } else {
        ++r_->failed;
        if (r_->first_failure.empty()) {
          r_->first_failure = std::to_string(s.error_code()) + " " + s.error_message();
        }
      }
      ++r_->ended;
    }
    r_->cv.notify_all();
    delete this;
  }

 private:
  grpc::ClientContext ctx_;
  tandem::v1::GenerateRequest req_;
  tandem::v1::GenerateResponse resp_;
  Results* r_;
  Clock::time_point start_, last_;
  int tokens_ = 0;
  double ttft_ = 0;
  std::vector<double> itl_;
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--target") {
      a->target = v;
    } else if (k == "--clients") {
      a->clients = std::stoi(v);
    } else if (k == "--max-tokens") {
      a->max_tokens = std::stoi(v);
    } else if (k == "--channels") {
      a->channels = std::stoi(v);
    } else if (k == "--router-pid") {
      a->router_pid = std::stoi(v);
    } else if (k == "--out") {
      a->out = v;
    } else {
      std::fprintf(stderr, "grpc_concurrency: unknown flag %s\n", k.c_str());
      return false;
    }
  }
  if (a->target.empty() || a->clients < 1 || a->channels < 1) {
    std::fprintf(stderr,
                 "usage: grpc_concurrency --target HOST:PORT --clients N [--max-tokens 200] "
                 "[--channels 64] [--router-pid PID] [--out row.json]\n");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) return 2;
  std::vector<std::unique_ptr<tandem::v1::Generation::Stub>> stubs;
  for (int i = 0; i < a.channels; ++i) {
    grpc::ChannelArguments ca;
    ca.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    ca.SetInt("tandem.channel", i);                    // channels with equal args would share
    stubs.push_back(tandem::v1::Generation::NewStub(
        grpc::CreateCustomChannel(a.target, grpc::InsecureChannelCredentials(), ca)));
  }
  tandem::v1::GenerateRequest req;
  req.set_text(a.prompt);
  req.mutable_sampling()->set_temperature(0);
  req.set_max_tokens(a.max_tokens);
  req.set_ignore_eos(true);

  const ProcSample idle = Sample(a.router_pid);
  ProcSample peak = idle;
  Results r;
  std::atomic<bool> stop{false};
  std::thread sampler([&] {
    while (!stop.load()) {
      const ProcSample s = Sample(a.router_pid);
      peak.rss = std::max(peak.rss, s.rss);
      peak.threads = std::max(peak.threads, s.threads);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const auto t0 = Clock::now();
  for (int i = 0; i < a.clients; ++i) new Stream(stubs[i % stubs.size()].get(), req, &r);
  {
    std::unique_lock<std::mutex> lock(r.mu);
    r.cv.wait(lock, [&] { return r.ended == a.clients; });
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  stop = true;
  sampler.join();
  const ProcSample after = Sample(a.router_pid);

  char row[2048];
  std::snprintf(
      row, sizeof(row),
      "{\"api\": \"grpc\", \"clients\": %d, \"done\": %d, \"refused\": %d, \"failed\": %d, "
      "\"seconds\": %.0f, \"peak_in_flight\": %d, \"ttft_p50_s\": %.2f, \"ttft_p99_s\": %.2f, "
      "\"itl_p99_s\": %.3f, \"router_cpu_s\": %.1f, \"router_rss_idle_mb\": %ld, "
      "\"router_rss_peak_mb\": %ld, \"router_threads_idle\": %d, \"router_threads_peak\": %d}",
      a.clients, r.done, r.refused, r.failed, seconds, r.peak_streaming, Percentile(r.ttft, 50),
      Percentile(r.ttft, 99), Percentile(r.itl, 99), after.cpu - idle.cpu, idle.rss >> 20,
      peak.rss >> 20, idle.threads, peak.threads);
  std::printf(
      "grpc streams %d: done %d refused %d failed %d in %.0fs; peak in flight %d; TTFT p50/p99 "
      "%.2f/%.2fs; ITL p99 %.3fs; router CPU %.1fs RSS %ld->%ld MB threads %d->%d\n",
      a.clients, r.done, r.refused, r.failed, seconds, r.peak_streaming, Percentile(r.ttft, 50),
      Percentile(r.ttft, 99), Percentile(r.itl, 99), after.cpu - idle.cpu, idle.rss >> 20,
      peak.rss >> 20, idle.threads, peak.threads);
  if (!r.first_failure.empty()) std::printf("first failure: %s\n", r.first_failure.c_str());
  if (!a.out.empty()) std::ofstream(a.out) << row << "\n";
  return r.failed == 0 ? 0 : 1;
}
