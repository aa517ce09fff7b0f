#ifndef HAPPYPATH_CTLS_H
#define HAPPYPATH_CTLS_H

// The proxy's use of OpenSSL, behind opaque pointers: a listener's server
// contexts (one per certificate, chosen by SNI), non-blocking sessions on
// a socket, and certificate checks. Swift sees no OpenSSL type or macro.

#include <stddef.h>

typedef struct hp_tls_server hp_tls_server;

// What a step of a session returns besides a byte count.
enum {
    HP_TLS_DONE = 1,
    HP_TLS_WANT_READ = -1,
    HP_TLS_WANT_WRITE = -2,
    HP_TLS_CLOSED = 0,
    HP_TLS_ERROR = -3,
    HP_TLS_FAILED = -100,
};

// Why a handshake failed (the metric's `reason`).
enum {
    HP_TLS_FAIL_PROTOCOL = 1,        // anything else the peer got wrong
    HP_TLS_FAIL_HTTP_REQUEST = 2,    // plain HTTP on a TLS port
    HP_TLS_FAIL_VERSION = 3,         // not TLS, or a version below min_version
    HP_TLS_FAIL_NO_SHARED_CIPHER = 4,
    HP_TLS_FAIL_ALPN = 5,            // the client offers ALPN, but not http/1.1
    HP_TLS_FAIL_CLOSED = 6,          // the peer hung up mid-handshake
    HP_TLS_FAIL_TOO_LARGE = 7,       // a ClientHello that declares more than the bound
};

// The contexts of one listener: `count` certificate and key files (PEM;
// the certificate file may hold the chain), the first the default. Each
// pair is checked to match. min_tls13: refuse TLS 1.2. offer_h2: ALPN
// offers h2 before http/1.1. NULL on failure, with a message naming the
// file in `err`.
hp_tls_server *hp_tls_server_new(const char *const *certs, const char *const *keys, int count, int min_tls13,
                                 int offer_h2, char *err, size_t errlen);
void hp_tls_server_free(hp_tls_server *server);
int hp_tls_server_count(const hp_tls_server *server);
// The certificate's notAfter as Unix seconds (-1 if it cannot be read).
long long hp_tls_server_not_after(const hp_tls_server *server, int index);

// Checks a certificate and key pair without keeping it: 0 and its notAfter,
// or -1 with a message.
int hp_tls_check_pair(const char *cert, const char *key, long long *not_after, char *err, size_t errlen);

// Looks at (does not read) the first bytes a client sent on `fd`, before
// any OpenSSL state exists for it: HP_TLS_WANT_READ while fewer than a
// record header and a handshake header (9 bytes) of a handshake record
// are there (then the socket wakes only when 9 are, or at its end:
// SO_RCVLOWAT, and `*lowered` is set); HP_TLS_FAILED minus
// HP_TLS_FAIL_TOO_LARGE for a ClientHello that declares more than
// `max_hello` bytes, or minus HP_TLS_FAIL_PROTOCOL for one whose header does
// not fit its first record (its length cannot be checked); else
// HP_TLS_DONE: hand the socket to OpenSSL (which also says what anything
// other than a ClientHello is). Once past the wait, a lowered SO_RCVLOWAT
// is put back.
int hp_tls_hello_check(int fd, size_t max_hello, int *lowered);

// A server session on the non-blocking socket `fd`.
void *hp_tls_session_new(hp_tls_server *server, int fd);
// Frees the session; with `notify`, first sends close_notify (best effort).
void hp_tls_session_free(void *session, int notify);
// One handshake step: HP_TLS_DONE, HP_TLS_WANT_READ, HP_TLS_WANT_WRITE,
// or HP_TLS_FAILED minus one of the HP_TLS_FAIL_ reasons.
int hp_tls_handshake(void *session);
// Bytes read (> 0), HP_TLS_CLOSED, HP_TLS_WANT_READ, HP_TLS_WANT_WRITE or HP_TLS_ERROR.
int hp_tls_read(void *session, void *buffer, int length);
// Bytes written (> 0, perhaps fewer than asked), HP_TLS_WANT_WRITE, HP_TLS_WANT_READ or HP_TLS_ERROR.
int hp_tls_write(void *session, const void *buffer, int length);
// Whether bytes wait inside the session, decrypted or not yet (read them
// before waiting for the socket: it will not wake for them).
int hp_tls_pending(void *session);
// 12 or 13.
int hp_tls_version(void *session);
// 1 if the handshake chose ALPN h2.
int hp_tls_alpn_is_h2(void *session);
// Sends close_notify (the write side's end).
void hp_tls_shutdown(void *session);

// The client side, for the proxy's own HTTP/2 client towards an https://
// upstream: one context per pool (an upstream's `tls` settings), ALPN
// offering only h2, TLS 1.2 at least. `ca` (a PEM file) replaces the
// default CAs (`default_file`, `default_path`, libcurl's); `verify` 0
// skips the certificate and name checks; `cert` and `key` (both or
// neither) are the client certificate for mTLS. NULL on failure, with a
// message naming the file in `err`.
typedef struct hp_tls_client hp_tls_client;
hp_tls_client *hp_tls_client_new(const char *ca, const char *default_file, const char *default_path, int verify,
                                 const char *cert, const char *key, char *err, size_t errlen);
void hp_tls_client_free(hp_tls_client *client);
// SHA-1 of `length` bytes into `out` (20 bytes): the name Redis gives a script (EVALSHA).
void hp_sha1(const void *data, size_t length, unsigned char *out);
// Offers no ALPN protocol (a client of a protocol other than HTTP/2: Redis).
void hp_tls_client_no_alpn(hp_tls_client *client);
// A client session on the connected non-blocking socket `fd`: `host` is
// sent as SNI (unless it is an IP address) and checked against the
// certificate (a name, or an IP address) when the context verifies.
void *hp_tls_client_session_new(hp_tls_client *client, int fd, const char *host);
// One handshake step of a client session: HP_TLS_DONE, HP_TLS_WANT_READ,
// HP_TLS_WANT_WRITE, or HP_TLS_FAILED with what went wrong in `err` (the
// certificate check's words when that failed). Read and write with
// hp_tls_read and hp_tls_write; free with hp_tls_session_free.
int hp_tls_client_handshake(void *session, char *err, size_t errlen);
// hp_tls_read for a client session: on HP_TLS_ERROR, OpenSSL's reason is
// in `err` (a TLS 1.3 server refuses a client certificate only after the
// handshake, with an alert that arrives here).
int hp_tls_client_read(void *session, void *buffer, int length, char *err, size_t errlen);

#endif
