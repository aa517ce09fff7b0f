import CNghttp2
import HappyPathCore
import HappyPathIO
import Testing

/// `HTTP2Session` against an in-memory nghttp2 client session (no sockets).
@Suite struct HTTP2SessionTests {
    static let limits = RequestLimits(maxHeadBytes: 8192, maxFields: 20, maxBodyBytes: 100_000)

    static func server(_ settings: HTTP2SessionSettings = HTTP2SessionSettings(request: limits)) throws -> HTTP2Session {
        try HTTP2Session(settings: settings)
    }

    static func field(_ name: String, _ value: String) -> HTTPField { HTTPField(name: name, value: value) }

    // MARK: - Requests in

    @Test func aGetBecomesReadyWithItsHeadAndIsAnswered() throws {
        let server = try Self.server()
        let client = try HTTP2TestClient()
        let id = client.request("GET", "/a/./b?q=1", fields: [Self.field("accept", "*/*")])
        let results = client.exchange(with: server)
        #expect(HTTP2ReceiveResult.ready(results) == [id])
        #expect(HTTP2ReceiveResult.events(results) == [.opened(id), .headComplete(id), .requestEnded(id)])
        let head = try #require(server.head(of: id))
        #expect(head.method == "GET")
        #expect(head.target == "/a/b?q=1")
        #expect(head.httpFields == [Self.field("host", "example.com"), Self.field("accept", "*/*")])
        #expect(server.requestEnded(id))

        #expect(server.submitResponse(id, status: 204, fields: [Self.field("X-Served", "yes")], hasBody: false) == nil)
        let after = client.exchange(with: server)
        #expect(client.answers[id]?.head == [Self.field(":status", "204"), Self.field("x-served", "yes")])
        #expect(client.answers[id]?.closedWith == NGHTTP2_NO_ERROR.rawValue)
        #expect(HTTP2ReceiveResult.events(after).contains(.closed(id, code: NGHTTP2_NO_ERROR.rawValue)))
        #expect(!server.isOpen(id))
        #expect(server.openStreams == 0)
    }

    @Test func theServerAdvertisesItsSettings() throws {
        let settings = HTTP2SessionSettings(maxConcurrentStreams: 7, initialStreamWindow: 100_000, request: Self.limits)
        let server = try Self.server(settings)
        let client = try HTTP2TestClient()
        client.exchange(with: server)
        func remote(_ id: nghttp2_settings_id) -> UInt32 { nghttp2_session_get_remote_settings(client.session, id) }
        #expect(remote(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS) == 7)
        #expect(remote(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE) == 100_000)
        #expect(remote(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE) == 8192)
        #expect(remote(NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES) == 1)
        // The connection window was raised to 1 MiB.
        #expect(nghttp2_session_get_remote_window_size(client.session) == 1024 * 1024)
        #expect(server.wantsRead)
        #expect(!server.wantsWrite)
    }

    @Test func aPostBodyIsBufferedUpToTheStreamWindowAndTakingItOpensTheWindow() throws {
        let server = try Self.server()
        let client = try HTTP2TestClient()
        let body = (0..<90_000).map { UInt8(truncatingIfNeeded: $0) }
        let id = client.request("POST", "/upload", fields: [Self.field("content-length", "90000")], body: body)
        let first = client.exchange(with: server)
        #expect(HTTP2ReceiveResult.ready(first) == [id])
        #expect(server.head(of: id)?.contentLength == 90_000)
        // The client stops at the stream's 64 KiB window until the bytes are taken.
        #expect(server.bufferedBody(of: id) == 65_536)
        #expect(!server.requestEnded(id))
        var received = server.takeBody(of: id)
        #expect(server.bufferedBody(of: id) == 0)
        let second = client.exchange(with: server)
        #expect(HTTP2ReceiveResult.events(second).contains(.requestEnded(id)))
        received += server.takeBody(of: id)
        #expect(received == body)
        #expect(server.requestEnded(id))
        #expect(HTTP2ReceiveResult.ready(second).isEmpty)
    }

    @Test func paddingIsGivenBackSoPaddedBodiesDoNotStallTheConnection() throws {
        // Windows at nghttp2's default 65,535; each DATA frame carries 10
        // body bytes and 255 of padding (the most), 80 KB a stream, 240 KB
        // in all: without the padding given back (nghttp2 consumes it
        // itself under no_auto_window_update), the client would stall.
        let settings = HTTP2SessionSettings(
            initialStreamWindow: 65_535, initialConnectionWindow: 65_535, request: Self.limits)
        let server = try Self.server(settings)
        let client = try HTTP2TestClient()
        client.bodyChunk = 10
        client.padData = true
        let ids = (0..<3).map { _ in client.request("POST", "/", body: [UInt8](repeating: 1, count: 3000)) }
        var results: [HTTP2ReceiveResult] = []
        for _ in 0..<32 {
            results += client.exchange(with: server)
            for id in ids { _ = server.takeBody(of: id) }
        }
        #expect(results.allSatisfy { $0.error == nil })
        #expect(results.map { $0.framesReceived[0] }.reduce(0, +) == 900)
        #expect(results.map(\.consumed).reduce(0, +) > 900 * 265)  // padded indeed
        for id in ids { #expect(server.requestEnded(id)) }
    }

    @Test func aBodyOverTheLimitIsDroppedAndSaidOnce() throws {
        let limits = RequestLimits(maxHeadBytes: 8192, maxBodyBytes: 1000)
        let server = try Self.server(HTTP2SessionSettings(request: limits))
        let client = try HTTP2TestClient()
        let id = client.request("POST", "/", body: [UInt8](repeating: 7, count: 5000))
        let events = HTTP2ReceiveResult.events(client.exchange(with: server))
        #expect(events.filter { $0 == .bodyTooLarge(id) }.count == 1)
        #expect(server.bufferedBody(of: id) == 0)
        #expect(server.requestEnded(id))
    }

    // MARK: - Answers out

    @Test func aResponseWithBodyAndTrailers() throws {
        let server = try Self.server()
        let client = try HTTP2TestClient()
        let id = client.request()
        client.exchange(with: server)
        #expect(server.submitResponse(id, status: 200, fields: [Self.field("content-type", "text/plain")], hasBody: true) == nil)
        server.sendData(id, Array("hello, ".utf8))
        server.sendData(id, Array("world".utf8), end: true, trailers: [Self.field("grpc-status", "0")])
        client.exchange(with: server)
        let answer = try #require(client.answers[id])
        #expect(answer.head == [Self.field(":status", "200"), Self.field("content-type", "text/plain")])
        #expect(String(decoding: answer.body, as: UTF8.self) == "hello, world")
        #expect(answer.trailers == [Self.field("grpc-status", "0")])
        #expect(answer.closedWith == NGHTTP2_NO_ERROR.rawValue)
        #expect(!server.isOpen(id))
    }

    @Test func dataDeferredUntilBytesAreStagedThenResumed() throws {
        let server = try Self.server()
        let client = try HTTP2TestClient()
        let id = client.request()
        client.exchange(with: server)
        #expect(server.submitResponse(id, status: 200, fields: [], hasBody: true) == nil)
        client.exchange(with: server)
        #expect(client.answers[id]?.head == [Self.field(":status", "200")])
        #expect(client.answers[id]?.body == [])
        #expect(client.answers[id]?.closedWith == nil)

        server.sendData(id, Array("abc".utf8))
        #expect(server.pendingOutput(for: id) == 3)
        client.exchange(with: server)
        #expect(client.answers[id]?.body == Array("abc".utf8))
        #expect(server.pendingOutput(for: id) == 0)
        #expect(client.answers[id]?.closedWith == nil)

        server.sendData(id, [UInt8](), end: true)
        client.exchange(with: server)
        #expect(client.answers[id]?.closedWith == NGHTTP2_NO_ERROR.rawValue)
        #expect(client.answers[id]?.trailers == [])
    }

    @Test func aResponseHeadTwiceIsRefused() throws {
        let server = try Self.server()
        let client = try HTTP2TestClient()
        let id = client.request()
        client.exchange(with: server)
        #expect(server.submitResponse(id, status: 200, fields: [], hasBody: true) == nil)
        #expect(server.submitResponse(id, status: 200, fields: [], hasBody: true) != nil)
        #expect(server.submitResponse(99, status: 200, fields: [], hasBody: false) != nil)
    }

    // MARK: - Resets

    @Test func aClientResetIsReportedAndTheStreamIsGone() throws {
        let server = try Self.server()
        let client = try HTTP2TestClient()
        let id = client.request("POST", "/", body: Array("part".utf8), endBody: false)
        let first = client.exchange(with: server)
        #expect(HTTP2ReceiveResult.ready(first) == [id])
        client.reset(id)
        let events = HTTP2ReceiveResult.events(client.exchange(with: server))
        #expect(events == [.resetByPeer(id, code: NGHTTP2_CANCEL.rawValue), .closed(id, code: NGHTTP2_CANCEL.rawValue)])
        #expect(!server.isOpen(id))
        // Writing to a gone stream is harmless.
        server.sendData(id, [1, 2, 3], end: true)
        #expect(server.submitResponse(id, status: 200, fields: [], hasBody: false) != nil)
    }

    @Test func theServerResetsAStream() throws {
        let server = try Self.server()
        let client = try HTTP2TestClient()
        let id = client.request("POST", "/", body: [], endBody: false)
        client.exchange(with: server)
        #expect(server.resetStream(id, code: NGHTTP2_REFUSED_STREAM.rawValue))
        let events = HTTP2ReceiveResult.events(client.exchange(with: server))
        #expect(client.answers[id]?.resetWith == NGHTTP2_REFUSED_STREAM.rawValue)
        #expect(client.answers[id]?.closedWith == NGHTTP2_REFUSED_STREAM.rawValue)
        #expect(
            events == [
                .resetSent(id, code: NGHTTP2_REFUSED_STREAM.rawValue), .closed(id, code: NGHTTP2_REFUSED_STREAM.rawValue),
            ])
        #expect(!server.isOpen(id))
    }

    @Test func aConnectionSpecificFieldIsResetByNghttp2AndNeverReady() throws {
        let server = try Self.server()
        let client = try HTTP2TestClient()
        let bad = client.request(fields: [Self.field("connection", "close")])
        let good = client.request("GET", "/ok")
        let results = client.exchange(with: server)
        #expect(HTTP2ReceiveResult.ready(results) == [good])
        #expect(HTTP2ReceiveResult.events(results).contains(.closed(bad, code: NGHTTP2_PROTOCOL_ERROR.rawValue)))
        #expect(client.answers[bad]?.resetWith == NGHTTP2_PROTOCOL_ERROR.rawValue)
        #expect(server.head(of: good) != nil)
    }

    @Test func aHeadOurReaderRefusesIsReadyWithItsRefusal() throws {
        let server = try Self.server()
        let client = try HTTP2TestClient()
        let id = client.request("GET", "/", authority: "a.example", fields: [Self.field("host", "b.example")])
        let results = client.exchange(with: server)
        #expect(HTTP2ReceiveResult.ready(results) == [id])
        #expect(server.head(of: id) == nil)
        #expect(server.refusal(of: id) == .malformed(.authorityMismatch))
    }

    @Test func anInvalidFieldNghttp2WouldDropRefusesTheHead() throws {
        let server = try Self.server()
        let client = try HTTP2TestClient()
        let id = client.request(fields: [Self.field("bad name", "x")])
        let results = client.exchange(with: server)
        #expect(HTTP2ReceiveResult.ready(results) == [id])
        #expect(server.refusal(of: id) == .http1(.badFieldName))
    }

    // MARK: - Defences

    /// The client preface and an empty SETTINGS frame, by hand.
    static let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + frame(type: 4, flags: 0, stream: 0, [])

    static func frame(type: UInt8, flags: UInt8, stream: UInt32, _ payload: [UInt8]) -> [UInt8] {
        let n = payload.count
        return [
            UInt8(n >> 16 & 0xFF), UInt8(n >> 8 & 0xFF), UInt8(n & 0xFF), type, flags,
            UInt8(stream >> 24 & 0x7F), UInt8(stream >> 16 & 0xFF), UInt8(stream >> 8 & 0xFF), UInt8(stream & 0xFF),
        ] + payload
    }

    /// `x: y`, then a field `x-t` with a 5,000-byte value, in HPACK (literal, not indexed).
    static let smallField: [UInt8] = [0x00, 0x01, 0x78, 0x01, 0x79]
    static let bigField: [UInt8] = [0x00, 0x03] + Array("x-t".utf8) + [0x7F, 0x89, 0x26] + [UInt8](repeating: 0x76, count: 5000)
    /// GET http://a/ in HPACK from the static table.
    static let getBlock: [UInt8] = [0x82, 0x86, 0x84, 0x41, 0x01, 0x61]

    @Test func requestTrailersEndTheRequestAndAreNotKept() throws {
        let server = try Self.server()
        let head = Self.frame(type: 1, flags: 0x4, stream: 1, Self.getBlock)
        let trailers = Self.frame(type: 1, flags: 0x5, stream: 1, Self.smallField)
        let result = server.receive(Self.preface + head + trailers)
        #expect(result.error == nil)
        #expect(result.ready == [1])
        #expect(result.events == [.opened(1), .headComplete(1), .requestEnded(1)])
        #expect(server.head(of: 1)?.httpFields == [Self.field("host", "a")])
    }

    @Test func trailersFarOverTheLimitResetTheStream() throws {
        let server = try Self.server()
        // Nine 5,000-byte fields: 45 KB, past four times the 8 KiB limit.
        let trailers =
            Self.frame(type: 1, flags: 0x1, stream: 1, Array(repeating: Self.bigField, count: 3).flatMap { $0 })
            + Self.frame(type: 9, flags: 0, stream: 1, Array(repeating: Self.bigField, count: 3).flatMap { $0 })
            + Self.frame(type: 9, flags: 0x4, stream: 1, Array(repeating: Self.bigField, count: 3).flatMap { $0 })
        let result = server.receive(Self.preface + Self.frame(type: 1, flags: 0x4, stream: 1, Self.getBlock) + trailers)
        #expect(result.error == nil)
        #expect(result.ready == [1])
        #expect(!result.events.contains(.requestEnded(1)))
        _ = server.produceAll()  // the RST_STREAM goes out, and the stream closes
        #expect(
            server.takeEvents().events == [
                .resetSent(1, code: NGHTTP2_INTERNAL_ERROR.rawValue), .closed(1, code: NGHTTP2_INTERNAL_ERROR.rawValue),
            ])
        #expect(server.wantsRead)
    }

    @Test func aContinuationFloodEndsTheSession() throws {
        let server = try Self.server()
        // HEADERS without END_HEADERS (:method GET, :scheme http, :path /),
        // then CONTINUATIONs of indexed fields, none ending the block.
        var bytes = Self.preface + Self.frame(type: 1, flags: 0x1, stream: 1, [0x82, 0x86, 0x84])
        for _ in 0..<20 { bytes += Self.frame(type: 9, flags: 0, stream: 1, [UInt8](repeating: 0x84, count: 100)) }
        let result = server.receive(bytes)
        #expect(result.error?.code == -905)  // NGHTTP2_ERR_TOO_MANY_CONTINUATIONS
        #expect(result.ready.isEmpty)
        #expect(result.framesBegun[1] == 1)
        #expect(!server.wantsRead)
        // The session stays dead.
        #expect(server.receive(Self.frame(type: 6, flags: 0, stream: 0, [UInt8](repeating: 0, count: 8))).error?.code == -905)
    }

    @Test func anOversizedHeaderListIsRefusedAndFarOverIsReset() throws {
        let server = try Self.server()
        let client = try HTTP2TestClient()
        let value = String(repeating: "v", count: 3000)
        // 12 KB: over the 8 KiB limit, refused (431) but read to its end.
        let over = client.request(fields: (0..<4).map { Self.field("x-big-\($0)", value) })
        // The same 3,000-byte field 20 times: a few bytes each on the wire
        // once indexed, 60 KB decoded, past four times the limit: reset.
        let bomb = client.request(fields: [HTTPField](repeating: Self.field("x-bomb", value), count: 20))
        let after = client.request("GET", "/after")
        let results = client.exchange(with: server)
        #expect(HTTP2ReceiveResult.ready(results) == [over, after])
        #expect(server.refusal(of: over) == .http1(.headTooLarge))
        #expect(!HTTP2ReceiveResult.ready(results).contains(bomb))
        #expect(client.answers[bomb]?.resetWith != nil)
        #expect(server.head(of: after)?.target == "/after")
        #expect(server.wantsRead)
        #expect(results.allSatisfy { $0.error == nil })
    }

    @Test func aRapidResetBatchNeverComesOutReady() throws {
        let server = try Self.server()
        let client = try HTTP2TestClient()
        client.exchange(with: server)
        var ids: [Int32] = []
        for i in 0..<50 { ids.append(client.request("GET", "/r\(i)")) }
        var bytes = client.output()  // the HEADERS, each with END_STREAM
        for id in ids { client.reset(id) }
        bytes += client.output()  // then the RST_STREAMs, all in one read
        let good = client.request("GET", "/good")
        bytes += client.output()
        let result = server.receive(bytes)
        #expect(result.error == nil)
        #expect(result.ready == [good])
        #expect(result.framesReceived[3] == 50)
        for id in ids {
            #expect(result.events.contains(.resetByPeer(id, code: NGHTTP2_CANCEL.rawValue)))
            #expect(result.events.contains(.closed(id, code: NGHTTP2_CANCEL.rawValue)))
            #expect(!server.isOpen(id))
        }
        // Later reads never make them ready either.
        client.exchange(with: server)
        #expect(server.openStreams == 1)
    }

    @Test func streamsOverMaxConcurrentStreamsAreRefused() throws {
        let server = try Self.server(HTTP2SessionSettings(maxConcurrentStreams: 2, request: Self.limits))
        let client = try HTTP2TestClient()
        // All three before the client has seen the server's SETTINGS.
        let ids = (0..<3).map { client.request("GET", "/\($0)", body: [], endBody: false) }
        let result = server.receive(client.output())
        #expect(result.ready == Array(ids.prefix(2)))
        #expect(!server.isOpen(ids[2]))
        client.input(server.produceAll())
        #expect(client.answers[ids[2]]?.resetWith == NGHTTP2_REFUSED_STREAM.rawValue)
        #expect(server.openStreams == 2)
    }

    @Test func goawayAndShutdownNotice() throws {
        let server = try Self.server()
        let client = try HTTP2TestClient()
        let id = client.request()
        client.exchange(with: server)
        #expect(server.shutdownNotice())
        client.exchange(with: server)
        #expect(client.goaway == NGHTTP2_NO_ERROR.rawValue)
        #expect(server.lastProcessedStreamID == id)
        #expect(server.goaway(code: NGHTTP2_ENHANCE_YOUR_CALM.rawValue))
        client.exchange(with: server)
        #expect(client.goaway == NGHTTP2_ENHANCE_YOUR_CALM.rawValue)
    }

    /// nghttp2 skips a PRIORITY frame's payload (our SETTINGS say
    /// NO_RFC7540_PRIORITIES) and never reports it received; the machine
    /// still sees each one, once, so its PRIORITY budget can end a flood.
    @Test func priorityFramesReachTheMachineThoughNghttp2SkipsThem() throws {
        let server = try Self.server()
        let priority = Self.frame(type: 2, flags: 0, stream: 3, [0, 0, 0, 0, 15])
        let result = server.receive(Self.preface + priority + priority + Self.frame(type: 2, flags: 0, stream: 5, [0, 0, 0, 1, 15]))
        #expect(result.error == nil)
        #expect(result.framesBegun[2] == 3)
        #expect(result.framesReceived[2] == 0)
        #expect(result.frames == [.settings, .priority, .priority, .priority])
    }

    @Test func framesAreCountedByType() throws {
        let server = try Self.server()
        let ping = Self.frame(type: 6, flags: 0, stream: 0, [UInt8](repeating: 1, count: 8))
        let result = server.receive(Self.preface + ping + ping + Self.frame(type: 0xFA, flags: 0, stream: 0, [1]))
        #expect(result.error == nil)
        #expect(result.framesBegun[4] == 1)
        #expect(result.framesBegun[6] == 2)
        #expect(result.framesBegun[0xFA] == 0)  // nghttp2 skips unknown frame types without a word
        #expect(result.framesReceived[6] == 2)
        // Our SETTINGS and connection WINDOW_UPDATE, the SETTINGS ACK, two PING ACKs.
        #expect(server.outboundQueueSize == 5)
        #expect(server.framesBegun[6] == 2)
    }
}
