#ifndef HAPPYPATH_CSHIMS_H
#define HAPPYPATH_CSHIMS_H

// Typed wrappers for the C calls Swift cannot make: curl's variadic
// setopt/getinfo, and accept4.
#include <sys/select.h>
#include <curl/curl.h>
#include <sys/socket.h>

// MARK: - curl easy
CURLcode hp_easy_set_long(CURL *easy, CURLoption option, long value);
CURLcode hp_easy_set_off(CURL *easy, CURLoption option, curl_off_t value);
CURLcode hp_easy_set_ptr(CURL *easy, CURLoption option, const void *value);
CURLcode hp_easy_set_write_cb(CURL *easy, CURLoption option,
                              size_t (*cb)(char *, size_t, size_t, void *));
CURLcode hp_easy_set_closesocket_cb(CURL *easy, curl_closesocket_callback cb);
CURLcode hp_easy_get_long(CURL *easy, CURLINFO info, long *value);
CURLcode hp_easy_get_ptr(CURL *easy, CURLINFO info, void **value);
CURLcode hp_easy_get_socket(CURL *easy, CURLINFO info, curl_socket_t *value);
// A TLS connection that may be written from a buffer that moved since a
// write that had to wait (libcurl's OpenSSL backend does not allow it): a
// tunnel's queue grows and compacts between tries.
CURLcode hp_easy_allow_moving_write_buffer(CURL *easy);

// MARK: - curl multi
CURLMcode hp_multi_set_long(CURLM *multi, CURLMoption option, long value);
CURLMcode hp_multi_set_ptr(CURLM *multi, CURLMoption option, void *value);
CURLMcode hp_multi_set_socket_cb(CURLM *multi, curl_socket_callback cb);
CURLMcode hp_multi_set_timer_cb(CURLM *multi, curl_multi_timer_callback cb);
CURLcode hp_msg_result(CURLMsg *msg);

// MARK: - sockets
// accept4 with SOCK_NONBLOCK | SOCK_CLOEXEC (a GNU extension Swift's Glibc
// module does not show): one call instead of accept + two fcntl.
int hp_accept(int fd, struct sockaddr *addr, socklen_t *len);

// MARK: - spool files
// A file in `directory` no one can see: O_TMPFILE where the file system has
// it, else a named file (happypath-spool.XXXXXX) unlinked at once. -1 on failure.
int hp_open_unlinked(const char *directory);
// Frees the blocks of [offset, offset + length) and keeps the file's size
// (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE). 0, or -1 with errno.
int hp_punch_hole(int fd, long long offset, long long length);

// MARK: - memory
// Allocations of `bytes` or more get their own mappings, returned to the
// system when freed. Setting it also turns off glibc's dynamic threshold,
// which after the first large free would serve later large blocks (request
// bodies) from the heap, where freed memory stays with the process.
void hp_malloc_map_large_blocks(size_t bytes);


#endif
