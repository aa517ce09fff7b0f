import CNghttp2
import HappyPathCore
import Testing

@testable import HappyPathIO

/// The proxy's HTTP/2 client session (`HTTP2ClientSession`, with its
/// streams `HTTP2UpstreamStream`) against the edge's own server session in
/// memory: no sockets, every byte passed by hand.
@Suite struct HTTP2ClientSessionTests {
    /// What a try's handler heard.
    final class Recorder: UpstreamResponseHandler {
        var status = 0
        var fields: [String] = []
        var informational: [String] = []
        var body: [UInt8] = []
        var trailers: [String] = []
        var finished: [UpstreamFailure?] = []
        var takes = true
        var refusal: String?

        func upstreamStatus(_ status: Int, reason: UnsafeRawBufferPointer) { self.status = status }
        func upstreamHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
            fields.append(String(decoding: name, as: UTF8.self) + "=" + String(decoding: value, as: UTF8.self))
        }
        func upstreamInformational(_ status: Int, fields: UnsafeRawBufferPointer) {
            informational.append("\(status) " + String(decoding: fields, as: UTF8.self))
        }
        func upstreamHeadersComplete() -> String? { refusal }
        func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool {
            guard takes else { return false }
            body.append(contentsOf: bytes)
            return true
        }
        func upstreamTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
            trailers.append(String(decoding: name, as: UTF8.self) + "=" + String(decoding: value, as: UTF8.self))
        }
        func upstreamFinished(_ failure: UpstreamFailure?) { finished.append(failure) }
    }

    /// A client session and a server session joined in memory; the
    /// session carries its streams as a connection would (`HTTP2SessionCarrier`,
    /// which holds it unowned: no cycle through the streams).
    final class Pair {
        lazy var carrier = HTTP2SessionCarrier(session)

        let loop = EventLoop()
        let client: HTTP2UpstreamClient
        let session: HTTP2ClientSession
        let server: HTTP2Session
        var fields = HTTP2RequestFields()
        var serverEvents: [HTTP2SessionEvent] = []

        init(limits: HTTP2ClientLimits = HTTP2ClientLimits(), serverWindow: Int32 = 64 * 1024) throws {
            client = HTTP2UpstreamClient(loop: loop, clock: { Instant(nanoseconds: 0) })
            session = try HTTP2ClientSession(limits: limits)
            server = try HTTP2Session(
                settings: HTTP2SessionSettings(
                    initialStreamWindow: serverWindow,
                    request: RequestLimits(maxHeadBytes: 65536, maxFields: 100, maxBodyBytes: 10_000_000)))
        }

        deinit { client.shutdown() }

        func start(
            _ method: String = "GET", _ target: String = "/a", headers: [(String, String)] = [],
            body: [UInt8]? = nil, handler: Recorder
        ) -> HTTP2UpstreamStream {
            let block = HeaderBlock(capacity: 256)
            for (n, v) in headers { block.append(name: n, value: v) }
            var requestBody = RequestBody.empty
            if let body {
                requestBody = RequestBody(count: body.count)
                body.withUnsafeBytes { requestBody.baseAddress?.copyMemory(from: $0.baseAddress!, byteCount: body.count) }
            }
            let request = UpstreamRequest(
                origin: "http://10.0.0.1:8080/", target: target, method: method, headers: block, body: requestBody,
                sendsBody: body != nil, connectTimeout: .seconds(1), idleTimeout: .seconds(5),
                httpVersion: .h2PriorKnowledge)
            let stream = HTTP2UpstreamStream(request: request, handler: handler, client: client, tryID: 1)
            stream.machine.assigned()
            stream.connection = carrier
            #expect(session.submit(stream, scheme: "http", authority: "10.0.0.1:8080", scratch: &fields) == nil)
            return stream
        }

        /// Moves bytes both ways until neither side has any; tells ended tries.
        func pump() {
            for _ in 0..<50 {
                let toServer = session.produceAll()
                let r = server.receive(toServer)
                serverEvents += r.events
                let toClient = server.produceAll()
                serverEvents += server.takeEvents().events
                _ = session.receive(toClient)
                for stream in session.takeEnded() { stream.tell() }
                if toServer.isEmpty && toClient.isEmpty { break }
            }
        }

        var readyStreams: [Int32] {
            serverEvents.compactMap { if case let .headComplete(id) = $0 { id } else { nil } }
        }
    }

    @Test func aGetCarriesItsFieldsAndTheAnswerReachesTheHandler() throws {
        let pair = try Pair()
        let r = Recorder()
        let stream = pair.start(
            headers: [
                ("X-Tenant", "blue"), ("Host", "wrong"), ("Connection", "close"), ("TE", "trailers"), ("TE", "gzip"),
                ("Content-Length", "99"),
            ], handler: r)
        pair.pump()
        let id = try #require(pair.readyStreams.first)
        #expect(id == stream.id)
        let head = try #require(pair.server.head(of: id))
        #expect(head.method == "GET")
        #expect(head.target == "/a")
        // Names lower-cased; host, connection-specific fields and the command's
        // content-length left out; TE only as trailers; :authority the origin's.
        #expect(
            head.httpFields.map { "\($0.name)=\($0.value)" } == ["host=10.0.0.1:8080", "x-tenant=blue", "te=trailers"])
        #expect(pair.server.submitResponse(id, status: 200, fields: [HTTPField(name: "X-A", value: "1")], hasBody: true) == nil)
        pair.server.sendData(id, Array("hello".utf8), end: true, trailers: [HTTPField(name: "grpc-status", value: "0")])
        pair.pump()
        #expect(r.status == 200)
        #expect(r.fields == ["x-a=1"])
        #expect(r.body == Array("hello".utf8))
        #expect(r.trailers == ["grpc-status=0"])
        #expect(r.finished.count == 1)
        #expect(r.finished.first! == nil)
        #expect(pair.session.streams.isEmpty)
    }

    @Test func aPostSendsItsWholeBodyWithItsLength() throws {
        let pair = try Pair()
        let r = Recorder()
        let body = (0..<150_000).map { UInt8(truncatingIfNeeded: $0) }
        _ = pair.start("POST", "/up", body: body, handler: r)
        var received: [UInt8] = []
        for _ in 0..<20 {
            pair.pump()
            for id in pair.readyStreams { received += pair.server.takeBody(of: id) }
        }
        let id = try #require(pair.readyStreams.first)
        #expect(pair.server.head(of: id)?.httpFields.contains(HTTPField(name: "content-length", value: "150000")) == true)
        #expect(received == body, "the body crosses 64 KiB windows as the server takes it")
        #expect(pair.server.requestEnded(id))
    }

    @Test func a1xxIsForwardedAndTheFinalHeadFollows() throws {
        let pair = try Pair()
        let r = Recorder()
        _ = pair.start(handler: r)
        pair.pump()
        let id = try #require(pair.readyStreams.first)
        var hints = HTTP2FieldBlock()
        hints.append("link", "</s.css>; rel=preload")
        #expect(pair.server.submitInformational(id, status: 103, fields: hints) == nil)
        #expect(pair.server.submitResponse(id, status: 204, fields: [], hasBody: false) == nil)
        pair.pump()
        #expect(r.informational == ["103 link: </s.css>; rel=preload\r\n"])
        #expect(r.status == 204)
        #expect(r.finished.count == 1 && r.finished[0] == nil)
    }

    /// A handler that stops taking bytes gets the rest held, at most the
    /// stream's window: the server can send no more until they are taken.
    @Test func aStalledHandlerHoldsOneWindowAndTheRestWaitsAtTheServer() throws {
        let pair = try Pair()
        let r = Recorder()
        r.takes = false
        let stream = pair.start(handler: r)
        pair.pump()
        let id = try #require(pair.readyStreams.first)
        let total = 300_000
        #expect(pair.server.submitResponse(id, status: 200, fields: [], hasBody: true) == nil)
        pair.server.sendData(id, [UInt8](repeating: 0x78, count: total), end: true)
        pair.pump()
        #expect(stream.held.count == 65_536, "one stream window held, no more")
        #expect(pair.server.pendingOutput(for: id) == total - 65_536)
        #expect(r.finished.isEmpty)
        // Taken again: the window opens, the rest comes, the end is told once.
        r.takes = true
        stream.resume()
        for _ in 0..<20 {
            stream.runSoon()
            pair.pump()
        }
        #expect(r.body.count == total)
        #expect(r.finished.count == 1 && r.finished[0] == nil)
    }

    @Test func aHeadPastTheLimitIsABadResponse() throws {
        let pair = try Pair(limits: HTTP2ClientLimits(maxHeadBytes: 1000, maxHeadFields: 100))
        let r = Recorder()
        _ = pair.start(handler: r)
        pair.pump()
        let id = try #require(pair.readyStreams.first)
        let big = (0..<30).map { HTTPField(name: "x-f\($0)", value: String(repeating: "v", count: 40)) }
        #expect(pair.server.submitResponse(id, status: 200, fields: big, hasBody: false) == nil)
        pair.pump()
        #expect(r.finished.count == 1)
        guard case .badResponse(let why)? = r.finished.first ?? nil else {
            Issue.record("expected a bad response, got \(r.finished)")
            return
        }
        #expect(why.contains("limits.max_header_bytes"))
    }

    @Test func aHeadTheHandlerRefusesEndsTheTryAndResetsTheStream() throws {
        let pair = try Pair()
        let r = Recorder()
        r.refusal = "no thanks"
        _ = pair.start(handler: r)
        pair.pump()
        let id = try #require(pair.readyStreams.first)
        #expect(pair.server.submitResponse(id, status: 200, fields: [], hasBody: true) == nil)
        pair.server.sendData(id, Array("late".utf8), end: false)
        pair.pump()
        #expect(r.finished == [.badResponse("no thanks")])
        #expect(r.body.isEmpty)
        #expect(pair.serverEvents.contains(.resetByPeer(id, code: HTTP2ErrorCode.cancel.rawValue)))
    }

    @Test(arguments: [HTTP2ErrorCode.internalError, .cancel, .protocolError])
    func aResetFromTheServerIsAStreamReset(code: HTTP2ErrorCode) throws {
        let pair = try Pair()
        let r = Recorder()
        _ = pair.start(handler: r)
        pair.pump()
        let id = try #require(pair.readyStreams.first)
        pair.server.resetStream(id, code: code.rawValue)
        pair.pump()
        #expect(r.finished.count == 1)
        guard case .streamReset? = r.finished.first ?? nil else {
            Issue.record("unexpected \(r.finished)")
            return
        }
    }

    /// REFUSED_STREAM: never processed, so the try goes back for another
    /// stream (twice), its state as new; the third refusal fails it as never sent.
    @Test func aRefusedStreamIsSentAgainTwiceThenFailsAsNeverSent() throws {
        let pair = try Pair()
        let r = Recorder()
        let stream = pair.start("POST", "/refused", body: Array("payload".utf8), handler: r)
        var ids: [Int32] = []
        for round in 0..<3 {
            pair.pump()
            let id = try #require(pair.readyStreams.last)
            ids.append(id)
            #expect(pair.server.takeBody(of: id) == Array("payload".utf8), "round \(round): the whole body each time")
            pair.server.resetStream(id, code: HTTP2ErrorCode.refusedStream.rawValue)
            pair.pump()
            let replays = pair.session.takeReplays()
            if round < 2 {
                #expect(replays.count == 1 && replays.first === stream, "round \(round)")
                #expect(r.finished.isEmpty)
                #expect(stream.id == -1 && stream.machine.state == .waiting)
                stream.machine.assigned()
                stream.connection = pair.carrier
                #expect(pair.session.submit(stream, scheme: "http", authority: "a", scratch: &pair.fields) == nil)
            } else {
                #expect(replays.isEmpty)
                #expect(r.finished.count == 1)
                guard case .connectFailed(let why)? = r.finished.first ?? nil else {
                    Issue.record("unexpected \(r.finished)")
                    return
                }
                #expect(why.contains("REFUSED_STREAM"))
            }
        }
        #expect(Set(ids).count == 3)
    }

    @Test func aCancelResetsTheStreamAndTellsNothing() throws {
        let pair = try Pair()
        let r = Recorder()
        let stream = pair.start(handler: r)
        pair.pump()
        let id = try #require(pair.readyStreams.first)
        stream.cancel()
        pair.pump()
        #expect(pair.serverEvents.contains(.resetByPeer(id, code: HTTP2ErrorCode.cancel.rawValue)))
        #expect(r.finished.isEmpty)
        #expect(pair.session.streams.isEmpty)
    }

    /// A session let go with a stream still open is freed, its stream too:
    /// a stream holds its carrier, which holds the session unowned (the
    /// AddressSanitizer run found the cycle when the carrier held it).
    @Test func aSessionWithAnOpenStreamIsFreedWithItsOwner() throws {
        weak var session: HTTP2ClientSession?
        weak var stream: HTTP2UpstreamStream?
        do {
            let pair = try Pair()
            let s = pair.start("POST", "/open", body: [1, 2, 3], handler: Recorder())
            pair.pump()
            #expect(pair.session.streams.count == 1, "the stream is still open")
            session = pair.session
            stream = s
        }
        #expect(session == nil)
        #expect(stream == nil)
    }

    @Test func theClientsSettingsBoundWhatTheServerMaySend() throws {
        let pair = try Pair(limits: HTTP2ClientLimits(maxHeadBytes: 32 * 1024))
        let r = Recorder()
        _ = pair.start(handler: r)
        pair.pump()
        // The server applies our SETTINGS: no push, a 64 KiB stream window, the head bound.
        #expect(pair.server.submitResponse(try #require(pair.readyStreams.first), status: 204, fields: [], hasBody: false) == nil)
        pair.pump()
        #expect(pair.session.remoteMaxStreams == 100)
        #expect(r.finished.count == 1)
    }
}
