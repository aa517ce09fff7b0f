/// `upstreams.NAME.protocol`: the HTTP version the proxy speaks to an
/// upstream's endpoints (docs/configuration.md).
public enum UpstreamProtocol: String, Sendable, CaseIterable {
    /// HTTP/1.1, one request at a time per connection (the default).
    case http1
    /// HTTP/2: over TLS by ALPN for an https:// endpoint (streams share a
    /// connection), with prior knowledge (h2c) for an http:// one (one
    /// stream per connection with libcurl 7.88.1: docs/plans/http2.md §4).
    case h2
}

/// `upstreams.NAME.h2_client`: which client carries `protocol: h2` to an
/// http:// endpoint (h2c) while the proxy's own HTTP/2 client is being
/// built (docs/plans/upstream-h2.md). Transitional: it goes when libcurl's
/// HTTP/2 path does.
public enum UpstreamH2Client: String, Sendable, CaseIterable {
    /// libcurl: one connection per try (7.88.1 cannot reuse an h2c connection).
    case libcurl
    /// The proxy's own nghttp2 client: tries share connections as streams.
    case nghttp2
}
