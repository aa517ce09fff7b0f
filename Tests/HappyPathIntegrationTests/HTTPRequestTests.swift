import HappyPathCore
import HappyPathIO
import Testing

/// `HTTPRequest` knows its transport only as a `ClientStream`: these run it
/// against a stream that records what it is asked, as an HTTP/2 stream
/// would be asked, with no HTTP/1.1 connection anywhere.
@Suite struct HTTPRequestTests {
    @Test func readsItsHeadThroughTheStreamAndKeepsMethodAndTarget() {
        let (stream, request) = RecordingStream.carrying()
        #expect(request.method == "POST")
        #expect(request.target == "/orders?id=7")
        #expect(request.method == "POST")
        #expect(stream.calls.filter { $0 == "method" }.count == 1, "the method is read once, then kept")
        #expect(request.header("x-tenant") == "blue")
        #expect(request.header("X-Tenant") == "blue")
        #expect(request.header("missing") == nil)
        #expect(request.headBytes == 120)
        #expect(request.arrivedOverTLS)
        #expect(!request.isAsteriskForm)
        #expect(!request.isHTTP11, "only an HTTP/1.1 connection can carry an upgrade")
        #expect(request.takeOverConnection() == nil)
    }

    @Test func streamsAnAnswerThenWritesNothingMore() {
        let (stream, request) = RecordingStream.carrying()
        request.addResponseHeader("Content-Type", "text/plain")
        request.startReply(status: 200, contentLength: 5)
        request.send(UnsafeRawBufferPointer(start: nil, count: 0))
        request.endReply()
        request.send(UnsafeRawBufferPointer(start: nil, count: 0))
        request.endReply()
        request.abort()
        #expect(stream.calls == ["stage Content-Type", "head 200 5", "body 0", "end"])
    }

    @Test func trailersGoToTheStreamBeforeTheEndAndNeverAfter() {
        let (stream, request) = RecordingStream.carrying()
        request.startReply(status: 200, contentLength: nil)
        let name = Array("Grpc-Status".utf8)
        let value = Array("0".utf8)
        name.withUnsafeBytes { n in value.withUnsafeBytes { v in request.addResponseTrailer(name: n, value: v) } }
        request.endReply()
        name.withUnsafeBytes { n in value.withUnsafeBytes { v in request.addResponseTrailer(name: n, value: v) } }
        #expect(stream.calls == ["head 200 -", "trailer Grpc-Status", "end"])
    }

    @Test func aWholeReplyIsOneWriteThenTheRequestIsReleased() {
        let (stream, request) = RecordingStream.carrying()
        let observer = Observer()
        request.observer = observer
        request.reply(status: 404, headers: [HTTPField(name: "Cache-Control", value: "no-store")], body: "gone")
        #expect(stream.calls == ["stage Cache-Control", "whole 404 4"])
        #expect(request.observer == nil, "answered: the handler is let go")
        request.reply(status: 500)
        #expect(stream.calls.count == 2)
    }

    @Test func aRequestTheStreamNoLongerCarriesReadsAsEmptyAndStaysOpen() {
        let stream = RecordingStream()
        let request = HTTPRequest(stream: stream)
        stream.carried = nil
        #expect(request.method == "GET")
        #expect(request.target == "/")
        #expect(request.headBytes == 0)
        #expect(request.takeBody().count == 0)
        let observer = Observer()
        request.observer = observer
        request.endReply()
        #expect(request.observer != nil, "not ended: the stream did not carry it")
        request.abort()
        #expect(request.observer == nil)
        #expect(stream.calls.last == "cancel")
    }

    @Test func tellsItsObserverOnceThatTheClientLeft() {
        let stream = RecordingStream()
        let request = HTTPRequest(stream: stream)
        let observer = Observer()
        request.observer = observer
        request.streamCancelled()
        request.streamCancelled()
        request.streamDrained()
        #expect(observer.events == ["closed", "drained"])
    }
}

private final class Observer: HTTPRequestObserver {
    var events: [String] = []
    func requestClientClosed(_ request: HTTPRequest) { events.append("closed") }
    func requestOutputDrained(_ request: HTTPRequest) { events.append("drained") }
}

/// A stream that carries `carried` and records every call made for it
/// (HTTP2RefusalsAndMetricsTests answers requests through it too).
final class RecordingStream: ClientStream {
    weak var carried: HTTPRequest?
    var calls: [String] = []
    /// What `protocolName` says.
    var protocolName: StaticString = "HTTP/1.1"
    /// The fields staged for the answer, and the body of a whole reply.
    var staged: [(name: String, value: String)] = []
    var wholeBody = ""
    var fields: [(String, String)] = [("Host", "example.test"), ("X-Tenant", "blue")]

    /// A stream and the request it carries.
    static func carrying() -> (RecordingStream, HTTPRequest) {
        let stream = RecordingStream()
        let request = HTTPRequest(stream: stream)
        stream.carried = request
        return (stream, request)
    }

    private func carries(_ request: HTTPRequest) -> Bool { carried === request }

    func protocolName(of request: HTTPRequest) -> StaticString { protocolName }

    func method(of request: HTTPRequest) -> String? {
        calls.append("method")
        return carries(request) ? "POST" : nil
    }
    func target(of request: HTTPRequest) -> String? { carries(request) ? "/orders?id=7" : nil }
    func head(of request: HTTPRequest) -> ClientRequestHead? {
        guard carries(request) else { return nil }
        return ClientRequestHead(isAsteriskForm: false, size: 120, connectionNominatesFields: false, isSecure: true)
    }
    func forEachField(
        of request: HTTPRequest, _ body: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Void
    ) {
        guard carries(request) else { return }
        for (name, value) in fields {
            var name = name
            var value = value
            name.withUTF8 { n in value.withUTF8 { v in body(UnsafeRawBufferPointer(n), UnsafeRawBufferPointer(v)) } }
        }
    }
    func nominatedFields(of request: HTTPRequest) -> [Bool] { carries(request) ? [false, false] : [] }
    func takeBody(of request: HTTPRequest) -> RequestBody { .empty }
    func resumeReading(for request: HTTPRequest) { calls.append("resume") }
    var peerAddress: String { "192.0.2.1" }
    var localAddress: String { "192.0.2.2" }

    func stageField(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, for request: HTTPRequest) {
        guard carries(request) else { return }
        calls.append("stage " + String(decoding: name, as: UTF8.self))
        staged.append((String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self)))
    }
    func stageTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, for request: HTTPRequest) {
        if carries(request) { calls.append("trailer " + String(decoding: name, as: UTF8.self)) }
    }
    func clearStagedFields(for request: HTTPRequest) { if carries(request) { calls.append("clear") } }
    func removeStagedFields(nominatedBy connectionValue: UnsafeRawBufferPointer, for request: HTTPRequest) {}
    func writeInformational(status: Int, fields: UnsafeRawBufferPointer, for request: HTTPRequest) {
        if carries(request) { calls.append("informational \(status)") }
    }
    func writeHead(status: Int, contentLength: Int?, reason: [UInt8]?, for request: HTTPRequest) {
        if carries(request) { calls.append("head \(status) \(contentLength.map(String.init) ?? "-")") }
    }
    func writeBodyPart(_ bytes: UnsafeRawBufferPointer, notifyWhenDrained: Bool, for request: HTTPRequest) {
        if carries(request) { calls.append("body \(bytes.count)") }
    }
    func writeWhole(status: Int, body: UnsafeRawBufferPointer, for request: HTTPRequest) -> Bool {
        guard carries(request) else { return false }
        calls.append("whole \(status) \(body.count)")
        wholeBody = String(decoding: body, as: UTF8.self)
        carried = nil
        return true
    }
    func end(_ request: HTTPRequest) -> Bool {
        guard carries(request) else { return false }
        calls.append("end")
        carried = nil
        return true
    }
    func cancel(_ request: HTTPRequest) { calls.append("cancel") }
    func pendingOutput(for request: HTTPRequest) -> Int { 0 }
    func outputRoom(for request: HTTPRequest) -> Int { 256 * 1024 }
}
