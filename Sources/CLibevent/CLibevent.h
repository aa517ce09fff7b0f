// sys/select.h first: libevent's event-config.h defines _GNU_SOURCE, which
// changes fd_set; including it here first keeps one fd_set across modules.
#include <sys/select.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/util.h>
