import HappyPathCore
import Testing

@Suite struct ResponseHeadReaderTests {
    func read(_ text: String) -> (Result<ResponseHeadReader.Head, ResponseFramingError>, [String], String) {
        var fields: [String] = []
        var reason = ""
        let bytes = Array(text.utf8)
        let r = bytes.withUnsafeBytes { raw in
            ResponseHeadReader.read(raw) { n, v in
                fields.append(String(decoding: n, as: UTF8.self) + "=" + String(decoding: v, as: UTF8.self))
            } status: { _, phrase in
                reason = String(decoding: phrase, as: UTF8.self)
            }
        }
        return (r, fields, reason)
    }

    func end(_ text: String, from: Int = 0) -> Int? {
        Array(text.utf8).withUnsafeBytes { ResponseHeadReader.end(of: $0, from: from) }
    }

    @Test func aSwitchingProtocolsHead() {
        let (r, fields, reason) = read("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nX-A:  b c \t\r\n\r\n")
        #expect((try? r.get())?.status == 101)
        #expect(reason == "Switching Protocols")
        #expect(fields == ["Upgrade=websocket", "X-A=b c"])
    }

    @Test func noReasonPhraseIsAnEmptyOne() {
        let (r, _, reason) = read("HTTP/1.1 403\r\n\r\n")
        #expect((try? r.get())?.status == 403)
        #expect(reason == "")
    }

    @Test(arguments: ["HTTP/2 200 OK\r\n\r\n", "ICY 200 OK\r\n\r\n", "HTTP/1.1 20 OK\r\n\r\n", "HTTP/1.1 200 OK\r\n folded\r\n\r\n",
        "HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "HTTP/1.1 200 OK\r\n: empty name\r\n\r\n",
        // Found by FuzzResponseHead: a bare CR inside a field line.
        "HTTP/1.1 200 OK\r\nContent-Type: text\r\nContent-Length: 5\rth: 5\r\n\r\n",
        "HTTP/1.1 200 O\nK\r\n\r\n", "HTTP/1.1 200 OK\r\nA: b\nc\r\n\r\n"])
    func malformedHeadsAreRefused(_ text: String) {
        guard case .failure = read(text).0 else {
            Issue.record("accepted: \(text)")
            return
        }
    }

    @Test func theEndIsTheFirstEmptyLineHoweverTheBytesArrive() {
        let text = "HTTP/1.1 101 OK\r\nA: b\r\n\r\nframes\r\n\r\n"
        #expect(end(text) == 25)
        #expect(end("HTTP/1.1 101 OK\r\nA: b\r\n\r") == nil)
        // Resumed where the previous look stopped, 24 bytes in, one short
        // of the end (it looks back three bytes).
        #expect(end(text, from: 24) == 25)
        #expect(end("\r\n\r\n") == 4)
        #expect(end("\n\r\n\r\n") == 5)
    }
}
