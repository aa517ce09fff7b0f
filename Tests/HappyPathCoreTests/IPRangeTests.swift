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
