import HappyPathCore
import Testing

@Suite struct IPRangeTests {
    @Test(arguments: [
        ("10.0.0.0/8", "10.200.3.4", true), ("10.0.0.0/8", "11.0.0.1", false), ("192.168.1.7", "192.168.1.7", true),
        ("192.168.1.7", "192.168.1.8", false), ("0.0.0.0/0", "8.8.8.8", true), ("fd00::/8", "fd12::1", true),
        ("fd00::/8", "fe80::1", false), ("::1", "[::1]", true), ("10.0.0.0/8", "::ffff:10.1.2.3", true),
        ("172.16.0.0/12", "172.31.255.255", true), ("172.16.0.0/12", "172.32.0.0", false),
    ])
    func containment(range: String, address: String, inside: Bool) throws {
        let r = try #require(IPRange(range))
        #expect(r.contains(address) == inside)
    }

    @Test(arguments: ["10.0.0.0/33", "::/129", "banana", "10.0.0/8", "10.0.0.0/", "10.0.0.0/-1", ""])
    func refusesWhatIsNotANetwork(text: String) { #expect(IPRange(text) == nil) }
}

@Suite struct ClientAddressTests {
    static let trusted = [IPRange("10.0.0.0/8")!]

    @Test func withoutTrustedProxiesForwardedForChangesNothing() {
        #expect(ClientAddress.resolve(peer: "203.0.113.9", forwardedFor: ["1.2.3.4"], trusted: []) == "203.0.113.9")
    }

    @Test func aPeerThatIsNotTrustedIsTheClientWhateverItForwards() {
        #expect(ClientAddress.resolve(peer: "203.0.113.9", forwardedFor: ["1.2.3.4"], trusted: Self.trusted) == "203.0.113.9")
    }

    @Test func theRightmostUntrustedHopIsTheClient() {
        // The client wrote "6.6.6.6" itself; the trusted proxies appended the rest.
        let xff = ["6.6.6.6, 198.51.100.7", "10.1.1.1"]
        #expect(ClientAddress.resolve(peer: "10.0.0.2", forwardedFor: xff, trusted: Self.trusted) == "198.51.100.7")
    }

    @Test func aChainOfOnlyTrustedHopsEndsAtTheLeftmost() {
        #expect(ClientAddress.resolve(peer: "10.0.0.2", forwardedFor: ["10.9.9.9, 10.1.1.1"], trusted: Self.trusted) == "10.9.9.9")
        #expect(ClientAddress.resolve(peer: "10.0.0.2", forwardedFor: [], trusted: Self.trusted) == "10.0.0.2")
    }
}

/// Issue 31: one client is one rate-limit key however its address was
/// written (a hop with its source port used to be a new bucket per port).
@Suite struct ClientAddressNormalizationTests {
    @Test(arguments: [
        ("192.0.2.1", "192.0.2.1"), ("192.0.2.1:8080", "192.0.2.1"), ("192.0.2.1:1", "192.0.2.1"),
        ("[2001:db8::1]", "2001:db8::1"), ("[2001:db8::1]:443", "2001:db8::1"), ("2001:DB8:0:0:0:0:0:1", "2001:db8::1"),
        ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"), ("::ffff:192.0.2.1", "192.0.2.1"), ("[::ffff:192.0.2.1]:80", "192.0.2.1"),
        ("::FFFF:c000:0201", "192.0.2.1"), ("::1", "::1"), ("[::1]:9", "::1"), ("2001:db8::1", "2001:db8::1"),
    ])
    func oneFormPerAddress(written: String, canonical: String) {
        #expect(ClientAddress.normalized(written) == canonical)
    }

    @Test(arguments: [
        "unknown", "", "192.0.2.1:", "192.0.2.1:http", "192.0.2.1:65536", "192.0.2.1:-1", "[2001:db8::1", "[2001:db8::1]x",
        "[2001:db8::1]:", "[192.0.2.1]:80x", "_hidden", "192.0.2.1:80:80",
    ])
    func whatIsNotAnAddressIsNil(written: String) { #expect(ClientAddress.normalized(written) == nil) }

    static let trusted = [IPRange("10.0.0.0/8")!]

    @Test(arguments: [
        "198.51.100.7", "198.51.100.7:50123", "198.51.100.7:50124", "[::ffff:198.51.100.7]:1", " 198.51.100.7:9 ",
    ])
    func aForwardedHopWithItsPortIsTheBareAddress(hop: String) {
        let xff = ["\(hop), 10.1.1.1:3000"]
        #expect(ClientAddress.resolve(peer: "10.0.0.2", forwardedFor: xff, trusted: Self.trusted) == "198.51.100.7")
    }

    @Test func aTrustedHopWrittenWithAPortIsStillSkipped() {
        let xff = ["[2001:DB8::7]:1, 10.1.1.1:3000"]
        #expect(ClientAddress.resolve(peer: "::ffff:10.0.0.2", forwardedFor: xff, trusted: Self.trusted) == "2001:db8::7")
    }

    @Test func aMappedPeerIsItsIPv4Address() {
        #expect(ClientAddress.resolve(peer: "::ffff:203.0.113.9", forwardedFor: [], trusted: []) == "203.0.113.9")
        #expect(ClientAddress.canonicalPeer("203.0.113.9") == "203.0.113.9")
    }
}
