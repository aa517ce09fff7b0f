import HappyPathCore
import Testing

/// Issue 49: gRPC-Web's wire pieces: content types, the trailer frame, and
/// the text mode's base64 in any split.
@Suite struct GRPCWebTests {
    @Test(arguments: [
        ("application/grpc-web", GRPCWeb.Mode.binary), ("application/grpc-web+proto", .binary),
        ("Application/GRPC-Web-Text", .text), ("application/grpc-web-text+proto; charset=utf-8", .text),
    ])
    func readsItsContentTypes(_ type: String, _ mode: GRPCWeb.Mode) {
        #expect(GRPCWeb.mode(contentType: Array(type.utf8)) == mode)
    }

    @Test(arguments: ["application/grpc", "application/grpc+proto", "application/json", "", "application/grpc-webx"])
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
}
