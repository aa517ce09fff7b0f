import HappyPathCore
import HappyPathIO
import HappyPathStore

/// What goes upstream for a client's request: its fields as they are
/// forwarded (hop-by-hop ones removed, forwarding ones added) written once
/// into one block, its body, its deadline.
enum ForwardedRequest {
    /// The command for `request`, which takes its body.
    /// - Parameter passesTrailers: the upstream speaks HTTP/2: a client's
    ///   `TE: trailers` becomes the proxy's own `TE: trailers` to it (an
    ///   HTTP/1.1 upstream gets no `TE`, a hop-by-hop field).
    static func command(
        from request: HTTPRequest, method: String, target: String, route: RuntimeRoute, upstream: String,
        passesTrailers: Bool = false, deadline: Instant, ids: inout IdentifierGenerator, tracer: Tracer? = nil,
        trace: inout RequestTrace?, now: Instant = Instant(nanoseconds: 0), body: RequestBody? = nil
    ) -> Command {
        // Room for every field (each gains an 8-byte prefix) and the five
        // added ones, so the block is allocated once.
        let headers = HeaderBlock(capacity: request.headBytes * 2 + 384)
        var requestID: String?
        var host: UnsafeRawBufferPointer?
        var forwardedFor: [UnsafeRawBufferPointer] = []
        var hasForwardedProto = false
        var hasForwardedHost = false
        var traceparents = 0
        var incoming: UnsafeRawBufferPointer?
        var tracestate: [UnsafeRawBufferPointer] = []
        // A gRPC-Web call goes upstream as gRPC: its content type is
        // gRPC's, and it says it takes trailers (the proxy reads them).
        let web = request.grpcWeb != nil
        var acceptsTrailers = web
        // Fields a `Connection` header names are hop-by-hop for this request
        // (one pass over the head, however many tokens it lists).
        let nominated = request.connectionNominatesFields ? request.nominatedFields() : []
        var index = -1
        // The raw bytes stay valid until the request is answered, which is
        // after this returns.
        request.forEachRawHeader { name, value in
            index += 1
            if !nominated.isEmpty, nominated[index] { return }
            if HopByHop.isHopByHop(name) {
                // `TE: trailers`: the client takes trailers, which the proxy
                // relays; an HTTP/2 upstream is told so in a `TE` of the proxy's own.
                if passesTrailers, name.count == 2, !acceptsTrailers { acceptsTrailers = Self.namesTrailers(value) }
                return
            }
            switch name.count {
            case 4 where HTTPBytes.equals(name, "host"):
                host = value
                return
            case 6 where HTTPBytes.equals(name, "expect"):
                return  // the edge already answered 100-continue
            case 10 where HTTPBytes.equals(name, "tracestate"):
                tracestate.append(value)  // passed on below only with a valid traceparent
                return
            case 11 where HTTPBytes.equals(name, "traceparent"):
                traceparents += 1
                incoming = value  // checked below; the proxy's own span may take its place
                return
            case 12 where web && HTTPBytes.equals(name, "content-type"):
                headers.append(name: "content-type" as StaticString, value: GRPCWeb.upstreamContentType(value))
                return
            case 12 where HTTPBytes.equals(name, "x-request-id"):
                if requestID == nil { requestID = validRequestID(value) }
                return  // added back below, exactly once
            case 14 where HTTPBytes.equals(name, "content-length"):
                return  // libcurl sends the length of the body it sends
            case 15 where HTTPBytes.equals(name, "x-forwarded-for"):
                // Several lines form one list (RFC 9110 section 5.3).
                forwardedFor.append(value)
                return
            case 16 where HTTPBytes.equals(name, "x-forwarded-host"):
                hasForwardedHost = true
            case 17 where HTTPBytes.equals(name, "x-forwarded-proto"):
                hasForwardedProto = true
            default: break
            }
            headers.append(name: name, value: value)
        }
        if acceptsTrailers { headers.append(name: "TE", value: "trailers" as StaticString) }
        let id = requestID ?? ids.requestID()
        headers.append(name: "X-Request-Id", value: id)
        var peer = request.peerAddress
        peer.withUTF8 { peerBytes in
            let length = forwardedFor.reduce(peerBytes.count) { $0 + $1.count + 2 }
            headers.append(name: "X-Forwarded-For", valueLength: length) { out in
                var i = 0
                for part in forwardedFor {
                    for b in part {
                        out[i] = b
                        i += 1
                    }
                    out[i] = UInt8(ascii: ",")
                    out[i + 1] = UInt8(ascii: " ")
                    i += 2
                }
                for b in peerBytes {
                    out[i] = b
                    i += 1
                }
            }
        }
        if !hasForwardedProto {
            headers.append(name: "X-Forwarded-Proto", value: request.arrivedOverTLS ? "https" : "http" as StaticString)
        }
        if !hasForwardedHost, let host { headers.append(name: "X-Forwarded-Host", value: host) }
        // W3C Trace Context: one valid `traceparent` is the request's context.
        // An invalid one (malformed, upper-case, all-zero, version ff, a
        // field too many) or two of them are not passed on, nor is their
        // `tracestate`: the request starts a trace of its own, traced or not.
        let context = traceparents == 1 ? incoming.flatMap(TraceContext.parse) : nil
        if let tracer { trace = tracer.begin(incoming: context, ids: &ids, at: now) }
        if let trace {
            headers.append(name: "traceparent", value: trace.context.traceparent(span: trace.context.spanID))
        } else if context != nil, let incoming {
            headers.append(name: "traceparent", value: incoming)  // valid, not traced here: passed on as it came
        } else {
            headers.append(name: "traceparent", valueLength: IdentifierGenerator.traceparentLength) {
                ids.writeTraceparent(into: $0)
            }
        }
        if context != nil {
            for value in tracestate { headers.append(name: "tracestate", value: value) }
        }

        return Command(
            requestID: id, method: method, target: target, headers: headers, body: body ?? request.takeBody(),
            routeIndex: route.index, upstream: upstream, deadline: deadline)
    }

    /// Whether a `TE` value lists `trailers` (RFC 9110 section 10.1.4).
    static func namesTrailers(_ value: UnsafeRawBufferPointer) -> Bool {
        var named = false
        forEachListElement(value) { if HTTPBytes.equals($0, "trailers") { named = true } }
        return named
    }

    static func validRequestID(_ value: UnsafeRawBufferPointer) -> String? {
        guard !value.isEmpty, value.count <= 128, value.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") })
        else { return nil }
        return String(decoding: value, as: UTF8.self)
    }

    /// A client's X-Request-Id is kept if it is a sane token; anything else
    /// (too long, control characters) is replaced so logs stay clean.
    static func validRequestID(_ value: String?) -> String? {
        guard let value, !value.isEmpty, value.utf8.count <= 128,
            value.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") })
        else { return nil }
        return value
    }

    enum Routed {
        case command(Command, RuntimeRoute)
        /// It can never be sent: the delivery is dead with this problem.
        case undeliverable(Problem)
    }

    /// A stored delivery's command, routed again under `runtime` (the
    /// configuration may have changed since it was stored).
    static func command(
        for delivery: ClaimedDelivery, runtime: RuntimeConfiguration, now: Instant, tracer: Tracer? = nil,
        ids: inout IdentifierGenerator, trace: inout RequestTrace?
    ) -> Routed {
        let (path, query) = Router.split(target: delivery.target)
        guard let routeIndex = runtime.router.route(path: path, method: delivery.method) else {
            return .undeliverable(
                Problem(
                    .noRoute, requestID: delivery.requestID,
                    detail: "No route matches \(delivery.method) \(path) any more; the delivery cannot be sent."))
        }
        let route = runtime.routes[routeIndex]
        // Stored targets were normalized at the edge; the check stays for
        // rows stored before paths were normalized.
        let normalized = PathNormalizer.normalize(path, runtime.configuration.pathNormalization)
        guard case let .success(normalPath) = normalized, normalPath == path,
            let target = Router.upstreamTarget(path: path, query: query, stripPrefix: route.stripPrefix)
        else {
            return .undeliverable(
                Problem(
                    .badRequest, requestID: delivery.requestID,
                    detail: "The stored path \(path) is not a normalized path (dot-segments); the delivery cannot be sent."))
        }
        var lines = delivery.headers
        if let tracer {
            // A traced round: a trace of its own, linked to the accepted request's.
            let (kept, stored) = Self.withoutTraceparent(lines)
            trace = tracer.beginRound(accepted: stored.flatMap(TraceContext.parse), ids: &ids, at: now)
            if let trace {
                lines = kept + Array("traceparent: \(trace.context.traceparent(span: trace.context.spanID))\r\n".utf8)
            }
        }
        let command = Command(
            requestID: delivery.requestID, method: delivery.method, target: target,
            headers: HeaderBlock(lines: lines), body: delivery.body, routeIndex: route.index,
            upstream: runtime.upstreams[route.upstreamIndex].name, deadline: now + route.timeout)
        return .command(command, route)
    }

    /// Stored `name: value\r\n` lines without their `traceparent`, and its value.
    static func withoutTraceparent(_ lines: [UInt8]) -> (kept: [UInt8], traceparent: String?) {
        var kept: [UInt8] = []
        kept.reserveCapacity(lines.count)
        var found: String?
        var start = 0
        var i = 0
        while i < lines.count {
            if lines[i] == 0x0A {
                let line = lines[start...i]
                let name = "traceparent:".utf8
                if line.count > name.count, zip(line, name).allSatisfy({ $0 | 0x20 == $1 | 0x20 }) {
                    let value = line.dropFirst(name.count).drop { $0 == 0x20 || $0 == 0x09 }
                    found = String(decoding: value.prefix { $0 != 0x0D && $0 != 0x0A }, as: UTF8.self)
                } else {
                    kept += line
                }
                start = i + 1
            }
            i += 1
        }
        if start < lines.count { kept += lines[start...] }
        return (kept, found)
    }
}
