import HappyPathCore

/// One try against one endpoint, as libcurl will send it.
public struct UpstreamRequest {
    /// `scheme://host:port/` of the endpoint: what libcurl connects to.
    public var origin: String
    /// Sent verbatim as the request target (endpoint path + command target).
    public var target: String
    public var method: String
    /// Sent as they are, in order (the block stays alive for the try).
    public var headers: HeaderBlock
    /// Sent instead of any field of the same name in `headers` (credentials).
    public var replacing: HTTPField?
    /// A second such field: a gRPC try's `grpc-timeout`, the time its call has left.
    public var replacingAlso: HTTPField?
    public var body: RequestBody
    /// The body as it streams from the client, read as libcurl sends it
    /// (nil: `body` is the whole body). Its length is the client's
    /// `content-length` if it gave one; else an HTTP/1.1 upstream gets it chunked.
    public var bodyStream: RequestBodyStream?
    /// Whether a body (possibly empty, with `Content-Length: 0`) is sent.
    public var sendsBody: Bool
    /// How long the connection attempt may take.
    public var connectTimeout: Duration
    /// A response that stalls (no byte from upstream) this long is cut. The
    /// deadline for the response head is the caller's: a timer of its own,
    /// so a long body streaming to a slow client is not cut by it.
    public var idleTimeout: Duration
    /// How an https:// origin is verified (nil: libcurl's defaults).
    public var tls: UpstreamTLS?
    /// `HOST:PORT:CONNECT-HOST:CONNECT-PORT`: the origin names one host
    /// (SNI, verification, `Host`), the connection goes to another.
    public var connectTo: String?
    /// HTTP/1.1 (libcurl), or HTTP/2 as the endpoint's scheme allows (the
    /// proxy's own HTTP/2 client, `HTTP2UpstreamClient`).
    public var httpVersion: UpstreamHTTPVersion
    /// The upstream's counters for the HTTP/2 client (`happypath_upstream_h2_*`).
    public var h2Counters: HTTP2ClientCounters?

    public init(
        origin: String, target: String, method: String, headers: HeaderBlock, replacing: HTTPField? = nil,
        body: RequestBody, sendsBody: Bool, connectTimeout: Duration, idleTimeout: Duration, tls: UpstreamTLS? = nil,
        connectTo: String? = nil, httpVersion: UpstreamHTTPVersion = .http1, bodyStream: RequestBodyStream? = nil,
        replacingAlso: HTTPField? = nil
    ) {
        self.replacingAlso = replacingAlso
        self.bodyStream = bodyStream
        self.tls = tls
        self.connectTo = connectTo
        self.httpVersion = httpVersion
        self.origin = origin
        self.target = target
        self.method = method
        self.headers = headers
        self.replacing = replacing
        self.body = body
        self.sendsBody = sendsBody
        self.connectTimeout = connectTimeout
        self.idleTimeout = idleTimeout
    }
}

/// How the proxy speaks to one endpoint: `upstreams.NAME.protocol` with
/// the endpoint's scheme, decided once per configuration; it picks the
/// client (`UpstreamTransports.start`).
public enum UpstreamHTTPVersion: Sendable, Equatable {
    /// HTTP/1.1 (`protocol: http1`, the default): libcurl.
    case http1
    /// HTTP/2 over TLS with ALPN `h2` (an https:// endpoint): the proxy's own HTTP/2 client.
    case h2
    /// HTTP/2 with prior knowledge on a plain connection (h2c, an http://
    /// endpoint): the proxy's own HTTP/2 client.
    case h2PriorKnowledge

    public init(_ protocol: UpstreamProtocol, origin: String) {
        switch `protocol` {
        case .http1: self = .http1
        case .h2: self = origin.lowercased().hasPrefix("https://") ? .h2 : .h2PriorKnowledge
        }
    }
}

/// An upstream's TLS settings (`upstreams.NAME.tls`), made once per
/// configuration and applied to a pooled handle only when they differ from
/// what the handle last used.
public final class UpstreamTLS: Sendable {
    let ca: String?
    let verify: Bool
    let clientCert: String?
    let clientKey: String?

    public init(ca: String?, verify: Bool, clientCert: String?, clientKey: String?) {
        self.ca = ca
        self.verify = verify
        self.clientCert = clientCert
        self.clientKey = clientKey
    }
}

/// How a try failed, typed where it arises (libcurl's result) so policies
/// and error rendering never look at curl codes.
public enum UpstreamFailure: Error, Sendable, Equatable {
    /// No connection: refused, unresolvable, or connect timed out. The
    /// request never left, so it is always safe to try again.
    case connectFailed(String)
    /// The try ran out of time after the request was sent.
    case timeout
    /// The connection dropped before the response was complete.
    case reset(String)
    /// The upstream reset the try's HTTP/2 stream (RST_STREAM): the try
    /// failed as a dropped connection does, but the server answered, so it
    /// is alive (a health check counts it as passed).
    case streamReset(String)
    /// What came back was not valid HTTP.
    case badResponse(String)
    /// The TLS connection failed: the certificate was not verified, or no
    /// common protocol or cipher (not transient: not retried).
    case tls(String)
    /// Anything else libcurl reports.
    case other(String)

}

/// Receives one try's response, on the loop thread, from inside libcurl's
/// callbacks (so it must not call back into the client except `resume`
/// later, from a libevent callback).
public protocol UpstreamResponseHandler: AnyObject {
    /// The final (non-1xx) status line arrived; `reason` is its reason
    /// phrase as sent (possibly empty), valid only during the call.
    func upstreamStatus(_ status: Int, reason: UnsafeRawBufferPointer)
    /// A header of the final response; the bytes are valid only during the call.
    func upstreamHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer)
    /// A complete informational (1xx) answer other than 100 and 101, its
    /// fields as `Name: value\r\n` lines (checked: token names, no control
    /// bytes, hop-by-hop fields dropped), valid only during the call. At most
    /// `UpstreamTransfer.maxInformational` per try, each at most
    /// `maxInformationalBytes`; the rest are dropped.
    func upstreamInformational(_ status: Int, fields: UnsafeRawBufferPointer)
    /// The final response's head is complete. A non-nil reason refuses it:
    /// the try ends as `.badResponse(reason)` and its connection is closed,
    /// never reused (its framing cannot be trusted).
    func upstreamHeadersComplete() -> String?
    /// Body bytes. Return false to pause: the bytes are not consumed and come
    /// again after `UpstreamTransfer.resume()`.
    func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool
    /// A trailer field, after the body (HTTP/2 trailers, or an HTTP/1.1
    /// chunked body's): checked (token name, no control bytes), hop-by-hop
    /// and framing fields dropped; the bytes are valid only during the call.
    /// libcurl 7.88.1 hands them over only for an answer without
    /// `Content-Length`. Dropped unless the handler takes them.
    func upstreamTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer)
    /// The try ended: nil on a complete response.
    func upstreamFinished(_ failure: UpstreamFailure?)
}

extension UpstreamResponseHandler {
    public func upstreamTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {}
}
