#include "tools/server_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

namespace tandem {

std::string DefaultServerBinary() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "tandem-server";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/')) + "/tandem-server";
}

void StopProcesses(const std::vector<pid_t>& pids, int grace_ms) {
  for (pid_t p : pids) ::kill(p, SIGTERM);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
  for (pid_t p : pids) {
    int status;
    while (::waitpid(p, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= give_up) {
        ::kill(p, SIGKILL);  // not reaped yet, so the pid is still this child's
        ::waitpid(p, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

ServerProcess StartServerProcess(const std::string& binary, const std::vector<std::string>& args) {
  ServerProcess p;
  int fds[2];
  if (::pipe(fds) != 0) return p;
  // Build argv before fork: the child of a threaded process should only exec.
  std::vector<std::string> all = {binary};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  p.pid = ::fork();
  if (p.pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  if (p.pid < 0) {
    ::close(fds[0]);
    return p;
  }
  auto read_line = [&](const std::string& prefix) {
    std::string line;
    char c;
    while (::read(fds[0], &c, 1) == 1 && c != '\n') line.push_back(c);
    return line.rfind(prefix, 0) == 0 ? line.substr(prefix.size()) : std::string();
  };
  p.address = read_line("listening ");
  if (!p.address.empty()) p.internal = read_line("internal ");
  if (!p.internal.empty()) p.metrics = read_line("metrics ");
  // A router's "http" line came in the same write: it is in the pipe already, or not at all.
  pollfd more{fds[0], POLLIN, 0};
  if (!p.metrics.empty() && ::poll(&more, 1, 0) > 0 && (more.revents & POLLIN)) {
    p.http = read_line("http ");
  }
  ::close(fds[0]);
  return p;
}

}  // namespace tandem
