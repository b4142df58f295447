// The Tandem server processes: `tandem-server --role=router|prefill|decode|all` and the
// single-role binaries tandem-router, tandem-prefill and tandem-decode.
#ifndef TANDEM_SERVER_SERVER_MAIN_H_
#define TANDEM_SERVER_SERVER_MAIN_H_

namespace tandem {

// `fixed_role` is nullptr for tandem-server (which reads --role). Prints two lines on stdout
// once serving, in one write: "listening HOST:PORT" (gRPC) then "metrics HOST:PORT" (the
// Prometheus endpoint, http://HOST:PORT/metrics); exits 0 after SIGINT/SIGTERM.
int ServerMain(int argc, char** argv, const char* fixed_role);

}  // namespace tandem

#endif  // TANDEM_SERVER_SERVER_MAIN_H_
