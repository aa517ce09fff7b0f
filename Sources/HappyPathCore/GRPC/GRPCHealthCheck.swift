/// gRPC's health service (`grpc/health/v1/health.proto`), as the proxy's
/// active health check asks it (`health_check.grpc`, and by default for an
/// upstream serving gRPC routes): a unary `grpc.health.v1.Health/Check`
/// call. A server that answers at all is reachable: `SERVING` is up, and
/// so is any other answer (a server without the health service answers
/// `UNIMPLEMENTED`) but `NOT_SERVING`, `UNAVAILABLE` (gRPC's 503) and an
/// HTTP status of 500 or more, which are down. Everything read from the
/// upstream is bounded; every verdict but `serving` carries its reason.
public enum GRPCHealthCheck {
    /// The method's request target.
    public static let path = "/grpc.health.v1.Health/Check"

    /// The largest `HealthCheckResponse` read (its one field takes two bytes).
    public static let maxMessageBytes = 1024

    /// The request body: one message holding
    /// `HealthCheckRequest { string service = 1; }` (left out when empty, as proto3 writes it).
    public static func request(service: String) -> [UInt8] {
        var message = ProtoWriter()
        if !service.isEmpty { message.string(1, service) }
        return GRPCFrame.encode(message.bytes)
    }

    /// `HealthCheckResponse.ServingStatus`.
    public static func statusName(_ value: UInt64) -> String {
        switch value {
        case 0: "UNKNOWN"
        case 1: "SERVING"
        case 2: "NOT_SERVING"
        case 3: "SERVICE_UNKNOWN"
        default: "\(value)"
        }
    }

    public enum Verdict: Equatable, Sendable {
        case serving
        /// It answered, not `SERVING` (why, for the log): it is alive, and
        /// counts as a passed check.
        case alive(String)
        /// Why the endpoint is down, for the log.
        case down(String)

        /// The check passed: the endpoint is reachable.
        public var isUp: Bool {
            if case .down = self { return false }
            return true
        }
    }

    /// One answer as it arrives: the status, `grpc-status` from the head
    /// (a Trailers-Only answer) or the trailers, and at most one message's
    /// bytes of body.
    public struct Answer: Sendable {
        public private(set) var status = 0
        private var headGRPCStatus: [UInt8]?
        private var trailerGRPCStatus: [UInt8]?
        private var body: [UInt8] = []
        private var bodyOverflowed = false

        /// The longest `grpc-status` value kept (a code is one or two digits).
        static let maxStatusBytes = 8

        public init() {}

        public mutating func received(status: Int) { self.status = status }

        public mutating func received(header name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
            if HTTPBytes.equals(name, "grpc-status") { headGRPCStatus = Self.kept(value) }
        }

        public mutating func received(trailer name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
            if HTTPBytes.equals(name, "grpc-status") { trailerGRPCStatus = Self.kept(value) }
        }

        /// Keeps the bytes while they fit one message of `maxMessageBytes`;
        /// past that only notes that the answer was too long.
        public mutating func received(body bytes: some Collection<UInt8>) {
            guard !bodyOverflowed else { return }
            if bytes.count > GRPCFrame.prefixLength + maxMessageBytes - body.count {
                bodyOverflowed = true
                body = []
            } else {
                body += bytes
            }
        }

        public var verdict: Verdict {
            guard status > 0 else { return .down("no answer") }
            guard status < 500 else { return .down("HTTP status \(status)") }
            guard status == 200 else { return .alive("HTTP status \(status)") }
            // The trailers' grpc-status is the call's; the head's stands only in a Trailers-Only answer.
            guard let code = trailerGRPCStatus ?? headGRPCStatus else { return .alive("no grpc-status") }
            guard code == [UInt8(ascii: "0")] else {
                let text = "grpc-status \(String(decoding: code, as: UTF8.self))"
                // UNAVAILABLE is gRPC's 503: the server says it cannot serve now.
                return code == Array("14".utf8) ? .down(text + " (UNAVAILABLE)") : .alive(text)
            }
            guard !bodyOverflowed else { return .alive("an answer longer than one \(maxMessageBytes)-byte message") }
            let message: ArraySlice<UInt8>
            switch GRPCFrame.single(body[...], limit: maxMessageBytes) {
            case let .success(m): message = m
            case .failure(.truncated): return .alive(body.isEmpty ? "no message" : "a cut message")
            case .failure(.compressed): return .alive("a compressed message")
            case let .failure(.tooLong(length)): return .alive("a message of \(length) bytes")
            case .failure(.trailingBytes): return .alive("more than one message")
            }
            var reader = ProtoReader(message)
            var serving: UInt64 = 0  // proto3: a field left out is 0, UNKNOWN
            do {
                while let (field, value) = try reader.next() {
                    guard field == 1 else { continue }  // fields a newer health.proto may add
                    guard case let .varint(v) = value else { return .alive("a malformed HealthCheckResponse") }
                    serving = v  // the last occurrence wins
                }
            } catch {
                return .alive("a malformed HealthCheckResponse")
            }
            switch serving {
            case 1: return .serving
            case 2: return .down("status NOT_SERVING")
            default: return .alive("status \(statusName(serving))")
            }
        }

        /// The value if it is short enough to be a code, else a marker that is none.
        static func kept(_ value: UnsafeRawBufferPointer) -> [UInt8] {
            value.count <= maxStatusBytes ? Array(value) : Array("(too long)".utf8)
        }
    }
}
