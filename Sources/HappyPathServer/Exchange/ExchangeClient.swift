import HappyPathCore
import HappyPathIO

/// Where an exchange's answer goes: the client's connection (`HTTPRequest`)
/// for a request answered now, or a `DeliverySink` for a stored request
/// delivered later, which nobody waits for on a connection.
protocol ExchangeClient: AnyObject {
    var observer: HTTPRequestObserver? { get set }
    func header(_ name: String) -> String?
    /// Each request field as bytes, valid only during the call.
    func forEachRawHeader(_ body: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Void)
    /// `HTTP/1.0`, `HTTP/1.1` or `HTTP/2` (the access log's `protocol`).
    var protocolName: StaticString { get }
    func clearResponseHeaders()
    func addResponseHeader(_ name: String, _ value: String)
    func addResponseHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer)
    func removeResponseHeaders(nominatedBy connectionValue: UnsafeRawBufferPointer)
    /// A trailer field, sent after the body if the client can take it.
    func addResponseTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer)
    func startReply(status: Int, contentLength: Int?, reason: [UInt8]?)
    /// An informational (1xx) answer before the final one.
    func sendInformational(status: Int, fields: UnsafeRawBufferPointer)
    func send(_ bytes: UnsafeRawBufferPointer, notifyWhenDrained: Bool)
    /// Bytes written but not yet taken by the client (back-pressure).
    var pendingOutput: Int { get }
    /// Bytes the client's connection may still queue, all its streams
    /// together (back-pressure: 0 or less, the answer waits).
    var outputRoom: Int { get }
    /// The answer started may be read ahead of the client (`limits.read_ahead`).
    func permitReadAhead()
    func endReply()
    func abort()
    func reply(status: Int, headers: [HTTPField], body: String?)
    /// A gRPC call whose head the edge refused: its fields are not kept,
    /// its content type was gRPC's.
    var isRefusedGRPCCall: Bool { get }
    /// A gRPC-Web call (docs/grpc.md): its mode; nil for any other request.
    var grpcWeb: GRPCWeb.Mode? { get }
}

extension HTTPRequest: ExchangeClient {}

extension ExchangeClient {
    /// A gRPC call: a request over HTTP/2 whose `content-type` is gRPC's
    /// (`application/grpc`, `application/grpc+…`). gRPC runs over HTTP/2
    /// only, so a request over HTTP/1.x is never one and pays only the
    /// protocol's name; an HTTP/2 request pays one look at its fields.
    var isGRPCCall: Bool { isRefusedGRPCCall || grpcWeb != nil || grpcCall(protocolName: protocolName) != nil }

    /// The same, with what the exchange needs of the call's head, for a
    /// caller that has read the protocol's name already. Nil: not a call.
    func grpcCall(protocolName: StaticString) -> GRPCCallHead? {
        // Only "HTTP/2" is 6 bytes long ("HTTP/1.1", "HTTP/1.0", "-"). A
        // gRPC-Web call is one over any protocol: the worker said so.
        let web = grpcWeb != nil
        guard protocolName.utf8CodeUnitCount == 6 || web else { return nil }
        var grpc = false
        var seenType = false
        var timeout: Duration?
        var seenTimeout = false
        forEachRawHeader { name, value in
            // Both names are 12 bytes; HTTP/2 fields arrive lower-case. The first of each decides.
            guard name.count == 12 else { return }
            if !seenType, HTTPBytes.equals(name, "content-type") {
                seenType = true
                grpc = web || GRPCCall.isContentType(value)
            } else if !seenTimeout, HTTPBytes.equals(name, "grpc-timeout") {
                seenTimeout = true
                // Malformed (a sign, a ninth digit, another unit): no deadline of the client's.
                // Longer than any valid value: not copied into a string at all.
                if value.count <= GRPCTimeout.maxFieldBytes {
                    timeout = GRPCTimeout.parse(String(decoding: value, as: UTF8.self))
                }
            }
        }
        return grpc || web ? GRPCCallHead(timeout: timeout) : nil
    }
}

/// What the exchange reads of a gRPC call's head.
struct GRPCCallHead {
    /// The client's `grpc-timeout`, when it sent a valid one.
    var timeout: Duration?
}

/// The answer of a delivery round goes nowhere: the exchange's own record
/// (its final status and problem) is what the store keeps. Never pushes back.
final class DeliverySink: ExchangeClient {
    /// Never kept: nothing here is ever reported (no client to lose, no
    /// output to drain), and keeping the exchange would make a cycle with it.
    var observer: HTTPRequestObserver? {
        get { nil }
        set {}
    }
    /// No client headers: the problem's content type is nobody's concern here.
    func header(_ name: String) -> String? { nil }
    func forEachRawHeader(_ body: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Void) {}
    /// No client connection: the round is the proxy's own.
    var protocolName: StaticString { "-" }
    func clearResponseHeaders() {}
    func addResponseHeader(_ name: String, _ value: String) {}
    func addResponseHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {}
    func removeResponseHeaders(nominatedBy connectionValue: UnsafeRawBufferPointer) {}
    func addResponseTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {}
    func startReply(status: Int, contentLength: Int?, reason: [UInt8]?) {}
    func sendInformational(status: Int, fields: UnsafeRawBufferPointer) {}
    func send(_ bytes: UnsafeRawBufferPointer, notifyWhenDrained: Bool) {}
    var pendingOutput: Int { 0 }
    var outputRoom: Int { Int.max }
    func permitReadAhead() {}
    func endReply() {}
    func abort() {}
    func reply(status: Int, headers: [HTTPField], body: String?) {}
    var isRefusedGRPCCall: Bool { false }
    var grpcWeb: GRPCWeb.Mode? { nil }
}
