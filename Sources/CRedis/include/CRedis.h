#ifndef HAPPYPATH_CREDIS_H
#define HAPPYPATH_CREDIS_H

// hiredis (Debian libhiredis-dev 0.14) as the Redis protocol only: its
// command formatter and its reply reader. The proxy does its own socket
// I/O (hiredis 0.14 has neither TLS nor timeouts). The reader here makes
// bounded replies: an array longer than HP_REDIS_MAX_ELEMENTS or a string
// longer than HP_REDIS_MAX_STRING is a protocol error, not an allocation
// sized by the peer.

#include <stddef.h>
#include <hiredis/hiredis.h>
#include <hiredis/read.h>

enum {
    HP_REDIS_MAX_ELEMENTS = 1024,
    HP_REDIS_MAX_STRING = 65536,
    // Unread bytes the reader may hold (a reply not complete yet) before the
    // connection is given up: more than any bounded reply takes.
    HP_REDIS_MAX_BUFFERED = 1 << 20,
    // One whole reply, however it nests: at most this many values, and this
    // many string bytes in all (hiredis builds the tree as bytes arrive, so
    // the bound must be kept while it does, not on what is buffered).
    HP_REDIS_MAX_NODES = 16384,
    HP_REDIS_MAX_REPLY_BYTES = 4 << 20,
};

// What the reply being read has taken of its bounds.
typedef struct hp_redis_budget {
    size_t nodes;
    size_t bytes;
} hp_redis_budget;

// A reader whose replies are hiredis's `redisReply`, within the bounds above.
redisReader *hp_redis_reader_new(void);
// redisReaderGetReply within `budget` (kept by the caller across calls until
// a reply is complete; reset when one is). REDIS_ERR past a bound.
int hp_redis_reader_get(redisReader *reader, void **reply, hp_redis_budget *budget);
// Bytes fed and not yet consumed by a reply.
size_t hp_redis_reader_buffered(const redisReader *reader);

#endif
