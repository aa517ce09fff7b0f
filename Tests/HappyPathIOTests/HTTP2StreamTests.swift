import Foundation
import CNghttp2
import HappyPathCore
import Testing

@testable import HappyPathIO

/// An `HTTPRequest` answered through an `HTTP2Stream` on an `HTTP2Session`,
/// against the in-memory nghttp2 client (no sockets): the driver's part is
/// played by `Rig`, which routes the session's events to the streams and
/// tells them when output was produced.
@Suite struct HTTP2StreamTests {
    static let limits = RequestLimits(maxHeadBytes: 8192, maxFields: 20, maxBodyBytes: 1_000_000)

    static func field(_ name: String, _ value: String) -> HTTPField { HTTPField(name: name, value: value) }

    /// What the request tells its observer.
    final class Observer: HTTPRequestObserver {
        var cancelled = 0
        var drained = 0
        func requestClientClosed(_ request: HTTPRequest) { cancelled += 1 }
        func requestOutputDrained(_ request: HTTPRequest) { drained += 1 }
    }

    /// The driver's part: a session, the client, and a stream per id.
    final class Rig: HTTP2StreamOwner {
        let server: HTTP2Session
        let client: HTTP2TestClient
        var streams: [Int32: HTTP2Stream] = [:]
        var events: [HTTP2SessionEvent] = []
        var outputAsked = 0
        var clock = Instant(nanoseconds: 0)
        /// What the rig, as every stream's owner, gives for `http2BodyMapping` (the connection: a spool file).
        var bodySpool: SpoolMapping.Maker?

        func http2BodyMapping(capacity: Int) -> SpoolMapping? { bodySpool?(capacity) }
        /// The same for `http2AnswerSpool` (the connection: a spool for an answer read ahead).
        var answerSpool: (() -> AnswerSpool?)?
        /// Given to every stream as it opens (`HTTP2Stream.bodyInMemory`).
        var bodyInMemory = Int.max
        func http2AnswerSpool(_ stream: HTTP2Stream) -> AnswerSpool? { answerSpool?() }

        init() throws {
            server = try HTTP2Session(settings: HTTP2SessionSettings(request: HTTP2StreamTests.limits))
            client = try HTTP2TestClient()
        }

        /// As the connection does at its close: every stream lets its request go.
        deinit { for stream in streams.values { stream.connectionClosed() } }

        func http2StreamHasOutput(_ stream: HTTP2Stream) { outputAsked += 1 }

        func route(_ result: HTTP2ReceiveResult) {
            for event in result.events {
                events.append(event)
                if case let .opened(id) = event {
                    let stream = HTTP2Stream(
                        session: server, id: id, peerAddress: "192.0.2.1:5000", localAddress: "192.0.2.2:80",
                        isSecure: false, idle: .seconds(30), now: { [unowned self] in clock })
                    stream.owner = self
                    stream.bodyInMemory = bodyInMemory
                    streams[id] = stream
                } else if let id = event.streamID {
                    streams[id]?.handle(event)
                }
            }
        }

        /// Bytes to the server (all of them), then everything it has back to the client.
        func serverReads() {
            let toServer = client.output()
            if !toServer.isEmpty { route(server.receive(toServer)) }
        }

        func serverWrites() -> [UInt8] {
            let out = server.produceAll()
            route(server.takeEvents())
            for stream in streams.values { stream.outputWritten() }
            return out
        }

        /// Both ways until neither side has more.
        func pump() {
            for _ in 0..<256 {
                let toServer = client.output()
                if !toServer.isEmpty { route(server.receive(toServer)) }
                let toClient = serverWrites()
                if !toClient.isEmpty { client.input(toClient) }
                if toServer.isEmpty, toClient.isEmpty { return }
            }
        }

        /// A POST whose head the delegate holds before any body byte came (the exchange has the request before
        /// its body ended), then `body` sent.
        func heldPost(then body: [UInt8], end: Bool) throws -> (Int32, HTTP2Stream, HTTPRequest) {
            let id = client.request("POST", "/", body: [], endBody: false)
            pump()
            let stream = try #require(streams[id])
            let request = try #require(stream.hold())
            client.sendBody(id, body, end: end)
            pump()
            return (id, stream, request)
        }

        /// Starts a 200 of unknown length, sends `part`, pumps.
        func start(_ request: HTTPRequest, sending part: String) {
            request.startReply(status: 200)
            HTTP2StreamTests.bytes(part).withUnsafeBytes { request.send($0) }
            pump()
        }

        /// Answers 200 with `length` announced and `body` sent, ends, pumps: what the client got.
        func answer(_ request: HTTPRequest, _ id: Int32, length: Int?, body: String) throws -> HTTP2TestClient.Answer {
            request.startReply(status: 200, contentLength: length)
            HTTP2StreamTests.bytes(body).withUnsafeBytes { request.send($0) }
            request.endReply()
            pump()
            return try #require(client.answers[id])
        }

        /// Submits a request, pumps, and hands over its `HTTPRequest`.
        func request(
            _ method: String = "GET", _ path: String = "/", fields: [HTTPField] = [], body: [UInt8]? = nil
        ) throws -> (Int32, HTTPRequest, Observer) {
            let id = client.request(method, path, fields: fields, body: body)
            pump()
            let stream = try #require(streams[id])
            #expect(stream.readyToDispatch == .request)
            let request = try #require(stream.dispatch())
            let observer = Observer()
            request.observer = observer
            return (id, request, observer)
        }
    }

    static func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }

    // MARK: - The request

    @Test func theRequestIsReadFromTheStreamAndItsBodyHandedOverOnce() throws {
        let rig = try Rig()
        let body = (0..<90_000).map { UInt8(truncatingIfNeeded: $0) }
        let (_, request, _) = try rig.request(
            "POST", "/up/./load?x=1", fields: [Self.field("content-length", "90000"), Self.field("accept", "*/*")],
            body: body)
        #expect(request.method == "POST")
        #expect(request.target == "/up/load?x=1")
        #expect(request.header("host") == "example.com")
        #expect(request.header("Accept") == "*/*")
        #expect(request.nominatedFields() == [false, false, false])
        #expect(!request.connectionNominatesFields)
        #expect(!request.arrivedOverTLS)
        #expect(request.peerAddress == "192.0.2.1:5000")
        // More than the 64 KiB window: the stream took the bytes as they came, so the client could send on.
        #expect(request.takeBody().bytes == body)
        #expect(request.takeBody().count == 0)
    }

    /// A held body with a `content-length` past `limits.body_in_memory`
    /// (the owner's `http2BodyMapping` says so) is read into its spool file
    /// as DATA arrives, and handed over as that file, whole.
    @Test func aLargeBodyWithALengthIsReadIntoItsSpoolFile() throws {
        let rig = try Rig()
        let account = BodyBudget(limit: 1 << 20)
        var asked: [Int] = []
        rig.bodySpool = { length in
            asked.append(length)
            return SpoolMapping(capacity: length, budget: account) { AnswerSpool.openUnlinked(in: NSTemporaryDirectory()) }
        }
        let body = (0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 3) }
        rig.bodyInMemory = 64 << 10
        let (_, request, _) = try rig.request("PUT", "/up", fields: [Self.field("content-length", "200000")], body: body)
        #expect(asked == [200_000])
        let handed = request.takeBody()
        #expect(handed.isSpooled && handed.bytes == body)
        #expect(account.current == 200_000)
        #expect(request.takeBody().count == 0)
    }

    /// An answer read ahead whose staged bytes fill exactly one DATA frame
    /// (16,384: libcurl's read size), the rest in the spool, then ended:
    /// the frame that empties the staging must not end the stream while the
    /// spool still holds the rest (it did: the client got 16,384 bytes and
    /// a clean END_STREAM). Every byte arrives, and the account is given back.
    @Test func anAnswerReadAheadIsNotEndedBeforeItsSpoolIsSent() throws {
        let rig = try Rig()
        let account = BodyBudget(limit: 64 << 20)
        rig.answerSpool = { AnswerSpool(account: account, limit: 1 << 20) { AnswerSpool.openUnlinked(in: NSTemporaryDirectory()) } }
        let (id, request, _) = try rig.request()
        let stream = try #require(rig.streams[id])
        stream.stagingBound = 16384
        stream.readAheadLimit = 1 << 20
        request.startReply(status: 200)
        request.permitReadAhead()
        let staged = [UInt8](repeating: 0x61, count: 16384)
        let spooled = (0..<20000).map { UInt8(truncatingIfNeeded: $0) }
        staged.withUnsafeBytes { request.send($0) }
        spooled.withUnsafeBytes { request.send($0) }
        #expect(stream.hasSpool)
        request.endReply()
        rig.pump()
        let answer = try #require(rig.client.answers[id])
        #expect(answer.body == staged + spooled)
        #expect(account.current == 0)
    }

    @Test func aStreamResetBeforeItsDispatchTurnIsNeverHandedOver() throws {
        let rig = try Rig()
        let id = rig.client.request("POST", "/", body: [1, 2, 3], endBody: false)
        rig.pump()
        rig.client.reset(id)
        rig.pump()
        #expect(rig.streams[id]?.dispatch() == nil)
        #expect(rig.streams[id]?.machine.state == .closed(.clientReset))
    }

    // MARK: - The answer

    @Test func aGetIsAnsweredWithItsBodyAndTheStreamCloses() throws {
        let rig = try Rig()
        let (id, request, observer) = try rig.request()
        request.addResponseHeader("Content-Type", "text/plain")
        request.startReply(status: 200, contentLength: 5, reason: Array("Fine".utf8))
        Self.bytes("hello").withUnsafeBytes { request.send($0, notifyWhenDrained: true) }
        request.endReply()
        rig.pump()
        let answer = try #require(rig.client.answers[id])
        #expect(
            answer.head == [
                Self.field(":status", "200"), Self.field("content-type", "text/plain"),
                Self.field("content-length", "5"),
            ])
        #expect(answer.body == Self.bytes("hello"))
        #expect(answer.closedWith == NGHTTP2_NO_ERROR.rawValue)
        #expect(answer.resetWith == nil)
        #expect(rig.streams[id]?.machine.state == .closed(.complete))
        #expect(observer.cancelled == 0)
        #expect(rig.outputAsked > 0)
        // Answered: the request is done with, and a late call does nothing.
        Self.bytes("late").withUnsafeBytes { request.send($0) }
        #expect(request.pendingOutput == 0)
    }

    @Test func aWholeReplyWithoutALengthGoesInOneCall() throws {
        let rig = try Rig()
        let (id, request, _) = try rig.request()
        request.reply(status: 404, headers: [Self.field("X-Why", "gone")], body: "nothing here")
        rig.pump()
        let answer = try #require(rig.client.answers[id])
        #expect(
            answer.head == [
                Self.field(":status", "404"), Self.field("x-why", "gone"), Self.field("content-length", "12"),
            ])
        #expect(answer.body == Self.bytes("nothing here"))
        #expect(answer.closedWith == NGHTTP2_NO_ERROR.rawValue)
    }

    @Test(arguments: [
        ("HEAD", 200, 42 as Int?, "42" as String?), ("GET", 204, 42, nil), ("GET", 304, 42, "42"),
        ("GET", 200, 0, "0"),
    ])
    func answersWithoutABodyEndOnTheirHeaders(method: String, status: Int, length: Int?, announced: String?) throws {
        let rig = try Rig()
        let (id, request, _) = try rig.request(method)
        request.startReply(status: status, contentLength: length)
        Self.bytes("never sent").withUnsafeBytes { request.send($0) }
        request.endReply()
        rig.pump()
        let answer = try #require(rig.client.answers[id])
        var head = [Self.field(":status", String(status))]
        if let announced { head.append(Self.field("content-length", announced)) }
        #expect(answer.head == head)
        #expect(answer.body.isEmpty)
        #expect(answer.closedWith == NGHTTP2_NO_ERROR.rawValue)
        #expect(answer.resetWith == nil)
        #expect(rig.streams[id]?.machine.state == .closed(.complete))
    }

    @Test func anAnswerShortOfItsLengthIsResetNotEnded() throws {
        let rig = try Rig()
        let (id, request, observer) = try rig.request()
        let answer = try rig.answer(request, id, length: 10, body: "four")
        // nghttp2 sends the RST_STREAM ahead of the DATA still queued, which it drops: the client sees the reset.
        #expect(answer.body.count < 10)
        #expect(answer.resetWith == HTTP2ErrorCode.internalError.rawValue)
        #expect(rig.streams[id]?.machine.state == .closed(.shortAnswer))
        #expect(observer.cancelled == 0)
    }

    @Test func bytesPastTheAnnouncedLengthAreNotSent() throws {
        let rig = try Rig()
        let (id, request, _) = try rig.request()
        let answer = try rig.answer(request, id, length: 3, body: "abcdef")
        #expect(answer.body == Self.bytes("abc"))
        #expect(answer.closedWith == NGHTTP2_NO_ERROR.rawValue)
    }

    @Test func abortResetsThatStreamOnlyAndTheConnectionGoesOn() throws {
        let rig = try Rig()
        let (first, request, observer) = try rig.request()
        let (second, other, _) = try rig.request("GET", "/b")
        request.startReply(status: 200)
        Self.bytes("part").withUnsafeBytes { request.send($0) }
        request.abort()
        rig.pump()
        #expect(rig.client.answers[first]?.resetWith == HTTP2ErrorCode.internalError.rawValue)
        #expect(rig.streams[first]?.machine.state == .closed(.aborted))
        #expect(observer.cancelled == 0)
        other.reply(status: 200, body: "ok")
        rig.pump()
        #expect(rig.client.answers[second]?.body == Self.bytes("ok"))
        #expect(rig.client.answers[second]?.closedWith == NGHTTP2_NO_ERROR.rawValue)
        #expect(rig.client.goaway == nil)
    }

    @Test func aClientResetCancelsTheRequestOnce() throws {
        let rig = try Rig()
        let (id, request, observer) = try rig.request()
        rig.start(request, sending: "some")
        rig.client.reset(id)
        rig.pump()
        #expect(observer.cancelled == 1)
        #expect(rig.streams[id]?.machine.state == .closed(.clientReset))
        // The exchange goes on writing a little while: nothing reaches the wire, nor is it told again.
        Self.bytes("more").withUnsafeBytes { request.send($0) }
        request.endReply()
        rig.pump()
        #expect(observer.cancelled == 1)
        #expect(rig.client.answers[id]?.body == Self.bytes("some"))
    }

    @Test func informationalAnswersGoAheadOfTheFinalOneAndNeverAfter() throws {
        let rig = try Rig()
        let (id, request, _) = try rig.request()
        Self.bytes("Link: </a.css>; rel=preload\r\nConnection: close\r\nX-Early:  yes \r\n").withUnsafeBytes {
            request.sendInformational(status: 103, fields: $0)
        }
        request.reply(status: 200, body: "ok")
        Self.bytes("Link: </b.css>\r\n").withUnsafeBytes { request.sendInformational(status: 103, fields: $0) }
        rig.pump()
        let answer = try #require(rig.client.answers[id])
        // The test client lists a second HEADERS frame (the final one, after a 1xx) as trailers.
        #expect(
            answer.head + answer.trailers == [
                Self.field(":status", "103"), Self.field("link", "</a.css>; rel=preload"), Self.field("x-early", "yes"),
                Self.field(":status", "200"), Self.field("content-length", "2"),
            ])
        #expect(answer.body == Self.bytes("ok"))
    }

    @Test func connectionSpecificFieldsAndThoseConnectionNamesAreDropped() throws {
        let rig = try Rig()
        let (id, request, _) = try rig.request()
        for (name, value) in [
            ("Connection", "X-Hop, close"), ("Keep-Alive", "timeout=5"), ("Proxy-Connection", "keep-alive"),
            ("Transfer-Encoding", "chunked"), ("Upgrade", "h2c"), ("Content-Length", "99"), ("X-Hop", "1"),
            ("X-Kept", "2"), ("X-Upstream-Hop", "3"),
        ] {
            request.addResponseHeader(name, value)
        }
        Self.bytes("x-upstream-hop").withUnsafeBytes { request.removeResponseHeaders(nominatedBy: $0) }
        request.startReply(status: 200, contentLength: 0)
        request.endReply()
        rig.pump()
        #expect(
            rig.client.answers[id]?.head == [
                Self.field(":status", "200"), Self.field("x-kept", "2"), Self.field("content-length", "0"),
            ])
    }

    @Test func trailersEndTheAnswerWhenStaged() throws {
        let rig = try Rig()
        let (id, request, _) = try rig.request()
        let stream = try #require(rig.streams[id])
        request.startReply(status: 200)
        Self.bytes("body").withUnsafeBytes { request.send($0) }
        Self.bytes("grpc-status").withUnsafeBytes { name in
            Self.bytes("0").withUnsafeBytes { stream.stageTrailer(name: name, value: $0, for: request) }
        }
        request.endReply()
        rig.pump()
        let answer = try #require(rig.client.answers[id])
        #expect(answer.head == [Self.field(":status", "200")])
        #expect(answer.body == Self.bytes("body"))
        #expect(answer.trailers == [Self.field("grpc-status", "0")])
        #expect(answer.closedWith == NGHTTP2_NO_ERROR.rawValue)
    }

    @Test func aLargeBodyWaitsForTheClientsWindowAndDrains() throws {
        let rig = try Rig()
        let (id, request, observer) = try rig.request()
        let stream = try #require(rig.streams[id])
        let body = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        request.startReply(status: 200, contentLength: body.count)
        body.withUnsafeBytes { request.send($0, notifyWhenDrained: true) }
        // One write of the server's: the client's 65,535-byte window takes the first bytes, the rest wait.
        rig.client.input(rig.serverWrites())
        #expect(request.pendingOutput == body.count - 65_535)
        #expect(stream.timerDeadline != nil)  // waiting on the client
        #expect(observer.drained == 0)
        rig.pump()
        #expect(request.pendingOutput == 0)
        #expect(observer.drained == 1)
        request.endReply()
        rig.pump()
        #expect(rig.client.answers[id]?.body == body)
        #expect(rig.client.answers[id]?.closedWith == NGHTTP2_NO_ERROR.rawValue)
        #expect(stream.timerDeadline == nil)
    }

    @Test func bodyPartsComingLaterResumeTheDeferredStream() throws {
        let rig = try Rig()
        let (id, request, _) = try rig.request()
        rig.start(request, sending: "first ")
        #expect(rig.client.answers[id]?.body == Self.bytes("first "))
        // Nothing staged: the data provider deferred; the next part resumes it.
        Self.bytes("second").withUnsafeBytes { request.send($0, notifyWhenDrained: true) }
        rig.pump()
        #expect(rig.client.answers[id]?.body == Self.bytes("first second"))
        #expect(rig.client.answers[id]?.closedWith == nil)
        request.endReply()
        rig.pump()
        #expect(rig.client.answers[id]?.closedWith == NGHTTP2_NO_ERROR.rawValue)
    }

    @Test func anEarlyAnswerResetsTheRequestBodyStillComing() throws {
        let rig = try Rig()
        let (id, stream, request) = try rig.heldPost(then: [1, 2, 3], end: false)
        #expect(stream.machine.heldBytes == 3)
        request.reply(status: 429, body: "slow down")
        rig.pump()
        let answer = try #require(rig.client.answers[id])
        #expect(answer.head.first == Self.field(":status", "429"))
        #expect(answer.body == Self.bytes("slow down"))
        #expect(answer.resetWith == HTTP2ErrorCode.noError.rawValue)
        #expect(stream.machine.state == .closed(.answeredEarly))
    }

    @Test func aHeldBodyIsReadWhenReleasedThenTheRequestIsReady() throws {
        let rig = try Rig()
        let (id, stream, request) = try rig.heldPost(then: [1, 2, 3], end: true)
        #expect(stream.readyToDispatch == nil)
        #expect(request.takeBody().count == 0)  // neither stored nor acknowledged yet
        request.readBody()
        #expect(stream.readyToDispatch == .request)
        #expect(stream.dispatch() === request)
        #expect(request.takeBody().bytes == [1, 2, 3])
        request.reply(status: 201)
        rig.pump()
        #expect(rig.client.answers[id]?.head.first == Self.field(":status", "201"))
        #expect(rig.client.answers[id]?.closedWith == NGHTTP2_NO_ERROR.rawValue)
    }

    @Test func aRefusedHeadIsHandedOverForItsRefusalToBeAnswered() throws {
        let rig = try Rig()
        let fields = (0..<30).map { Self.field("x-f\($0)", "v") }  // past maxFields (20)
        let id = rig.client.request("GET", "/", fields: fields)
        rig.pump()
        let stream = try #require(rig.streams[id])
        #expect(stream.readyToDispatch == .refused)
        #expect(stream.refusal != nil)
        #expect(stream.head == nil)
        let request = try #require(stream.dispatch())
        request.reply(status: 431, body: "too many")
        rig.pump()
        #expect(rig.client.answers[id]?.head.first == Self.field(":status", "431"))
        #expect(rig.client.answers[id]?.body == Self.bytes("too many"))
        #expect(rig.client.answers[id]?.closedWith == NGHTTP2_NO_ERROR.rawValue)
    }

    @Test func informationalLinesAreParsed() {
        var seen: [String] = []
        Self.bytes("A: 1\r\nno colon\r\n:bad\r\nB:\t two words \t\r\nC:\r\n").withUnsafeBytes {
            HTTP2Stream.forEachLine($0) { name, value in
                seen.append(String(decoding: name, as: UTF8.self) + "=" + String(decoding: value, as: UTF8.self))
            }
        }
        #expect(seen == ["A=1", "B=two words", "C="])
    }
}
