#include "CRedis.h"

#include <stdlib.h>
#include <string.h>

// The same objects hiredis's own reader makes (freed by freeReplyObject),
// with the peer's sizes checked before anything is allocated for them.

// The budget of the reply being read on this thread (set around
// redisReaderGetReply: the object functions have no other way to it).
static __thread hp_redis_budget *current;

static int spend(size_t bytes) {
    if (!current) return 1;
    current->nodes += 1;
    current->bytes += bytes;
    return current->nodes <= HP_REDIS_MAX_NODES && current->bytes <= HP_REDIS_MAX_REPLY_BYTES;
}

static redisReply *make(int type) {
    redisReply *r = calloc(1, sizeof(redisReply));
    if (r) r->type = type;
    return r;
}

static void *attach(const redisReadTask *task, redisReply *r) {
    if (r && task->parent) {
        redisReply *parent = task->parent->obj;
        if (task->idx < 0 || (size_t)task->idx >= parent->elements) {
            freeReplyObject(r);
            return NULL;
        }
        parent->element[task->idx] = r;
    }
    return r;
}

static void *create_string(const redisReadTask *task, char *str, size_t len) {
    if (len > HP_REDIS_MAX_STRING || !spend(len)) return NULL;
    redisReply *r = make(task->type);
    if (!r) return NULL;
    r->str = malloc(len + 1);
    if (!r->str) {
        free(r);
        return NULL;
    }
    memcpy(r->str, str, len);
    r->str[len] = 0;
    r->len = len;
    return attach(task, r);
}

static void *create_array(const redisReadTask *task, int elements) {
    if (elements < 0 || elements > HP_REDIS_MAX_ELEMENTS) return NULL;
    if (!spend((size_t)elements * sizeof(redisReply *))) return NULL;
    redisReply *r = make(REDIS_REPLY_ARRAY);
    if (!r) return NULL;
    if (elements > 0) {
        r->element = calloc((size_t)elements, sizeof(redisReply *));
        if (!r->element) {
            free(r);
            return NULL;
        }
    }
    r->elements = (size_t)elements;
    return attach(task, r);
}

static void *create_integer(const redisReadTask *task, long long value) {
    if (!spend(0)) return NULL;
    redisReply *r = make(REDIS_REPLY_INTEGER);
    if (!r) return NULL;
    r->integer = value;
    return attach(task, r);
}

static void *create_nil(const redisReadTask *task) {
    if (!spend(0)) return NULL;
    return attach(task, make(REDIS_REPLY_NIL));
}

static redisReplyObjectFunctions bounded = {create_string, create_array, create_integer, create_nil, freeReplyObject};

redisReader *hp_redis_reader_new(void) { return redisReaderCreateWithFunctions(&bounded); }

size_t hp_redis_reader_buffered(const redisReader *reader) { return reader->len - reader->pos; }

int hp_redis_reader_get(redisReader *reader, void **reply, hp_redis_budget *budget) {
    current = budget;
    int rc = redisReaderGetReply(reader, reply);
    current = NULL;
    if (rc == REDIS_OK && *reply) {
        budget->nodes = 0;
        budget->bytes = 0;
    }
    return rc;
}
