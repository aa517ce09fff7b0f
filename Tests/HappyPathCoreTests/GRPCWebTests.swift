import HappyPathCore
import Testing

/// Issue 49: gRPC-Web's wire pieces: content types, the trailer frame, and
/// the text mode's base64 in any split.
@Suite struct GRPCWebTests {
    @Test(arguments: [
        ("application/grpc-web", GRPCWeb.Mode.binary), ("application/grpc-web+proto", .binary),
        ("Application/GRPC-Web-Text", .text), ("application/grpc-web-text+proto; charset=utf-8", .text),
        ("application/grpc-web+json", .binary), ("application/grpc-web-text+thrift", .text), (" application/grpc-web ;x=1", .binary),
        ("application/grpc-web; x=a+b", .binary),
    ])
    func readsItsContentTypes(_ type: String, _ mode: GRPCWeb.Mode) {
        #expect(GRPCWeb.mode(contentType: Array(type.utf8)) == mode)
    }

    @Test(arguments: [
        "application/grpc", "application/grpc+proto", "application/json", "", "application/grpc-webx", "application/ grpc-web",
        "application/grpc-web+", "application/grpc-web+pro/to", "application/grpc-web-textual",
    ])
    func othersAreNotGRPCWeb(_ type: String) {
        #expect(GRPCWeb.mode(contentType: Array(type.utf8)) == nil)
    }

    @Test func theTrailerFrameCarriesTheStatus() {
        let frame = GRPCWeb.trailerFrame([("grpc-status", "14"), ("Grpc-Message", "unavailable")])
        let block = Array("grpc-status: 14\r\ngrpc-message: unavailable\r\n".utf8)
        #expect(frame == [0x80, 0, 0, 0, UInt8(block.count)] + block)
    }

    @Test(arguments: [
        ("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("fooba", "Zm9vYmE="), ("foobar", "Zm9vYmFy"),
    ])
    func base64AsRFC4648Says(_ plain: String, _ encoded: String) {
        #expect(GRPCWeb.base64(Array(plain.utf8)) == Array(encoded.utf8))
        for split in 1...5 {
            var d = GRPCWebTextDecoder()
            var out: [UInt8] = []
            let bytes = Array(encoded.utf8)
            var at = 0
            while at < bytes.count {
                #expect(d.feed(bytes[at..<min(bytes.count, at + split)], into: &out) == nil)
                at += split
            }
            #expect(d.finish() == nil)
            #expect(out == Array(plain.utf8), "split \(split)")
        }
    }

    /// A client may encode each message on its own: padding ends a group, and decoding starts afresh.
    @Test func paddingMayEndAnyGroup() {
        let first = GRPCWeb.base64([0, 0, 0, 0, 1, 7])
        let second = GRPCWeb.base64([0x80, 0, 0, 0, 0])
        var d = GRPCWebTextDecoder()
        var out: [UInt8] = []
        #expect(d.feed(first + second, into: &out) == nil)
        #expect(d.finish() == nil)
        #expect(out == [0, 0, 0, 0, 1, 7, 0x80, 0, 0, 0, 0])
    }

    @Test(arguments: ["Zg=", "Z", "Zm9", "Zg==Z", "Z===", "=Zg=", "Zg==="])
    func truncatedOrMisplacedPaddingIsRefused(_ text: String) {
        var d = GRPCWebTextDecoder()
        var out: [UInt8] = []
        let failure = d.feed(Array(text.utf8), into: &out) ?? d.finish()
        #expect(failure != nil, "\(text)")
        #expect(d.failed)
    }

    @Test(arguments: ["Zm9v!", "Zm 9v", "Zm9v\n", "Zm-v", "Zm_v"])
    func anythingButTheAlphabetIsRefused(_ text: String) {
        var d = GRPCWebTextDecoder()
        var out: [UInt8] = []
        #expect(d.feed(Array(text.utf8), into: &out) != nil)
        // Refused for good: nothing more is read.
        #expect(d.feed(Array("Zm9v".utf8), into: &out) != nil)
        #expect(d.finish() != nil)
    }

    @Test(arguments: [
        ("application/grpc-web", "application/grpc", "application/grpc-web", "application/grpc-web-text"),
        ("application/grpc-web+proto", "application/grpc+proto", "application/grpc-web+proto", "application/grpc-web-text+proto"),
        ("Application/GRPC-Web-Text+Proto; charset=x", "application/grpc+proto", "application/grpc-web+proto",
         "application/grpc-web-text+proto"),
        ("application/grpc-web+pro/to", "application/grpc", "application/grpc-web", "application/grpc-web-text"),
        ("application/grpc-web; x=a+b", "application/grpc", "application/grpc-web", "application/grpc-web-text"),
        ("application/grpc-web+JSON", "application/grpc+json", "application/grpc-web+json", "application/grpc-web-text+json"),
    ])
    func contentTypesKeepTheCodec(request: String, upstream: String, binary: String, text: String) {
        #expect(GRPCWeb.upstreamContentType(request.utf8) == upstream)
        #expect(GRPCWeb.answerContentType(.binary, request: request.utf8) == binary)
        #expect(GRPCWeb.answerContentType(.text, request: request.utf8) == text)
    }

    @Test(arguments: [
        ([], true),
        ([0, 0, 0, 0, 0], true),
        ([0, 0, 0, 0, 2, 7, 7, 1, 0, 0, 0, 1, 9], true),
        ([0, 0, 0, 0, 3, 7, 7], false),  // a length past the body
        ([0, 0xFF, 0xFF, 0xFF, 0xFF], false),  // four gigabytes declared
        ([0x80, 0, 0, 0, 0], false),  // a trailer frame in a request
        ([0, 0, 0], false),  // a header cut off
        ([0, 0, 0, 0, 0, 0], false),  // a second header cut off
    ] as [([UInt8], Bool)])
    func aRequestBodyIsWholeFrames(body: [UInt8], whole: Bool) {
        let problem = body.withUnsafeBytes { GRPCWeb.frameProblem($0) }
        #expect((problem == nil) == whole, "\(problem ?? "whole")")
    }

    @Test func aTextBodyIsDecodedAndChecked() throws {
        func body(_ bytes: [UInt8]) -> RequestBody {
            let b = RequestBody(count: bytes.count)
            bytes.withUnsafeBytes { if let base = b.baseAddress { base.copyMemory(from: $0.baseAddress!, byteCount: $0.count) } }
            return b
        }
        let message: [UInt8] = [0, 0, 0, 0, 2, 104, 105]
        // Each message encoded on its own (padding in the middle), as clients may.
        let text = GRPCWeb.base64(message) + GRPCWeb.base64(message)
        guard case let .success(sent) = GRPCWebRequest.body(body(text), mode: .text) else {
            Issue.record("refused")
            return
        }
        #expect(Array(UnsafeRawBufferPointer(start: sent.baseAddress, count: sent.count)) == message + message)
        guard case let .failure(refusal) = GRPCWebRequest.body(body(Array("AAA*".utf8)), mode: .text) else {
            Issue.record("let through")
            return
        }
        #expect(refusal.detail.contains("byte 3"), "\(refusal.detail)")
        guard case let .failure(cut) = GRPCWebRequest.body(body(GRPCWeb.base64([0, 0, 0, 0, 9, 1])), mode: .text) else {
            Issue.record("let through")
            return
        }
        #expect(cut.detail.contains("declares 9 bytes but 1 follow"), "\(cut.detail)")
        // Binary mode passes whole frames as they are.
        guard case .success = GRPCWebRequest.body(body(message), mode: .binary) else {
            Issue.record("refused")
            return
        }
    }
}
