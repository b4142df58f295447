// Starting a tandem-server process and reading the addresses it announces: used by `tandem up`,
// the real-process tests and the benchmarks. No gRPC here.
#ifndef TANDEM_TOOLS_SERVER_PROCESS_H_
#define TANDEM_TOOLS_SERVER_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace tandem {

struct ServerProcess {
  pid_t pid = -1;
  std::string address;   // gRPC host:port ("listening ..."); empty if it did not start
  std::string internal;  // the internal gRPC port ("internal ..."): registry, worker services
  std::string metrics;   // Prometheus host:port ("metrics ...")
  std::string http;      // the router's OpenAI-compatible HTTP API ("http ..."); empty for workers
};

// Runs `binary args...` with an empty signal mask and its stdout on a pipe, and reads the lines
// a server prints once serving (in one write): "listening", "internal", "metrics", and for a
// router "http". The
// pipe is closed afterwards (a server writes nothing else to stdout). On failure `address` is
// empty; a started child must still be reaped.
ServerProcess StartServerProcess(const std::string& binary, const std::vector<std::string>& args);

// tandem-server next to the running executable.
std::string DefaultServerBinary();

// Stops child processes: SIGTERM to all, then waits up to `grace_ms` for them to exit (a server
// drains first), then SIGKILL to whichever has not; every child is reaped.
void StopProcesses(const std::vector<pid_t>& pids, int grace_ms = 5000);

}  // namespace tandem

#endif  // TANDEM_TOOLS_SERVER_PROCESS_H_
