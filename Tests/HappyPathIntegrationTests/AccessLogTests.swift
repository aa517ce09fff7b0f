import Foundation
import HappyPathCore
import HappyPathConfig
import HappyPathDemo
import Logging
import Synchronization
import Testing

@testable import HappyPathServer

#if canImport(Glibc)
    import Glibc
#endif

/// The access log: one JSON line per request, written per worker in batches
/// (when 100 ms old, when 64 KiB full, and at stop), none lost.
@Suite("access log") struct AccessLogTests {
    /// Every batch the proxy wrote, in order.
    final class Capture: Sendable {
        let batches = Locked<[String]>([])
        var sink: @Sendable (UnsafeRawBufferPointer) -> Void {
            { bytes in self.batches.withLock { $0.append(String(decoding: bytes, as: UTF8.self)) } }
        }
        var lines: [String] { batches.withLock { $0 }.joined().split(separator: "\n").map(String.init) }
        var writes: Int { batches.withLock { $0.count } }
    }

    /// Requests the proxy has finished (counted after the access-log line is composed).
    func finishedRequests(adminPort: Int) throws -> Int {
        let text = try HTTP.request(port: adminPort, "/metrics").text
        var total = 0.0
        for line in text.split(separator: "\n") where line.hasPrefix("happypath_requests_total{") {
            if let space = line.lastIndex(of: " "), let v = Double(line[line.index(after: space)...]) { total += v }
        }
        return Int(total)
    }

    func waitFor(
        _ what: String = "the access-log lines", sourceLocation: SourceLocation = #_sourceLocation,
        _ condition: () throws -> Bool
    ) -> Bool {
        waitUntil(what, sourceLocation: sourceLocation, condition)
    }

    @Test func everyLineIsJSONWithTheFields() throws {
        let other = Locked<[String]>([])
        let logger = Logger(label: "test") { label in
            LineLogHandler(label: label, format: .json, level: .info) { line in other.withLock { $0.append(line) } }
        }
        let capture = Capture()
        let h = try ProxyHarness(
            logger: logger, accessLog: AccessLogSettings(level: .info, format: .json, sink: capture.sink))
        let okResponse = try HTTP.request(port: h.port, "/ok", headers: [("X-Request-Id", "log-test-1")])
        _ = try HTTP.request(port: h.port, "/nothing-here-\(UUID())")
        _ = try HTTP.request(port: h.port, "/status/404")
        // Waits for the third line; that there are exactly three is checked next.
        #expect(waitFor { capture.lines.count >= 3 })
        let access = capture.lines.map { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        #expect(access.count == 3)
        #expect(access.allSatisfy { $0 != nil }, "every access-log line is a JSON object: \(capture.lines)")
        for line in access.compactMap({ $0 }) {
            #expect(line["msg"] as? String == "request")
            #expect(line["level"] as? String == "info")
            for field in [
                "ts", "method", "protocol", "request_id", "route", "upstream", "status", "code", "attempts", "duration_ms",
                "bytes",
            ] {
                #expect(line[field] != nil, "access log line lacks \(field)")
            }
        }
        let ok = access.compactMap { $0 }.first { $0["request_id"] as? String == "log-test-1" }
        #expect(ok?["status"] as? Int == 200)
        #expect(ok?["method"] as? String == "GET")
        #expect(ok?["protocol"] as? String == "HTTP/1.1")
        #expect((ok?["bytes"] as? Int ?? 0) > 0)
        #expect(ok?["bytes"] as? Int == okResponse.body.count)  // the body bytes the client got
        #expect(access.contains { $0?["code"] as? String == "NOT_FOUND" && $0?["status"] as? Int == 404 })
        h.stop()
        let others = other.withLock { $0 }
        #expect(!others.isEmpty)
        #expect(
            others.allSatisfy { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any] != nil },
            "every other log line is a JSON object too")
    }

    /// `protocol` is the version the request came in, read when it was
    /// dispatched (the connection may carry another request by the time
    /// the line is written).
    @Test func theProtocolIsTheRequestsOwn() throws {
        let capture = Capture()
        let h = try ProxyHarness(accessLog: AccessLogSettings(level: .info, format: .json, sink: capture.sink))
        defer { h.stop() }
        #expect(try EdgeHardeningTests.raw(h.port, "GET /ok HTTP/1.0\r\nHost: x\r\nX-Request-Id: v10\r\n\r\n").status == 200)
        #expect(try EdgeHardeningTests.raw(h.port, "GET /ok HTTP/1.1\r\nHost: x\r\nX-Request-Id: v11\r\n\r\n").status == 200)
        #expect(waitFor { capture.lines.count == 2 })
        var protocols: [String: String] = [:]
        for line in capture.lines {
            let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            if let id = object?["request_id"] as? String { protocols[id] = object?["protocol"] as? String }
        }
        #expect(protocols == ["v10": "HTTP/1.0", "v11": "HTTP/1.1"])
    }

    @Test func strangeRequestIDsAreEscaped() throws {
        let capture = Capture()
        let h = try ProxyHarness(accessLog: AccessLogSettings(level: .info, format: .json, sink: capture.sink))
        defer { h.stop() }
        _ = try HTTP.request(port: h.port, "/ok", headers: [("X-Request-Id", #"a\b{c}"#)])
        #expect(waitFor { capture.lines.count == 1 })
        let line = try JSONSerialization.jsonObject(with: Data((capture.lines.first ?? "").utf8)) as? [String: Any]
        #expect(line?["request_id"] as? String == #"a\b{c}"#)
    }

    @Test func linesWaitForTheirBatchAndAllComeOutAtStop() throws {
        let capture = Capture()
        let h = try ProxyHarness(
            accessLog: AccessLogSettings(level: .info, format: .json, sink: capture.sink, flushInterval: .seconds(3600)))
        for i in 0..<20 { _ = try HTTP.request(port: h.port, "/ok", headers: [("X-Request-Id", "batch-\(i)")]) }
        #expect(waitFor { try finishedRequests(adminPort: h.adminPort) == 20 })
        #expect(capture.writes == 0, "nothing is written before the batch is due")
        h.stop()
        // Not exact: the kernel spreads the 20 connections over the two
        // workers (SO_REUSEPORT), so one or both of them hold lines at stop.
        #expect((1...2).contains(capture.writes), "one write per worker at stop")
        let ids = Set(capture.lines.compactMap { line in
            (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])?["request_id"] as? String
        })
        let missing = Set((0..<20).map { "batch-\($0)" }).subtracting(ids)
        #expect(missing.isEmpty, "\(missing.count) of 20 lines lost")
    }

    @Test func aFullBatchIsWrittenWithoutWaitingForTheInterval() throws {
        let capture = Capture()
        let h = try ProxyHarness(
            accessLog: AccessLogSettings(
                level: .info, format: .json, sink: capture.sink, flushInterval: .seconds(3600), batchBytes: 1))
        defer { h.stop() }
        for i in 1...3 {
            _ = try HTTP.request(port: h.port, "/ok")
            #expect(waitFor { capture.lines.count == i })
        }
        #expect(capture.writes == 3)
    }

    @Test func aLineLongerThanABatchIsWrittenWhole() throws {
        let capture = Capture()
        let h = try ProxyHarness(
            accessLog: AccessLogSettings(
                level: .info, format: .json, sink: capture.sink, flushInterval: .seconds(3600), batchBytes: 64))
        defer { h.stop() }
        let id = String(repeating: "i", count: 128)
        _ = try HTTP.request(port: h.port, "/ok", headers: [("X-Request-Id", id)])
        _ = try HTTP.request(port: h.port, "/ok", headers: [("X-Request-Id", "short")])
        #expect(waitFor { capture.lines.count == 2 })
        let ids = capture.lines.compactMap { line in
            (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])?["request_id"] as? String
        }
        #expect(Set(ids) == [id, "short"])
    }

    @Test func theIntervalWritesABatch() throws {
        let capture = Capture()
        let h = try ProxyHarness(
            accessLog: AccessLogSettings(level: .info, format: .json, sink: capture.sink, flushInterval: .milliseconds(50)))
        defer { h.stop() }
        for _ in 0..<5 { _ = try HTTP.request(port: h.port, "/ok") }
        #expect(waitFor { capture.lines.count == 5 }, "written by the timer, with the proxy still running")
    }

    @Test func textFormatAndLevelsAboveInfoWriteNothing() throws {
        let text = Capture()
        let h = try ProxyHarness(accessLog: AccessLogSettings(level: .info, format: .text, sink: text.sink))
        _ = try HTTP.request(port: h.port, "/ok", headers: [("X-Request-Id", "text-1")])
        #expect(waitFor { text.lines.count == 1 })
        let line = text.lines.first ?? ""
        #expect(line.contains(" INFO request "))
        #expect(line.contains("request_id=text-1"))
        #expect(line.contains("status=200"))
        #expect(line.contains(" protocol=HTTP/1.1 "))
        h.stop()

        let quiet = Capture()
        let q = try ProxyHarness(accessLog: AccessLogSettings(level: .warning, format: .json, sink: quiet.sink))
        _ = try HTTP.request(port: q.port, "/ok")
        q.stop()
        #expect(quiet.writes == 0)
    }

    /// The real binary, stderr to a file: every request answered before
    /// SIGTERM has its line when the process has exited.
    @Test func noLineIsLostAtSIGTERM() throws {
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        defer { demo.stop() }
        let serve = try ServeProcess(
            config: """
                listen: 127.0.0.1:0
                admin: { listen: 127.0.0.1:0 }
                workers: 2
                upstreams: { demo: { endpoints: [http://127.0.0.1:\(demo.port)] } }
                routes: [ { match: { path_prefix: / }, upstream: demo } ]
                """, logLevel: "info")
        let port = try #require(serve.listeningPort())
        let admin = try #require(serve.adminPort())
        #expect(waitFor("/readyz") { (try? HTTP.request(port: admin, "/readyz").status) == 200 })
        serve.waitForSignalHandlers()

        let count = 400
        let clients = try (0..<4).map { _ in try TestConnection(port: port) }
        for i in 0..<count {
            let client = clients[i % clients.count]
            try client.send("GET /ok HTTP/1.1\r\nHost: x\r\nX-Request-Id: sigterm-\(i)\r\n\r\n")
            #expect(try client.readResponse().status == 200)
        }
        serve.signal(SIGTERM)
        #expect(serve.waitForExit())
        let lines = serve.errors.split(separator: "\n")
        let ids = lines.compactMap { line -> String? in
            guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                object["msg"] as? String == "request"
            else { return nil }
            return object["request_id"] as? String
        }
        #expect(ids.count == count)
        let missing = Set((0..<count).map { "sigterm-\($0)" }).subtracting(ids)
        #expect(missing.isEmpty, "\(missing.count) of \(count) lines lost")
    }
}
