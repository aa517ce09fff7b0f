import HappyPathCore
import HappyPathIO

/// Where an exchange's answer goes: the client's connection (`HTTPRequest`)
/// for a request answered now, or a `DeliverySink` for a stored request
/// delivered later, which nobody waits for on a connection.
protocol ExchangeClient: AnyObject {
    var observer: HTTPRequestObserver? { get set }
    func header(_ name: String) -> String?
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
    func endReply()
    func abort()
    func reply(status: Int, headers: [HTTPField], body: String?)
}

extension HTTPRequest: ExchangeClient {}

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
    func endReply() {}
    func abort() {}
    func reply(status: Int, headers: [HTTPField], body: String?) {}
}
