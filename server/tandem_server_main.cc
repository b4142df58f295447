// tandem-server: any role (--role=router|prefill|decode|all); see server/server_main.h.
#include "server/server_main.h"

int main(int argc, char** argv) { return tandem::ServerMain(argc, argv, nullptr); }
