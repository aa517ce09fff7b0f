import HappyPathCore
import Testing

/// SHA-256 against the FIPS 180-4 / NIST example vectors.
@Suite struct SHA256Tests {
    @Test(arguments: [
        ("", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        ("abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        (
            "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        ),
        (
            "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"
        ),
    ])
    func digestMatchesTheStandardVectors(input: String, expected: String) {
        #expect(SHA256.hex(Array(input.utf8)) == expected)
    }

    @Test func aMillionBytesFedInUnevenPiecesMatchTheVector() {
        var h = SHA256()
        let chunk = [UInt8](repeating: UInt8(ascii: "a"), count: 999)
        var left = 1_000_000
        while left > 0 {
            let n = min(left, chunk.count)
            h.update(chunk[0..<n])
            left -= n
        }
        #expect(SHA256.hex(digest: h.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }

    /// Lengths around the 55/56/64-byte padding edges (digests from Python's hashlib).
    @Test(arguments: [
        (55, "27d3069ecafb8507f92fa750312a99afe0908525e67b2abe8942b51659945b1b"),
        (56, "3428ab653c0a1ac104ee80fd3bed55135da5556ca4c26da9c781ae56364a6969"),
        (57, "28c22b1d4fc34c26ca51d137ec64373fc16b38e32cef9c6759f910fc628efee1"),
        (63, "b5ec25bd1c4b7c94c9ea9d235272e43f644f561d7c8c7e58ec5fa9aefe95ef07"),
        (64, "a08f82c23e6c13629d8e33d0d2a13005fb104363eb793b5e8842044951d27764"),
        (65, "c0a0263ae1ab4e9dda9cd2ed6c44b23ee6ff75c90c640185f462fad7f24fcd6f"),
        (119, "b4639d08cdba917a7875088b4e05633a7812e14282482de937915c9799b17250"),
        (120, "e4fce14f6aa99657bdffe9f1da59ce85f0398479e9af7e9de6ccf53e174447ab"),
        (128, "8bb5dfd6ac2a606ce25701c19ed1fe8fa3a1a7355cd7fe3445ac3e2cc7a45359"),
    ])
    func lengthsAroundTheBlockEdgeHashRightWholeOrInPieces(length: Int, expected: String) {
        let bytes = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        #expect(SHA256.hex(bytes) == expected)
        var pieces = SHA256()
        pieces.update(bytes[0..<length / 3])
        pieces.update(bytes[(length / 3)...])
        #expect(SHA256.hex(digest: pieces.finish()) == expected)
    }
}
