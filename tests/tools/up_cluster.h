// `tandem up` of stories260K as a child process, for the tests of what it passes to its
// processes: started with extra flags, its output in a file, stopped with SIGINT.
#ifndef TANDEM_TESTS_TOOLS_UP_CLUSTER_H_
#define TANDEM_TESTS_TOOLS_UP_CLUSTER_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "formats/mapped_file.h"
#include "tests/test_util.h"

namespace tandem::testing {

class UpCluster {
 public:
  // `tandem up --model stories260K --tokenizer tok512 FLAGS...`, its output in `log`.
  UpCluster(std::string log, const std::vector<std::string>& flags) : log_(std::move(log)) {
    const std::string bin = BinDir() + "/tandem";
    std::vector<std::string> args = {bin, "up", "--model", Stories260K(), "--tokenizer", Tok512()};
    args.insert(args.end(), flags.begin(), flags.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(bin.c_str(), argv.data());
      ::_exit(127);
    }
  }
  ~UpCluster() {
    if (pid_ > 0) Stop();
  }
  UpCluster(const UpCluster&) = delete;
  UpCluster& operator=(const UpCluster&) = delete;

  pid_t pid() const { return pid_; }
  // The router's HTTP address once every worker has registered (60 s at most); empty if never.
  std::string WaitForHttp() const {
    std::string http;
    for (int i = 0; i < 600 && http.empty() && pid_ > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::ifstream in(log_);
      std::string line;
      bool ready = false;
      while (std::getline(in, line)) {
        ready |= line.rfind("ready router=", 0) == 0;
        if (line.rfind("http router=", 0) == 0 && ready) http = line.substr(12);
      }
    }
    return http;
  }
  std::string Log() const { return ReadFileToString(log_).value_or(""); }
  // The process was reaped by the test itself: nothing to stop.
  void Forget() { pid_ = -1; }
  // SIGINT, then waits; whether it exited (rather than died of a signal).
  bool Stop() {
    ::kill(pid_, SIGINT);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status);
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TOOLS_UP_CLUSTER_H_
