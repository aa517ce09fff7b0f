/// `upstreams.NAME.protocol`: the HTTP version the proxy speaks to an
/// upstream's endpoints (docs/configuration.md).
public enum UpstreamProtocol: String, Sendable, CaseIterable {
    /// HTTP/1.1, one request at a time per connection (the default).
    case http1
    /// HTTP/2 on the proxy's own HTTP/2 client: over TLS with ALPN `h2`
    /// for an https:// endpoint, with prior knowledge (h2c) for an http://
    /// one; tries share connections as streams.
    case h2
}
