internal import CLibevent
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// Where one pool's connections go and how they speak: made once per
/// endpoint (its origin and connect-to entry) by `HTTP2UpstreamClient`.
struct HTTP2Endpoint {
    let scheme: String
    /// `:authority`: the origin's `host:port` (what libcurl sends as `Host`).
    let authority: String
    /// Where connections go: an IP address, or a name resolved (by
    /// libevent's `evdns`, asynchronously) each time a connection opens.
    let target: Target
    /// The first try's; the pool keeps the longest any try asked (`connectTimeout`).
    let connectTimeout: Duration
    let limits: HTTP2ClientLimits
    /// https://: the upstream's `tls` settings (nil: verify with the default CAs).
    let tls: UpstreamTLS?
    var isTLS: Bool { scheme == "https" }
    /// The origin's host (SNI and the certificate's name), whatever connect-to says.
    let host: String

    enum Target {
        case address(HTTP2Address)
        case name(String, port: Int)
    }

    /// The endpoint of `request`, or nil when its origin is not an
    /// http:// or https:// `host[:port]`.
    init?(_ request: UpstreamRequest, limits: HTTP2ClientLimits) {
        let (scheme, authority) = HTTP2RequestFields.split(request.origin)
        guard scheme == "http" || scheme == "https" else { return nil }
        let defaultPort = scheme == "https" ? 443 : 80
        guard let (originHost, _) = Self.hostAndPort(authority, defaultPort: defaultPort) else { return nil }
        // The connection goes to connect-to's host and port when there is one.
        var target = authority
        if let connectTo = request.connectTo {
            // HOST:PORT:CONNECT-HOST:CONNECT-PORT (the connect host may be a bracketed IPv6 literal).
            let parts = connectTo.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            guard parts.count == 3 else { return nil }
            target = String(parts[2])
        }
        guard let (host, port) = Self.hostAndPort(target, defaultPort: defaultPort) else { return nil }
        self.target = HTTP2Address(host: host, port: port).map { .address($0) } ?? .name(host, port: port)
        self.scheme = scheme
        self.authority = authority
        connectTimeout = request.connectTimeout
        self.limits = limits
        tls = request.tls
        self.host = originHost
    }

    /// `host:port` or `[v6]:port` (no port: `defaultPort`).
    static func hostAndPort(_ text: String, defaultPort: Int) -> (String, Int)? {
        var host = Substring(text)
        var port = defaultPort
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return nil }
            let rest = host[host.index(after: close)...]
            host = host[host.index(after: host.startIndex)..<close]
            if rest.hasPrefix(":") {
                guard let p = Int(rest.dropFirst()) else { return nil }
                port = p
            } else if !rest.isEmpty {
                return nil
            }
        } else if let colon = host.lastIndex(of: ":") {
            guard let p = Int(host[host.index(after: colon)...]) else { return nil }
            port = p
            host = host[..<colon]
        }
        guard (1...65535).contains(port), !host.isEmpty else { return nil }
        return (String(host), port)
    }
}

/// One address a connection goes to: an IP address and port.
struct HTTP2Address {
    let family: Int32
    private let storage: sockaddr_storage
    private let length: socklen_t

    /// `host` as an IPv4 or IPv6 literal (nil: a name).
    init?(host: String, port: Int) {
        var storage = sockaddr_storage()
        let v6 = host.contains(":")
        let ok = withUnsafeMutableBytes(of: &storage) { raw -> Bool in
            if v6 {
                let a = raw.baseAddress!.assumingMemoryBound(to: sockaddr_in6.self)
                a.pointee.sin6_family = sa_family_t(AF_INET6)
                a.pointee.sin6_port = in_port_t(UInt16(port).bigEndian)
                return inet_pton(AF_INET6, host, &a.pointee.sin6_addr) == 1
            }
            let a = raw.baseAddress!.assumingMemoryBound(to: sockaddr_in.self)
            a.pointee.sin_family = sa_family_t(AF_INET)
            a.pointee.sin_port = in_port_t(UInt16(port).bigEndian)
            return inet_pton(AF_INET, host, &a.pointee.sin_addr) == 1
        }
        guard ok else { return nil }
        self.storage = storage
        family = v6 ? AF_INET6 : AF_INET
        length = socklen_t(v6 ? MemoryLayout<sockaddr_in6>.size : MemoryLayout<sockaddr_in>.size)
    }

    /// An address the resolver gave (IPv4 or IPv6 only).
    init?(_ address: UnsafePointer<sockaddr>, length: Int) {
        let family = Int32(address.pointee.sa_family)
        guard family == AF_INET || family == AF_INET6, length > 0, length <= MemoryLayout<sockaddr_storage>.size
        else { return nil }
        var storage = sockaddr_storage()
        withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: UnsafeRawBufferPointer(start: address, count: length)) }
        self.storage = storage
        self.family = family
        self.length = socklen_t(length)
    }

    func withSockaddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> R) -> R {
        withUnsafeBytes(of: storage) { body($0.baseAddress!.assumingMemoryBound(to: sockaddr.self), length) }
    }
}

/// The driver of one endpoint's pool on one loop: owns its connections and
/// the tries waiting for a stream, and performs what
/// `HTTP2ClientPoolStateMachine` decides.
final class HTTP2ConnectionPool: LoopEventTarget {
    /// Alive: the client's `pools` holds this pool until the client's `shutdown()`, after the pool's own;
    /// by then its waiting tries have failed, its connections are closed and its timer is recycled.
    unowned let client: HTTP2UpstreamClient
    let endpoint: HTTP2Endpoint
    private var machine: HTTP2ClientPoolStateMachine
    private(set) var connections: [Int: HTTP2UpstreamConnection] = [:]
    private var waiting: [Int: HTTP2UpstreamStream] = [:]
    private var idleTimer: LoopEvent?
    private var idleArmedFor: Instant?

    /// The upstream's counters (`happypath_upstream_h2_*`).
    let counters: HTTP2ClientCounters

    init(
        client: HTTP2UpstreamClient, endpoint: HTTP2Endpoint, counters: HTTP2ClientCounters, maxConnections: Int,
        idleTimeout: Duration
    ) {
        self.client = client
        self.endpoint = endpoint
        self.counters = counters
        connectTimeout = endpoint.connectTimeout
        machine = HTTP2ClientPoolStateMachine(
            maxConnections: maxConnections, idleTimeout: idleTimeout, pingAfterSilence: client.pingAfterSilence)
    }

    /// What a new connection's connect and SETTINGS get: the longest a try
    /// asked (`min(connect_timeout, the try's own limit)`: the first try
    /// may have had little time left, the upstream's `connect_timeout` is
    /// the bound; a changed one makes a new upstream guard, so a new pool).
    private(set) var connectTimeout: Duration

    /// The TLS client context of an https:// endpoint, read when its first
    /// connection's handshake starts (a file that cannot be read fails that
    /// handshake, and is read again for the next).
    private var tlsContext: HTTP2TLSClientContext?

    func tlsClientContext() throws(TLSSetupError) -> HTTP2TLSClientContext {
        if let tlsContext { return tlsContext }
        let made = try HTTP2TLSClientContext(endpoint.tls, host: endpoint.host, defaultCA: UpstreamClient.libcurlDefaultCA)
        tlsContext = made
        return made
    }

    func start(_ stream: HTTP2UpstreamStream) {
        connectTimeout = max(connectTimeout, stream.request.connectTimeout)
        waiting[stream.tryID] = stream
        stream.pool = self
        perform(machine.want(stream.tryID, at: client.clock()))
    }

    /// A try whose stream was refused unprocessed: first in line for another.
    func replay(_ stream: HTTP2UpstreamStream) {
        guard stream.machine.state == .waiting else { return }  // cancelled meanwhile
        counters.replayed.wrappingAdd(1, ordering: .relaxed)
        waiting[stream.tryID] = stream
        stream.pool = self
        perform(machine.want(stream.tryID, at: client.clock(), replayed: true))
    }

    func withdraw(_ stream: HTTP2UpstreamStream) {
        waiting[stream.tryID] = nil
        machine.cancelled(stream.tryID)
    }

    func connectionReady(_ connection: HTTP2UpstreamConnection, maxStreams: Int) {
        perform(machine.opened(connection.id, maxStreams: maxStreams, at: client.clock()))
    }

    func capacityChanged(_ connection: HTTP2UpstreamConnection, maxStreams: Int) {
        perform(machine.capacityChanged(connection.id, maxStreams: maxStreams, at: client.clock()))
    }

    func streamEnded(on connection: HTTP2UpstreamConnection) {
        guard machine.connections.contains(where: { $0.id == connection.id && $0.streams > 0 }) else { return }
        counters.streams.wrappingAdd(-1, ordering: .relaxed)
        perform(machine.streamEnded(connection.id, at: client.clock()))
    }

    /// Bytes came from the server (once per read turn).
    func heard(on connection: HTTP2UpstreamConnection, at now: Instant) { machine.heard(connection.id, at: now) }

    func pingAnswered(on connection: HTTP2UpstreamConnection) {
        perform(machine.pingAnswered(connection.id, at: client.clock()))
    }

    func goaway(on connection: HTTP2UpstreamConnection) {
        perform(machine.goaway(connection.id))
    }

    func connectionClosed(
        _ connection: HTTP2UpstreamConnection, reason: HTTP2ClientConnectionStateMachine.CloseReason, served: Bool
    ) {
        guard connections.removeValue(forKey: connection.id) != nil else { return }
        let streams = machine.connections.first { $0.id == connection.id }?.streams ?? 0
        counters.streams.wrappingAdd(-streams, ordering: .relaxed)
        counters.connections.wrappingAdd(-1, ordering: .relaxed)
        // One that answered nothing whole (GOAWAY at once, no SETTINGS, a failed
        // connect) counts towards the backoff, however it closed.
        perform(machine.connectionClosed(connection.id, failure: reason.connectFailure, served: served, at: client.clock()))
    }

    func shutdown() {
        perform(machine.shutdown())
        idleTimer?.recycle()
        idleTimer = nil
    }

    func loopEventFired(_ event: LoopEvent) {
        idleArmedFor = nil
        perform(machine.timer(at: client.clock()))
    }

    private func perform(_ actions: [HTTP2ClientPoolStateMachine.Action]) {
        for action in actions {
            switch action {
            case let .open(id):
                let connection = HTTP2UpstreamConnection(pool: self, id: id)
                connections[id] = connection
                counters.opened.wrappingAdd(1, ordering: .relaxed)
                counters.connections.wrappingAdd(1, ordering: .relaxed)
                connection.open()
            case let .assign(tryID, id):
                guard let stream = waiting.removeValue(forKey: tryID) else { continue }
                stream.pool = nil
                counters.streams.wrappingAdd(1, ordering: .relaxed)
                if let connection = connections[id] {
                    connection.submit(stream)
                } else {
                    stream.failedWaiting("the upstream connection closed before the request was sent")
                    client.soon(stream)
                }
            case let .fail(tryID, why):
                guard let stream = waiting.removeValue(forKey: tryID) else { continue }
                stream.failedWaiting(why)
                client.soon(stream)  // never inside `start`: the handler hears it on the next pass
            case let .close(id, _):
                connections[id]?.closeRequested()
            case let .verify(id):
                connections[id]?.verify()
            }
        }
        armIdleTimer()
    }

    private func armIdleTimer() {
        guard !machine.isShutDown, let deadline = machine.nextDeadline else { return }
        if let armed = idleArmedFor, armed <= deadline { return }
        if idleTimer == nil { idleTimer = client.loop.takeEvent(target: self) }
        idleArmedFor = deadline
        idleTimer?.arm(afterNanoseconds: max(0, (deadline - client.clock()).nanoseconds))
    }
}
