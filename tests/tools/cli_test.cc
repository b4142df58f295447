// The `tandem` binary as a user runs it: the oracle's text on stdout, clean errors and non-zero
// exits for bad input.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "kernels/backend_loader.h"
#include "metrics/scrape.h"
#include "tests/cluster_auth.h"
#include "tests/http/http_client.h"
#include "tests/test_util.h"
#include "tests/tools/up_cluster.h"

namespace tandem {
namespace {

struct Result {
  int exit_code;
  std::string out;
};

std::string StderrPath() { return absl::StrFormat("/tmp/tandem_cli_stderr.%d", ::getpid()); }

// Runs `tandem args` with `input` on stdin; stderr goes to StderrPath().
Result RunTandem(const std::string& args, const std::string& input = "") {
  const std::string in_path = absl::StrFormat("/tmp/tandem_cli_stdin.%d", ::getpid());
  EXPECT_TRUE(WriteStringToFile(in_path, input).ok());
  const std::string cmd =
      testing::BinDir() + "/tandem " + args + " <" + in_path + " 2>" + StderrPath();
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string Stderr() { return *ReadFileToString(StderrPath()); }

std::string Quote(const std::string& s) { return "'" + s + "'"; }

TEST(CliTest, GenerateMatchesLlama2cStdout) {
  const auto ref = testing::LoadJson(testing::SharedDir() + "/testdata/stories260K/reference.json");
  const auto& c = ref["greedy"][1];
  const int n =
      static_cast<int>(c["ids_after_each_position"].size() - (c["prompt_ids"].size() - 1));
  const Result r = RunTandem("generate --model " + testing::Stories260K() + " --tokenizer " +
                             testing::Tok512() + " --prompt " + Quote(c["prompt"]) +
                             " --temperature 0 --max-tokens " + std::to_string(n));
  EXPECT_EQ(r.exit_code, 0) << Stderr();
  EXPECT_EQ(r.out, c["stdout"].get<std::string>());
  EXPECT_NE(Stderr().find("TTFT"), std::string::npos);
}

// Speculative decoding prints the same text as plain decoding, by prompt lookup and with a
// draft model (here the model itself), and says what it proposed and kept.
TEST(CliTest, SpeculativeGenerateMatchesPlain) {
  const std::string gen = "generate --model " + testing::Stories260K() +
                          " --prompt 'Once upon a time, there was a little girl named Lily.' "
                          "--temperature 0 --max-tokens 80";
  const Result plain = RunTandem(gen);
  ASSERT_EQ(plain.exit_code, 0) << Stderr();
  for (const std::string& flags :
       {std::string(" --speculative ngram --spec-tokens 6"),
        " --speculative draft --spec-tokens 3 --draft-model " + testing::Stories260K()}) {
    const Result r = RunTandem(gen + flags);
    EXPECT_EQ(r.exit_code, 0) << flags << ": " << Stderr();
    EXPECT_EQ(r.out, plain.out) << flags;
    EXPECT_NE(Stderr().find("speculative:"), std::string::npos) << Stderr();
  }
}

TEST(CliTest, FindsTokenizerBesideCheckpoint) {
  const Result r = RunTandem("generate --model " + testing::Stories260K() +
                             " --prompt 'The cat' --temperature 0 --max-tokens 5");
  EXPECT_EQ(r.exit_code, 0) << Stderr();
  EXPECT_EQ(r.out.rfind("The cat", 0), 0u);
}

TEST(CliTest, Score) {
  const Result r =
      RunTandem("score --model " + testing::Stories260K() + " --text 'Once upon a time'");
  EXPECT_EQ(r.exit_code, 0) << Stderr();
  EXPECT_NE(r.out.find("perplexity="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens_scored=4"), std::string::npos) << r.out;
}

TEST(CliTest, TokenizeDetokenize) {
  Result r = RunTandem("tokenize --tokenizer " + testing::Tok512() + " --add-special-tokens",
                       "Once upon a time");
  EXPECT_EQ(r.exit_code, 0) << Stderr();
  EXPECT_EQ(r.out, "[1,403,407,261,378]\n");
  r = RunTandem("detokenize --tokenizer " + testing::Tok512(), "[1,403,407,261,378]");
  EXPECT_EQ(r.out, "Once upon a time");
  r = RunTandem("detokenize --tokenizer " + testing::Tok512(), "[1,99999]");
  EXPECT_NE(r.exit_code, 0);
}

TEST(CliTest, BadInputsFailCleanly) {
  const std::string m = " --model " + testing::Stories260K() + " --prompt hi";
  struct Case {
    std::string args, message;
  } cases[] = {
      {"generate --model /nonexistent --prompt hi", "does not exist"},
      {"generate --model " + testing::Tok512() + " --tokenizer " + testing::Tok512() +
           " --prompt hi",
       "not a valid llama2.c checkpoint"},
      {"generate" + m + " --temperature -1", "temperature"},
      {"generate" + m + " --temperature nan", "temperature"},
      {"generate" + m + " --top-p 0", "top_p"},
      {"generate" + m + " --top-p 1.5", "top_p"},
      {"generate" + m + " --top-k -2", "top_k"},
      {"generate" + m + " --max-tokens 0", "max-tokens"},
      {"generate" + m + " --max-tokens abc", "not an integer"},
      {"generate" + m + " --bogus 1", "unknown flag"},
      {"generate" + m + " --bogus=1", "unknown flag --bogus"},
      {"generate" + m + " stray", "takes no argument \"stray\""},
      {"generate" + m + " --max-tokens", "--max-tokens needs a value"},
      {"generate" + m + " --ignore-eos=maybe", "--ignore-eos takes no value"},
      {"model random --shape stories260K --out /tmp/x --seed one", "--seed: \"one\" is not"},
      {"generate" + m + " --device tpu", "device"},
      {"generate --model " + testing::Stories260K(), "--prompt is required"},
      {"generate" + m + " --speculative eagle", "--speculative must be off, ngram or draft"},
      {"generate" + m + " --speculative ngram --spec-tokens 65", "--spec-tokens"},
      {"generate" + m + " --spec-tokens 4", "--spec-tokens needs --speculative"},
      {"generate" + m + " --speculative draft", "--draft-model"},
      {"generate" + m + " --speculative draft --draft-model /nonexistent", "--draft-model: "},
      {"generate --router 127.0.0.1:1 --prompt hi --speculative ngram", "per-request choice"},
      {"frobnicate", "unknown command"},
  };
  for (const auto& c : cases) {
    const Result r = RunTandem(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.exit_code, -1) << c.args << " crashed";
    EXPECT_NE(Stderr().find(c.message), std::string::npos) << c.args << "\n" << Stderr();
  }
}

// --device=cuda: `tandem score` refuses it (it runs on the CPU backend). Where there is no GPU
// (or no library), `tandem generate` and tandem-server fail with a message naming the flag;
// with a GPU, greedy `tandem generate` on the device prints what it prints on the CPU.
TEST(CliTest, DeviceFlagOnGpuOrItsError) {
  const std::string m = " --model " + testing::Stories260K();
  Result r = RunTandem("score" + m + " --text hi --device cuda");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, -1) << "crashed";
  EXPECT_NE(Stderr().find("--device=cuda"), std::string::npos) << Stderr();
  const std::string gen = "generate" + m + " --prompt 'Once upon a time' --temperature 0 " +
                          "--max-tokens 40 --device ";
  if (LoadCudaApi().ok()) {
    const Result cpu = RunTandem(gen + "cpu");
    const Result cuda = RunTandem(gen + "cuda");
    EXPECT_EQ(cuda.exit_code, 0) << Stderr();
    EXPECT_NE(Stderr().find("(device cuda)"), std::string::npos) << Stderr();
    EXPECT_EQ(cuda.out, cpu.out);
    return;
  }
  r = RunTandem(gen + "cuda");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, -1) << "crashed";
  EXPECT_NE(Stderr().find("--device=cuda"), std::string::npos) << Stderr();
  const std::string cmd = testing::BinDir() +
                          "/tandem-server --role prefill --port 0 --router 127.0.0.1:1" + m +
                          " --cluster-secret-file " + testing::TestClusterSecretFile() +
                          " --device cuda 2>" + StderrPath();
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << "crashed";
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_NE(Stderr().find("--device=cuda"), std::string::npos) << Stderr();
}

// tandem-server's speculative decoding flags (and the colocated prefill share and the CPU
// niceness): bad values are named, and so is a draft model that cannot be loaded (one of another
// vocabulary is refused as SpeculativeOptionsTest shows).
TEST(CliTest, ServerSpeculativeFlagsAreChecked) {
  const std::string server =
      testing::BinDir() + "/tandem-server --role decode --port 0 --router 127.0.0.1:1 --model " +
      testing::Stories260K() + " --cluster-secret-file " + testing::TestClusterSecretFile();
  struct Case {
    std::string flags, message;
  } cases[] = {
      {" --speculative eagle", "--speculative must be off, ngram or draft"},
      {" --speculative ngram --spec-tokens 0", "--spec-tokens must be in [1, 64]"},
      {" --speculative draft", "--draft-model: given exactly when --speculative=draft"},
      {" --draft-model " + testing::Stories260K(), "--draft-model: given exactly"},
      {" --speculative draft --draft-model /nonexistent", "--draft-model: model path"},
      {" --colocated-prefill-share -1", "--colocated-prefill-share must be in [0, 16]"},
      {" --colocated-prefill-share nan", "--colocated-prefill-share must be in [0, 16]"},
      {" --cpu-nice 20", "--cpu-nice must be in [0, 19]"},
      {" --cpu-nice -1", "--cpu-nice must be in [0, 19]"},
  };
  for (const Case& c : cases) {
    const std::string cmd = server + c.flags + " 2>" + StderrPath();
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << c.flags << " crashed";
    EXPECT_EQ(WEXITSTATUS(status), 2) << c.flags << "\n" << Stderr();
    EXPECT_NE(Stderr().find(c.message), std::string::npos) << c.flags << "\n" << Stderr();
  }
}

// tandem-server checks every port flag before it loads the model (the model here does not even
// exist): a port another process holds is named with its flag, and so is one out of range.
TEST(CliTest, ServerPortsAreCheckedBeforeTheModelLoads) {
  const int held = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(held, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(held, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(held, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  const std::string server = testing::BinDir() +
                             "/tandem-server --role router --host 127.0.0.1 --model "
                             "/nonexistent/model.bin --cluster-secret-file " +
                             testing::TestClusterSecretFile();
  for (const char* flag : {"--port", "--internal-port", "--metrics-port", "--http-port"}) {
    const std::string cmd = server + " " + flag + " " + port + " 2>" + StderrPath();
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << flag << " crashed";
    EXPECT_NE(WEXITSTATUS(status), 0) << flag;
    EXPECT_NE(
        Stderr().find(std::string(flag) + ": 127.0.0.1:" + port + " is in use by another process"),
        std::string::npos)
        << flag << "\n"
        << Stderr();
  }
  ::close(held);
  const int status = std::system((server + " --http-port 99999 2>" + StderrPath()).c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(Stderr().find("--http-port must be in [0, 65535]"), std::string::npos) << Stderr();
}

// The fields of a /proc stat file after the command's closing parenthesis: field 3 (the state)
// first. Empty when the file is gone (the thread or process ended).
std::vector<std::string> StatFields(const std::string& path) {
  auto stat = ReadFileToString(path);
  if (!stat.ok()) return {};
  return absl::StrSplit(stat->substr(stat->rfind(')') + 2), ' ', absl::SkipEmpty());
}
// Stat field `field` of every thread of process `pid` (19: the niceness, 41: the scheduling
// policy).
std::vector<int> ThreadStatField(pid_t pid, int field) {
  std::vector<int> out;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(absl::StrFormat("/proc/%d/task", pid), ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::vector<std::string> f = StatFields(it->path().string() + "/stat");
    if (f.size() > static_cast<size_t>(field - 3)) out.push_back(std::stoi(f[field - 3]));
  }
  return out;
}
// Its command line with NULs as spaces.
std::string CommandLine(pid_t pid) {
  std::string s = ReadFileToString(absl::StrFormat("/proc/%d/cmdline", pid)).value_or("");
  std::replace(s.begin(), s.end(), '\0', ' ');
  return s;
}
// The processes whose parent (field 4) is `parent`.
std::vector<pid_t> Children(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::vector<std::string> f = StatFields(e.path().string() + "/stat");
    if (f.size() > 1 && std::stoi(f[4 - 3]) == parent) out.push_back(std::stoi(name));
  }
  return out;
}
// The child of `parent` running --role=`role` (the last one found), or -1.
pid_t ChildWithRole(pid_t parent, const std::string& role) {
  pid_t found = -1;
  for (pid_t child : Children(parent)) {
    if (CommandLine(child).find("--role=" + role) != std::string::npos) found = child;
  }
  return found;
}

// `tandem up` serves /metrics on the OpenAI HTTP port too (as vLLM), with the HTTP request's n and
// max_tokens under vLLM's names. Its prefill worker runs every thread at niceness 10 (the default
// --prefill-nice), the router and decode worker at 0.
TEST(CliTest, UpServesMetricsOnTheHttpPort) {
  testing::TempDir dir;
  testing::UpCluster up(dir.path() + "/up.log", {});
  ASSERT_GT(up.pid(), 0);
  const std::string http = up.WaitForHttp();
  ASSERT_FALSE(http.empty()) << up.Log();
  const testing::HttpReply r =
      testing::Curl(http, "/v1/completions",
                    R"({"prompt": "Once upon a time", "n": 2, "max_tokens": 3, "temperature": 0})");
  EXPECT_EQ(r.status, 200) << r.body;
  const auto samples = Scrape(http);  // GET /metrics on the HTTP port
  EXPECT_FALSE(samples.empty()) << "no /metrics on the HTTP port " << http;
  const std::map<std::string, std::string> router = {{"role", "router"}};
  EXPECT_EQ(MetricValue(samples, "tandem_request_params_n_count", router), 1);
  EXPECT_EQ(MetricValue(samples, "tandem_request_params_n_sum", router), 2);
  EXPECT_EQ(MetricValue(samples, "tandem_request_params_max_tokens_count", router), 2);
  EXPECT_EQ(MetricValue(samples, "tandem_request_params_max_tokens_sum", router), 6);
  EXPECT_EQ(MetricValue(samples, "tandem_request_inference_time_seconds_count", router), 2);
  const std::vector<pid_t> children = Children(up.pid());
  EXPECT_EQ(children.size(), 3u);
  int prefill = 0;
  for (pid_t child : children) {
    const std::string cmd = CommandLine(child);
    const bool is_prefill = cmd.find("--role=prefill") != std::string::npos;
    prefill += is_prefill;
    const std::vector<int> nice = ThreadStatField(child, 19);
    EXPECT_GT(nice.size(), 1u) << cmd;
    for (int n : nice) EXPECT_EQ(n, is_prefill ? 10 : 0) << cmd;
  }
  EXPECT_EQ(prefill, 1);
  EXPECT_TRUE(up.Stop());
}

// `tandem up --prefill-idle`: every thread of its prefill worker runs at SCHED_IDLE (policy 5,
// field 41 of /proc/PID/task/TID/stat), the router's and the decode worker's at SCHED_OTHER (0),
// and the cluster serves.
TEST(CliTest, UpPrefillIdleRunsThePrefillWorkerAtSchedIdle) {
  testing::TempDir dir;
  testing::UpCluster up(dir.path() + "/up.log", {"--prefill-idle"});
  ASSERT_GT(up.pid(), 0);
  const std::string http = up.WaitForHttp();
  ASSERT_FALSE(http.empty()) << up.Log();
  const testing::HttpReply r =
      testing::Curl(http, "/v1/completions",
                    R"({"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0})");
  EXPECT_EQ(r.status, 200) << r.body;
  int prefill = 0;
  for (pid_t child : Children(up.pid())) {
    const std::string cmd = CommandLine(child);
    const bool is_prefill = cmd.find("--role=prefill") != std::string::npos;
    prefill += is_prefill;
    const std::vector<int> policy = ThreadStatField(child, 41);
    EXPECT_GT(policy.size(), 1u) << cmd;
    for (int p : policy) EXPECT_EQ(p, is_prefill ? SCHED_IDLE : SCHED_OTHER) << cmd;
  }
  EXPECT_EQ(prefill, 1);
  EXPECT_TRUE(up.Stop());
}

// `tandem up` supervises: a prefill worker stopped for 2 s (as by a debugger) leaves the cluster
// up, and a decode worker killed with SIGKILL is started again, after which requests succeed.
TEST(CliTest, UpRestartsAKilledWorkerAndSurvivesAStoppedOne) {
  testing::TempDir dir;
  testing::UpCluster up(dir.path() + "/up.log", {});
  ASSERT_GT(up.pid(), 0);
  const std::string http = up.WaitForHttp();
  ASSERT_FALSE(http.empty()) << up.Log();
  const pid_t prefill = ChildWithRole(up.pid(), "prefill");
  const pid_t decode = ChildWithRole(up.pid(), "decode");
  ASSERT_GT(prefill, 0);
  ASSERT_GT(decode, 0);
  const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0})";

  ::kill(prefill, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(::waitpid(up.pid(), nullptr, WNOHANG), 0) << up.Log();  // still running
  ::kill(prefill, SIGCONT);

  ::kill(decode, SIGKILL);
  bool restarted = false, served = false;
  for (int i = 0; i < 300 && !served; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    restarted = up.Log().find("decode worker 0 (pid " + std::to_string(decode) +
                              ") was killed by signal 9") != std::string::npos;
    served = restarted && testing::Curl(http, "/v1/completions", body).status == 200;
  }
  EXPECT_TRUE(restarted) << up.Log();
  EXPECT_TRUE(served) << up.Log();
  EXPECT_EQ(Children(up.pid()).size(), 3u);
  EXPECT_TRUE(up.Stop());
}

// kill -9 of each worker in turn under `tandem up`, with 20 clients sending greedy completions
// throughout: every answer is the quiet cluster's, word for word; each worker is back (its
// restart logged, a request served after it) within 10 s; and clients keep being served.
TEST(CliTest, UpKeepsTwentyClientsServedThroughKilledWorkers) {
  testing::TempDir dir;
  testing::UpCluster up(dir.path() + "/up.log", {});
  ASSERT_GT(up.pid(), 0);
  const std::string http = up.WaitForHttp();
  ASSERT_FALSE(http.empty()) << up.Log();
  const std::vector<std::string> prompts = {"Once upon a time", "The cat sat", "Lily and Tom",
                                            "One day a big"};
  auto body = [](const std::string& prompt) {
    return R"({"prompt": ")" + prompt + R"(", "max_tokens": 24, "temperature": 0})";
  };
  std::vector<std::string> want;
  for (const std::string& p : prompts) {
    const testing::HttpReply r = testing::Curl(http, "/v1/completions", body(p));
    ASSERT_EQ(r.status, 200) << r.body;
    want.push_back(r.Json()["choices"][0]["text"].get<std::string>());
  }
  std::atomic<bool> stop{false};
  std::atomic<int> served{0}, wrong{0}, failed{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 20; ++c) {
    clients.emplace_back([&, c] {
      for (int i = c; !stop.load(); ++i) {
        const size_t k = static_cast<size_t>(i) % prompts.size();
        const testing::HttpReply r = testing::Curl(http, "/v1/completions", body(prompts[k]));
        const nlohmann::json j = r.Json();
        if (r.status != 200 || !j.is_object()) {
          ++failed;
        } else if (j["choices"][0]["text"] != want[k]) {
          ++wrong;
        } else {
          ++served;
        }
      }
    });
  }
  for (const std::string role : {"decode", "prefill"}) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const pid_t victim = ChildWithRole(up.pid(), role);
    ASSERT_GT(victim, 0) << role;
    const int before = served.load();
    const auto killed = std::chrono::steady_clock::now();
    ::kill(victim, SIGKILL);
    const std::string logged = " (pid " + std::to_string(victim) + ") was killed by signal 9";
    bool back = false;
    while (!back && std::chrono::steady_clock::now() - killed < std::chrono::seconds(10)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      back = up.Log().find(logged) != std::string::npos &&
             testing::Curl(http, "/v1/completions", body(prompts[0])).status == 200;
    }
    EXPECT_TRUE(back) << role << " worker not back within 10 s\n" << up.Log();
    std::printf("%s worker killed: back after %.1f s; %d answers meanwhile\n", role.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count(),
                served.load() - before);
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  stop = true;
  for (std::thread& t : clients) t.join();
  std::printf("20 clients: %d answers, %d wrong, %d failed\n", served.load(), wrong.load(),
              failed.load());
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(served.load(), 40);
  EXPECT_EQ(Children(up.pid()).size(), 3u) << up.Log();
  EXPECT_TRUE(up.Stop());
}

// `tandem up --restart never`: a worker's exit stops the whole cluster, as tests may want.
TEST(CliTest, UpRestartNeverStopsTheClusterAtAWorkersExit) {
  testing::TempDir dir;
  testing::UpCluster up(dir.path() + "/up.log", {"--restart", "never"});
  ASSERT_GT(up.pid(), 0);
  ASSERT_FALSE(up.WaitForHttp().empty()) << up.Log();
  if (const pid_t decode = ChildWithRole(up.pid(), "decode"); decode > 0) {
    ::kill(decode, SIGKILL);
  }
  int status = 0;
  for (int i = 0; i < 300 && ::waitpid(up.pid(), &status, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << up.Log();
  EXPECT_NE(up.Log().find("stopping the cluster"), std::string::npos) << up.Log();
  up.Forget();
}

TEST(CliTest, ModelConvertAndRandom) {
  testing::TempDir dir;
  Result r =
      RunTandem("model convert --from " + testing::Stories260K() + " --out " + dir.path() + "/hf");
  ASSERT_EQ(r.exit_code, 0) << Stderr();
  r = RunTandem("generate --model " + dir.path() + "/hf --tokenizer " + testing::Tok512() +
                " --prompt 'The cat' --temperature 0 --max-tokens 20");
  EXPECT_EQ(r.exit_code, 0) << Stderr();
  const Result direct = RunTandem("generate --model " + testing::Stories260K() +
                                  " --prompt 'The cat' --temperature 0 --max-tokens 20");
  EXPECT_EQ(r.out, direct.out);
  r = RunTandem("model random --shape stories15M --dtype bf16 --out " + dir.path() + "/r15");
  ASSERT_EQ(r.exit_code, 0) << Stderr();
  r = RunTandem("generate --model " + dir.path() + "/r15 --tokenizer " + testing::Tok512() +
                " --prompt hi --max-tokens 3");
  EXPECT_EQ(r.exit_code, 0) << Stderr();  // random weights: the text is noise, the run is not
}

TEST(CliTest, EveryCommandAnswersHelpAndVersion) {
  for (const std::string cmd :
       {"generate", "score", "tokenize", "detokenize", "up", "bench", "plan", "model"}) {
    for (const std::string flag : {" --help", " -h", " --model x --help"}) {
      const Result r = RunTandem(cmd + flag);
      EXPECT_EQ(r.exit_code, 0) << cmd << flag << ": " << Stderr();
      EXPECT_NE(r.out.find(cmd), std::string::npos) << cmd << flag << ": " << r.out;
    }
  }
  Result r = RunTandem("generate --help");
  EXPECT_NE(r.out.find("--dtype DTYPE"), std::string::npos) << r.out;
  // Each flag's default comes from its one declaration.
  EXPECT_NE(r.out.find("--max-tokens N=256"), std::string::npos) << r.out;
  r = RunTandem("plan simulate --help");
  EXPECT_NE(r.out.find("--concurrency C=8"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("detokenize --tokenizer"), std::string::npos) << "only generate's entries";
  r = RunTandem("nope --help");
  EXPECT_EQ(r.exit_code, 2);
  r = RunTandem("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("tandem ", 0), 0u) << r.out;
  // The server binaries too.
  for (const std::string bin : {"tandem-server", "tandem-router"}) {
    for (const std::string flag : {" --help", " --role=decode --help", " --version"}) {
      const std::string cmd = testing::BinDir() + "/" + bin + flag + " >/dev/null 2>&1";
      EXPECT_EQ(std::system(cmd.c_str()), 0) << bin << flag;
    }
  }
}

TEST(CliTest, GgufModelConvertsAndRejectsQuantizedRandom) {
  testing::TempDir dir;
  Result r = RunTandem("model random --shape stories260K --dtype q4_0 --out " + dir.path() + "/q");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(Stderr().find("safetensors"), std::string::npos) << Stderr();
  r = RunTandem("generate --model " + testing::Stories260K() + " --dtype int3 --prompt hi");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(Stderr().find("q4_k"), std::string::npos) << Stderr();
  // A llama2.c checkpoint quantized at load still speaks (the text differs from f32).
  r = RunTandem("generate --model " + testing::Stories260K() +
                " --dtype q8_0 --prompt 'Once upon a time' --temperature 0 --max-tokens 12");
  EXPECT_EQ(r.exit_code, 0) << Stderr();
}

}  // namespace
}  // namespace tandem
