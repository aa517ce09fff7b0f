#define _GNU_SOURCE
#include <sys/socket.h>
#include <malloc.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <linux/falloc.h>
#include "CShims.h"
#include <openssl/ssl.h>

CURLcode hp_easy_set_long(CURL *easy, CURLoption option, long value) {
    return curl_easy_setopt(easy, option, value);
}
CURLcode hp_easy_set_off(CURL *easy, CURLoption option, curl_off_t value) {
    return curl_easy_setopt(easy, option, value);
}
CURLcode hp_easy_set_ptr(CURL *easy, CURLoption option, const void *value) {
    return curl_easy_setopt(easy, option, value);
}
CURLcode hp_easy_set_write_cb(CURL *easy, CURLoption option,
                              size_t (*cb)(char *, size_t, size_t, void *)) {
    return curl_easy_setopt(easy, option, cb);
}
CURLcode hp_easy_set_closesocket_cb(CURL *easy, curl_closesocket_callback cb) {
    return curl_easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, cb);
}
CURLcode hp_easy_get_long(CURL *easy, CURLINFO info, long *value) {
    return curl_easy_getinfo(easy, info, value);
}
CURLcode hp_easy_get_ptr(CURL *easy, CURLINFO info, void **value) {
    return curl_easy_getinfo(easy, info, value);
}
CURLcode hp_easy_get_socket(CURL *easy, CURLINFO info, curl_socket_t *value) {
    return curl_easy_getinfo(easy, info, value);
}
CURLMcode hp_multi_set_long(CURLM *multi, CURLMoption option, long value) {
    return curl_multi_setopt(multi, option, value);
}
CURLMcode hp_multi_set_ptr(CURLM *multi, CURLMoption option, void *value) {
    return curl_multi_setopt(multi, option, value);
}
CURLMcode hp_multi_set_socket_cb(CURLM *multi, curl_socket_callback cb) {
    return curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, cb);
}
CURLMcode hp_multi_set_timer_cb(CURLM *multi, curl_multi_timer_callback cb) {
    return curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, cb);
}
CURLcode hp_msg_result(CURLMsg *msg) { return msg->data.result; }

void hp_malloc_map_large_blocks(size_t bytes) {
    mallopt(M_MMAP_THRESHOLD, (int)bytes);
}

int hp_accept(int fd, struct sockaddr *addr, socklen_t *len) {
    return accept4(fd, addr, len, SOCK_NONBLOCK | SOCK_CLOEXEC);
}

int hp_open_unlinked(const char *directory) {
    int fd = open(directory, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) return fd;
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/happypath-spool.XXXXXX", directory);
    if (n < 0 || (size_t)n >= sizeof path) return -1;
    fd = mkostemp(path, O_CLOEXEC);
    if (fd >= 0) unlink(path);
    return fd;
}

int hp_punch_hole(int fd, long long offset, long long length) {
    return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)offset, (off_t)length);
}

static CURLcode hp_moving_write_buffer(CURL *easy, void *ssl_ctx, void *userptr) {
    (void)easy;
    (void)userptr;
    SSL_CTX_set_mode((SSL_CTX *)ssl_ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE);
    return CURLE_OK;
}

CURLcode hp_easy_allow_moving_write_buffer(CURL *easy) {
    return curl_easy_setopt(easy, CURLOPT_SSL_CTX_FUNCTION, hp_moving_write_buffer);
}
