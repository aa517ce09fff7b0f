import HappyPathCore

/// One try in flight, whichever client carries it (libcurl's
/// `UpstreamTransfer` for HTTP/1.1, `HTTP2UpstreamStream` on the proxy's
/// own HTTP/2 client): the mirror of `ClientStream` on the upstream side.
/// On the loop's thread.
public protocol UpstreamTry: AnyObject {
    /// A paused receive goes on (held bytes come again, on a later pass).
    /// From a libevent callback, never from inside a handler method.
    func resume()
    /// No more body to the handler until `resume`.
    func pauseReceiving()
    /// The handler hears nothing more (allowed inside a handler method).
    func detach()
    /// Stops the try without telling its handler. Not from inside a handler method.
    func cancel()
}

extension UpstreamTransfer: UpstreamTry {
    public func detach() { client.detach(self) }
    public func cancel() { client.cancel(self) }
}

/// A loop's upstream clients: libcurl for HTTP/1.1, the proxy's own HTTP/2
/// client for `protocol: h2` upstreams. `start` picks by the request.
public final class UpstreamTransports {
    public let curl: UpstreamClient
    public let h2: HTTP2UpstreamClient

    public init(curl: UpstreamClient, h2: HTTP2UpstreamClient) {
        self.curl = curl
        self.h2 = h2
    }

    public func start(_ request: UpstreamRequest, handler: UpstreamResponseHandler) -> any UpstreamTry {
        if request.httpVersion != .http1 { return h2.start(request, handler: handler) }
        return curl.start(request, handler: handler)
    }

    /// Ends every try of both clients (their handlers are not told).
    public func shutdown() {
        h2.shutdown()
        curl.shutdown()
    }
}
