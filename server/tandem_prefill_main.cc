// tandem-prefill: the prefill role of tandem-server (see server/server_main.h).
#include "server/server_main.h"

int main(int argc, char** argv) { return tandem::ServerMain(argc, argv, "prefill"); }
