#ifndef HAPPYPATH_CSHIMS_H
#define HAPPYPATH_CSHIMS_H

// Typed wrappers for the C calls Swift cannot make: curl's variadic
// setopt/getinfo, and a hook that replaces libevent's HTML error pages.
#include <sys/select.h>
#include <curl/curl.h>
#include <event2/http.h>

// MARK: - curl easy
CURLcode hp_easy_set_long(CURL *easy, CURLoption option, long value);
CURLcode hp_easy_set_off(CURL *easy, CURLoption option, curl_off_t value);
CURLcode hp_easy_set_ptr(CURL *easy, CURLoption option, const void *value);
CURLcode hp_easy_set_write_cb(CURL *easy, CURLoption option,
                              size_t (*cb)(char *, size_t, size_t, void *));
CURLcode hp_easy_set_closesocket_cb(CURL *easy, curl_closesocket_callback cb);
CURLcode hp_easy_get_long(CURL *easy, CURLINFO info, long *value);
CURLcode hp_easy_get_ptr(CURL *easy, CURLINFO info, void **value);

// MARK: - curl multi
CURLMcode hp_multi_set_long(CURLM *multi, CURLMoption option, long value);
CURLMcode hp_multi_set_ptr(CURLM *multi, CURLMoption option, void *value);
CURLMcode hp_multi_set_socket_cb(CURLM *multi, curl_socket_callback cb);
CURLMcode hp_multi_set_timer_cb(CURLM *multi, curl_multi_timer_callback cb);
CURLcode hp_msg_result(CURLMsg *msg);

// MARK: - libevent error pages
// libevent 2.1 answers malformed or oversized requests itself with an HTML
// page through evhttp_send_error, before any user callback sees the request.
// This library defines evhttp_send_error, which takes precedence over
// libevent's own (libevent calls it through the PLT), and forwards to the
// hook so the server can answer with its problem+json body instead.
typedef void (*hp_error_hook)(struct evhttp_request *req, int status, const char *reason);
void hp_set_error_hook(hp_error_hook hook);

#endif
