internal import CLibevent
internal import CShims
import HappyPathCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Bounds on what a client may send; libevent enforces them while reading.
public struct HTTPServerLimits: Sendable {
    public var maxHeaderBytes: Int
    public var maxBodyBytes: Int
    /// Read and write inactivity timeout for a client connection.
    public var timeout: Duration

    public init(maxHeaderBytes: Int, maxBodyBytes: Int, timeout: Duration) {
        self.maxHeaderBytes = maxHeaderBytes
        self.maxBodyBytes = maxBodyBytes
        self.timeout = timeout
    }
}

/// Why libevent refused a request before a handler saw it.
public enum RejectedRequest: Sendable {
    case malformed
    case headersTooLarge
    case bodyTooLarge
    case methodNotAllowed
    case other(status: Int)
}

/// Receives requests on the server's loop thread. Each request must be
/// answered exactly once (a reply, a streamed reply, or `abort()`).
public protocol HTTPServerDelegate: AnyObject {
    func serve(_ request: HTTPRequest)
    func reject(_ request: HTTPRequest, reason: RejectedRequest)
}

public enum SocketError: Error, CustomStringConvertible {
    case cannotBind(address: String, errno: Int32)
    case badAddress(String)

    public var description: String {
        switch self {
        case let .cannotBind(address, e): "cannot listen on \(address): \(String(cString: strerror(e)))"
        case let .badAddress(a): "cannot resolve listen address \(a)"
        }
    }
}

/// An evhttp server on one event loop. With `reusePort`, several servers on
/// several loops share one port (SO_REUSEPORT) and the kernel spreads
/// connections across them.
public final class HTTPServer {
    private let http: OpaquePointer
    public let limits: HTTPServerLimits
    public private(set) var port: Int = 0
    private var boundSocket: OpaquePointer?
    /// Unowned(unsafe): the delegate owns the server and closes it first.
    unowned(unsafe) var delegate: HTTPServerDelegate?
    let loop: EventLoop

    public init(
        loop: EventLoop, host: String, port: Int, reusePort: Bool, limits: HTTPServerLimits,
        delegate: HTTPServerDelegate
    ) throws(SocketError) {
        self.loop = loop
        self.limits = limits
        self.delegate = delegate
        http = evhttp_new(loop.base)
        installErrorHook()
        evhttp_set_max_headers_size(http, limits.maxHeaderBytes)
        evhttp_set_max_body_size(http, limits.maxBodyBytes)
        var tv = timeval(limits.timeout)
        evhttp_set_timeout_tv(http, &tv)
        evhttp_set_allowed_methods(http, UInt16(0x1FF))  // all nine methods libevent knows
        // No invented Content-Type: a response has the upstream's, or none.
        evhttp_set_default_content_type(http, nil)
        // Read an oversized body to its end before answering 413, so the
        // client sees the answer instead of a reset while it is still sending.
        evhttp_set_flags(http, EVHTTP_SERVER_LINGERING_CLOSE)
        evhttp_set_gencb(http, httpServerRequestCallback, Unmanaged.passUnretained(self).toOpaque())

        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV
        var result: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &result) == 0, let info = result else {
            evhttp_free(http)
            throw .badAddress("\(host):\(port)")
        }
        defer { freeaddrinfo(result) }
        var flags = UInt32(LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC)
        if reusePort { flags |= UInt32(LEV_OPT_REUSEABLE_PORT) }
        guard
            let listener = evconnlistener_new_bind(
                loop.base, nil, nil, flags, 1024, info.pointee.ai_addr, Int32(info.pointee.ai_addrlen))
        else {
            let e = errno
            evhttp_free(http)
            throw .cannotBind(address: "\(host):\(port)", errno: e)
        }
        // Accepted sockets inherit TCP_NODELAY from the listener on Linux: a
        // response head and its body, written separately, must not wait for
        // the client's delayed ACK (Nagle), which costs 40 ms a response.
        var one: Int32 = 1
        setsockopt(evconnlistener_get_fd(listener), Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        boundSocket = evhttp_bind_listener(http, listener)
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                _ = getsockname(evconnlistener_get_fd(listener), $0, &len)
            }
        }
        self.port = withUnsafeBytes(of: &storage) { raw -> Int in
            let family = raw.load(fromByteOffset: 0, as: sa_family_t.self)
            let offset = family == sa_family_t(AF_INET6) ? 2 : 2
            let be = raw.load(fromByteOffset: offset, as: UInt16.self)
            return Int(UInt16(bigEndian: be))
        }
        let me = UInt(bitPattern: Unmanaged.passUnretained(self).toOpaque())
        ServerRegistry.shared.withLock { $0[ServerRegistry.key(http)] = me }
    }

    /// Stops accepting new connections; open ones keep being served. On the loop's thread.
    public func stopAccepting() {
        if let boundSocket { evhttp_del_accept_socket(http, boundSocket) }
        boundSocket = nil
    }

    /// Stops accepting and closes every connection. On the loop's thread.
    public func close() {
        ServerRegistry.shared.withLock { _ = $0.removeValue(forKey: ServerRegistry.key(http)) }
        evhttp_free(http)
    }

    fileprivate func handle(_ raw: UnsafeMutablePointer<evhttp_request>) {
        delegate?.serve(HTTPRequest(raw))
    }

    fileprivate func reject(_ raw: UnsafeMutablePointer<evhttp_request>, status: Int32) {
        let reason: RejectedRequest
        switch status {
        case 400:
            // libevent reports an oversized head as a parse error (400); tell
            // the two apart by how much head it had read and buffered.
            var headBytes = raw.pointee.headers_size
            if let evcon = evhttp_request_get_connection(raw), let bev = evhttp_connection_get_bufferevent(evcon) {
                headBytes += evbuffer_get_length(bufferevent_get_input(bev))
            }
            reason = headBytes > limits.maxHeaderBytes ? .headersTooLarge : .malformed
        case 405, 501: reason = .methodNotAllowed
        case 413: reason = .bodyTooLarge
        default: reason = .other(status: Int(status))
        }
        if raw.pointee.major == 0 {  // no parsable request line: answer in HTTP/1.1
            raw.pointee.major = 1
            raw.pointee.minor = 1
        }
        let request = HTTPRequest(raw)
        request.closeAfterReply = true
        if let delegate { delegate.reject(request, reason: reason) } else { request.reply(status: Int(status)) }
    }
}

/// evhttp → HTTPServer, for the error hook, which gets only a request.
private enum ServerRegistry {
    /// Keys and values are pointer bit patterns (evhttp → unretained HTTPServer).
    static let shared = Mutex<[UInt: UInt]>([:])

    static func key(_ http: OpaquePointer) -> UInt { UInt(bitPattern: UnsafeRawPointer(http)) }
}

private let errorHookInstalled: Bool = {
    hp_set_error_hook { raw, status, _ in
        guard let raw else { return }
        let evcon = evhttp_request_get_connection(raw)
        let server = evcon.flatMap(evhttp_connection_get_server).flatMap { http in
            ServerRegistry.shared.withLock { $0[ServerRegistry.key(http)] }
        }
        if let server, let pointer = UnsafeMutableRawPointer(bitPattern: server) {
            Unmanaged<HTTPServer>.fromOpaque(pointer).takeUnretainedValue().reject(raw, status: status)
        } else {
            evhttp_add_header(evhttp_request_get_output_headers(raw), "Connection", "close")
            evhttp_send_reply(raw, status, "Error", nil)
        }
    }
    return true
}()

private func installErrorHook() { _ = errorHookInstalled }

private func httpServerRequestCallback(_ req: UnsafeMutablePointer<evhttp_request>?, _ arg: UnsafeMutableRawPointer?) {
    guard let req, let arg else { return }
    Unmanaged<HTTPServer>.fromOpaque(arg).takeUnretainedValue().handle(req)
}
