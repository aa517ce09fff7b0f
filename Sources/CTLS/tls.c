#define _GNU_SOURCE
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <openssl/err.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include "CTLS.h"

struct hp_tls_server {
    int count;
    SSL_CTX *contexts[];
};

// TLS 1.2 suites of the "intermediate" profile: forward secrecy, AEAD only.
// TLS 1.3 keeps OpenSSL's own suites.
static const char *const intermediate_ciphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"
    "DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384";

static const unsigned char alpn_http11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
static const unsigned char alpn_h2[] = {2, 'h', '2'};

static void message(char *err, size_t errlen, const char *what, const char *file) {
    unsigned long e = ERR_peek_last_error();
    char reason[256] = "";
    if (e) ERR_error_string_n(e, reason, sizeof reason);
    snprintf(err, errlen, "%s %s%s%s", what, file, e ? ": " : "", reason);
    ERR_clear_error();
}

// A client that offers ALPN gets h2 if the listener offers it and the
// client names it (whatever the client's order: the server's preference),
// else http/1.1, else a no_application_protocol alert. `arg` is non-NULL
// when the listener offers h2. `out` points into the client's list, as
// OpenSSL requires (it is read during the handshake).
static int select_alpn(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
                       unsigned int inlen, void *arg) {
    (void)ssl;
    const unsigned char *choices[2] = {arg ? alpn_h2 : NULL, alpn_http11};
    for (int c = 0; c < 2; c++) {
        const unsigned char *proto = choices[c];
        if (!proto) continue;
        unsigned int i = 0;
        while (i < inlen) {
            unsigned int n = in[i];
            if (n == 0 || n > inlen - i - 1) break;
            if (n == proto[0] && memcmp(in + i + 1, proto + 1, n) == 0) {
                *out = in + i + 1;
                *outlen = (unsigned char)n;
                return SSL_TLSEXT_ERR_OK;
            }
            i += 1 + n;
        }
    }
    return SSL_TLSEXT_ERR_ALERT_FATAL;
}

// SNI: the first certificate that covers the name; none, the default.
static int select_certificate(SSL *ssl, int *alert, void *arg) {
    (void)alert;
    const hp_tls_server *server = arg;
    const char *name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    if (!name || server->count < 2) return SSL_TLSEXT_ERR_OK;
    for (int i = 0; i < server->count; i++) {
        X509 *cert = SSL_CTX_get0_certificate(server->contexts[i]);
        if (cert && X509_check_host(cert, name, 0, 0, NULL) == 1) {
            if (i > 0) SSL_set_SSL_CTX(ssl, server->contexts[i]);
            return SSL_TLSEXT_ERR_OK;
        }
    }
    return SSL_TLSEXT_ERR_OK;
}

static SSL_CTX *context(const char *cert, const char *key, int min_tls13, int offer_h2, char *err, size_t errlen) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        message(err, errlen, "cannot make a TLS context for", cert);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, min_tls13 ? TLS1_3_VERSION : TLS1_2_VERSION);
    SSL_CTX_set_cipher_list(ctx, intermediate_ciphers);
    SSL_CTX_set1_groups_list(ctx, "X25519:P-256:P-384");
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    // Partial writes from a buffer that may move between calls; idle
    // connections give their record buffers back.
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS);
    // Resumption: tickets (OpenSSL's default, keys per context) and the
    // server-side session cache.
    // Read what the socket has in one read(), not a record header and then
    // its body in two: `hp_tls_pending` sees what is buffered that way.
    SSL_CTX_set_read_ahead(ctx, 1);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
    static const unsigned char sid[] = "happypath";
    SSL_CTX_set_session_id_context(ctx, sid, sizeof sid - 1);
    SSL_CTX_set_alpn_select_cb(ctx, select_alpn, offer_h2 ? (void *)alpn_h2 : NULL);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        message(err, errlen, "cannot read the certificate", cert);
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        unsigned long e = ERR_peek_last_error();
        if (ERR_GET_LIB(e) == ERR_LIB_X509 && ERR_GET_REASON(e) == X509_R_KEY_VALUES_MISMATCH) {
            ERR_clear_error();
            snprintf(err, errlen, "the private key %s does not belong to the certificate %s", key, cert);
        } else {
            message(err, errlen, "cannot read the private key", key);
        }
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        ERR_clear_error();
        snprintf(err, errlen, "the private key %s does not belong to the certificate %s", key, cert);
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

hp_tls_server *hp_tls_server_new(const char *const *certs, const char *const *keys, int count, int min_tls13,
                                 int offer_h2, char *err, size_t errlen) {
    ERR_clear_error();
    if (count < 1) {
        snprintf(err, errlen, "no certificate");
        return NULL;
    }
    hp_tls_server *server = calloc(1, sizeof(hp_tls_server) + (size_t)count * sizeof(SSL_CTX *));
    if (!server) return NULL;
    for (int i = 0; i < count; i++) {
        server->contexts[i] = context(certs[i], keys[i], min_tls13, offer_h2, err, errlen);
        if (!server->contexts[i]) {
            hp_tls_server_free(server);
            return NULL;
        }
        server->count = i + 1;
    }
    SSL_CTX_set_tlsext_servername_callback(server->contexts[0], select_certificate);
    SSL_CTX_set_tlsext_servername_arg(server->contexts[0], server);
    return server;
}

void hp_tls_server_free(hp_tls_server *server) {
    if (!server) return;
    for (int i = 0; i < server->count; i++) SSL_CTX_free(server->contexts[i]);
    free(server);
}

int hp_tls_server_count(const hp_tls_server *server) { return server->count; }

static long long not_after(X509 *cert) {
    if (!cert) return -1;
    struct tm tm;
    if (ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm) != 1) return -1;
    return (long long)timegm(&tm);
}

long long hp_tls_server_not_after(const hp_tls_server *server, int index) {
    if (index < 0 || index >= server->count) return -1;
    return not_after(SSL_CTX_get0_certificate(server->contexts[index]));
}

int hp_tls_check_pair(const char *cert, const char *key, long long *expiry, char *err, size_t errlen) {
    ERR_clear_error();
    SSL_CTX *ctx = context(cert, key, 0, 0, err, errlen);
    if (!ctx) return -1;
    *expiry = not_after(SSL_CTX_get0_certificate(ctx));
    SSL_CTX_free(ctx);
    return 0;
}

// OpenSSL sizes its handshake buffer from the length a ClientHello
// declares (up to 131,396 bytes, CLIENT_HELLO_MAX_LENGTH) as soon as it has
// read the message's header, and keeps it until the handshake ends or the
// deadline passes; nothing configurable lowers that bound. So the length is
// looked at here first, with MSG_PEEK, and a connection that has sent
// nothing costs no OpenSSL state at all.
int hp_tls_hello_check(int fd, size_t max_hello, int *lowered) {
    unsigned char b[9];
    ssize_t n = recv(fd, b, sizeof b, MSG_PEEK | MSG_DONTWAIT);
    int rc = HP_TLS_DONE;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return HP_TLS_WANT_READ;
    if (n > 0 && b[0] == 22) {  // a handshake record
        if (n < (ssize_t)sizeof b) {
            // A trickled header: wake when it is whole (or the peer ends),
            // not at each byte (the read event is level-triggered).
            if (!*lowered) {
                int want = (int)sizeof b;
                setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want);
                *lowered = 1;
            }
            return HP_TLS_WANT_READ;
        }
        size_t fragment = ((size_t)b[3] << 8) | b[4];
        size_t declared = ((size_t)b[6] << 16) | ((size_t)b[7] << 8) | b[8];
        if (b[5] == 1) {  // ClientHello
            if (fragment < 4) rc = HP_TLS_FAILED - HP_TLS_FAIL_PROTOCOL;
            else if (declared > max_hello) rc = HP_TLS_FAILED - HP_TLS_FAIL_TOO_LARGE;
        }
    }
    if (*lowered) {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
        *lowered = 0;
    }
    return rc;
}

void *hp_tls_session_new(hp_tls_server *server, int fd) {
    ERR_clear_error();
    SSL *ssl = SSL_new(server->contexts[0]);
    if (!ssl) return NULL;
    SSL_set_fd(ssl, fd);
    SSL_set_accept_state(ssl);
    return ssl;
}

void hp_tls_session_free(void *session, int notify) {
    if (!session) return;
    ERR_clear_error();
    if (notify) SSL_shutdown(session);
    SSL_free(session);
    ERR_clear_error();
}

static int failure_reason(void) {
    unsigned long e = ERR_peek_last_error();
    ERR_clear_error();
    if (ERR_GET_LIB(e) != ERR_LIB_SSL) return HP_TLS_FAIL_PROTOCOL;
    switch (ERR_GET_REASON(e)) {
    case SSL_R_HTTP_REQUEST:
    case SSL_R_HTTPS_PROXY_REQUEST: return HP_TLS_FAIL_HTTP_REQUEST;
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_UNSUPPORTED_PROTOCOL:
    case SSL_R_UNKNOWN_PROTOCOL:
    case SSL_R_VERSION_TOO_LOW: return HP_TLS_FAIL_VERSION;
    case SSL_R_NO_SHARED_CIPHER: return HP_TLS_FAIL_NO_SHARED_CIPHER;
    case SSL_R_NO_APPLICATION_PROTOCOL: return HP_TLS_FAIL_ALPN;
    default: return HP_TLS_FAIL_PROTOCOL;
    }
}

int hp_tls_handshake(void *session) {
    ERR_clear_error();
    int rc = SSL_do_handshake(session);
    if (rc == 1) return HP_TLS_DONE;
    switch (SSL_get_error(session, rc)) {
    case SSL_ERROR_WANT_READ: return HP_TLS_WANT_READ;
    case SSL_ERROR_WANT_WRITE: return HP_TLS_WANT_WRITE;
    case SSL_ERROR_SYSCALL:
        if (ERR_peek_error() == 0) {
            if (errno == EAGAIN || errno == EINTR) return HP_TLS_WANT_READ;
            ERR_clear_error();
            return HP_TLS_FAILED - HP_TLS_FAIL_CLOSED;
        }
        return HP_TLS_FAILED - failure_reason();
    case SSL_ERROR_ZERO_RETURN: return HP_TLS_FAILED - HP_TLS_FAIL_CLOSED;
    default: return HP_TLS_FAILED - failure_reason();
    }
}

static int outcome(void *session, int rc) {
    switch (SSL_get_error(session, rc)) {
    case SSL_ERROR_WANT_READ: return HP_TLS_WANT_READ;
    case SSL_ERROR_WANT_WRITE: return HP_TLS_WANT_WRITE;
    case SSL_ERROR_ZERO_RETURN: return HP_TLS_CLOSED;
    case SSL_ERROR_SYSCALL:
        if (ERR_peek_error() == 0) {
            if (errno == EAGAIN || errno == EINTR) return HP_TLS_WANT_READ;
            // End of stream without close_notify: the peer is gone all the same.
            if (rc == 0 || errno == 0) return HP_TLS_CLOSED;
        }
        ERR_clear_error();
        return HP_TLS_ERROR;
    default:
        ERR_clear_error();
        return HP_TLS_ERROR;
    }
}

int hp_tls_read(void *session, void *buffer, int length) {
    ERR_clear_error();
    int rc = SSL_read(session, buffer, length);
    return rc > 0 ? rc : outcome(session, rc);
}

int hp_tls_write(void *session, const void *buffer, int length) {
    ERR_clear_error();
    int rc = SSL_write(session, buffer, length);
    return rc > 0 ? rc : outcome(session, rc);
}

int hp_tls_pending(void *session) { return SSL_has_pending(session); }

int hp_tls_version(void *session) { return SSL_version(session) == TLS1_3_VERSION ? 13 : 12; }

int hp_tls_alpn_is_h2(void *session) {
    const unsigned char *proto = NULL;
    unsigned int len = 0;
    SSL_get0_alpn_selected(session, &proto, &len);
    return len == 2 && proto[0] == 'h' && proto[1] == '2';
}

void hp_tls_shutdown(void *session) {
    ERR_clear_error();
    SSL_shutdown(session);
    ERR_clear_error();
}

// MARK: - The client side

struct hp_tls_client {
    SSL_CTX *ctx;
    int verify;
};

hp_tls_client *hp_tls_client_new(const char *ca, const char *default_file, const char *default_path, int verify,
                                 const char *cert, const char *key, char *err, size_t errlen) {
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        message(err, errlen, "cannot make a TLS client context", "");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_cipher_list(ctx, intermediate_ciphers);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_read_ahead(ctx, 1);
    // RFC 9113 section 9.2: HTTP/2 over TLS is only ever h2 by ALPN.
    SSL_CTX_set_alpn_protos(ctx, alpn_h2, sizeof alpn_h2);
    if (verify) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        int loaded;
        if (ca) {
            loaded = SSL_CTX_load_verify_locations(ctx, ca, NULL);
        } else if (default_file || default_path) {
            loaded = SSL_CTX_load_verify_locations(ctx, default_file, default_path);
        } else {
            loaded = SSL_CTX_set_default_verify_paths(ctx);
        }
        if (loaded != 1) {
            message(err, errlen, "cannot read the CA certificates", ca ? ca : (default_file ? default_file : ""));
            SSL_CTX_free(ctx);
            return NULL;
        }
    } else {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    }
    if (cert && key) {
        if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
            message(err, errlen, "cannot read the client certificate", cert);
            SSL_CTX_free(ctx);
            return NULL;
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
            message(err, errlen, "cannot use the client key", key);
            SSL_CTX_free(ctx);
            return NULL;
        }
    }
    hp_tls_client *client = calloc(1, sizeof(hp_tls_client));
    if (!client) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    client->ctx = ctx;
    client->verify = verify;
    ERR_clear_error();
    return client;
}

void hp_tls_client_no_alpn(hp_tls_client *client) { SSL_CTX_set_alpn_protos(client->ctx, NULL, 0); }

void hp_tls_client_free(hp_tls_client *client) {
    if (!client) return;
    SSL_CTX_free(client->ctx);
    free(client);
}

void *hp_tls_client_session_new(hp_tls_client *client, int fd, const char *host) {
    ERR_clear_error();
    SSL *ssl = SSL_new(client->ctx);
    if (!ssl) return NULL;
    SSL_set_fd(ssl, fd);
    SSL_set_connect_state(ssl);
    unsigned char ip[16];
    int is_ip = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
    // RFC 6066 section 3: no IP address in SNI.
    if (!is_ip) SSL_set_tlsext_host_name(ssl, host);
    if (client->verify) {
        X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
        X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, host) : X509_VERIFY_PARAM_set1_host(param, host, 0);
        if (ok != 1) {
            SSL_free(ssl);
            ERR_clear_error();
            return NULL;
        }
    }
    return ssl;
}

int hp_tls_client_handshake(void *session, char *err, size_t errlen) {
    ERR_clear_error();
    int rc = SSL_do_handshake(session);
    if (rc == 1) return HP_TLS_DONE;
    int e = SSL_get_error(session, rc);
    if (e == SSL_ERROR_WANT_READ) return HP_TLS_WANT_READ;
    if (e == SSL_ERROR_WANT_WRITE) return HP_TLS_WANT_WRITE;
    long verified = SSL_get_verify_mode(session) == SSL_VERIFY_NONE ? X509_V_OK : SSL_get_verify_result(session);
    if (verified != X509_V_OK) {
        snprintf(err, errlen, "the upstream's certificate was not accepted: %s",
                 X509_verify_cert_error_string(verified));
    } else if ((e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) || e == SSL_ERROR_ZERO_RETURN) {
        if (e == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EINTR)) return HP_TLS_WANT_READ;
        snprintf(err, errlen, "the upstream closed the connection during the TLS handshake");
    } else {
        unsigned long last = ERR_peek_last_error();
        char reason[256] = "";
        if (last) ERR_error_string_n(last, reason, sizeof reason);
        snprintf(err, errlen, "the TLS handshake with the upstream failed: %s", reason);
    }
    ERR_clear_error();
    return HP_TLS_FAILED;
}

int hp_tls_client_read(void *session, void *buffer, int length, char *err, size_t errlen) {
    ERR_clear_error();
    int rc = SSL_read(session, buffer, length);
    if (rc > 0) return rc;
    if (SSL_get_error(session, rc) == SSL_ERROR_SSL) {
        const char *reason = ERR_reason_error_string(ERR_peek_last_error());
        snprintf(err, errlen, "%s", reason ? reason : "a TLS error");
    }
    return outcome(session, rc);
}

void hp_sha1(const void *data, size_t length, unsigned char *out) { SHA1(data, length, out); }
