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
