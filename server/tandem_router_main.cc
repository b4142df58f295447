// tandem-router: the router role of tandem-server (see server/server_main.h).
#include "server/server_main.h"

int main(int argc, char** argv) { return tandem::ServerMain(argc, argv, "router"); }
