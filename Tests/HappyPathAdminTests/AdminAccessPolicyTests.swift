import HappyPathAdmin
import HappyPathPolicies
import Testing

@Suite struct AdminAccessPolicyTests {
    let policy = AdminAccessPolicy(allowedHosts: ["Admin.Example.com", "[fd00::5]"], listenHost: "0.0.0.0")

    @Test(arguments: [
        // (Host, the address the connection arrived at, accepted)
        ("127.0.0.1:9901", "127.0.0.1", true),
        ("127.0.0.1", "127.0.0.1", true),
        ("localhost:9901", "127.0.0.1", true),
        ("LOCALHOST", "127.0.0.1", true),
        ("localhost.", "127.0.0.1", true),
        ("[::1]:9901", "::1", true),
        ("10.1.2.3:9901", "10.1.2.3", true),  // a wildcard listener reached on its pod IP
        ("10.1.2.3", "::ffff:10.1.2.3", true),  // the same on a dual-stack socket
        ("[fd00::7]:9901", "fd00::7", true),
        ("admin.example.com:9901", "10.1.2.3", true),
        ("ADMIN.EXAMPLE.COM", "10.1.2.3", true),
        ("[fd00::5]", "10.1.2.3", true),
        ("evil.example:9901", "127.0.0.1", false),  // a rebinding page
        ("evil.example", "127.0.0.1", false),
        ("10.9.9.9:9901", "10.1.2.3", false),  // another machine's address
        ("admin.example.com.evil.example", "127.0.0.1", false),
        ("localhost.evil.example", "127.0.0.1", false),
        ("127.0.0.1:99x", "127.0.0.1", false),  // not host[:port]
    ])
    func acceptsOnlyTheListenersOwnNames(host: String, local: String, accepted: Bool) {
        #expect((policy.checkHost(host, localAddress: local) == .allow) == accepted)
    }

    @Test func aMissingHostIsAllowed() {
        #expect(policy.checkHost(nil, localAddress: "127.0.0.1") == .allow)
    }

    @Test func theRefusalSaysWhatToAddToAllowedHosts() {
        guard case let .refuse(detail) = policy.checkHost("Evil.Example:9901", localAddress: "127.0.0.1") else {
            Issue.record("not refused")
            return
        }
        #expect(detail.contains("add evil.example to admin.allowed_hosts"))
    }

    @Test func aListenerOnOneAddressAcceptsItAsHost() {
        let bound = AdminAccessPolicy(listenHost: "10.0.0.5")
        #expect(bound.checkHost("10.0.0.5:9901", localAddress: "") == .allow)
        #expect(bound.checkHost("10.0.0.6:9901", localAddress: "") != .allow)
    }

    @Test(
        arguments: [
            // (method, Origin, Sec-Fetch-Site, Content-Type, allowed)
            ("POST", nil, nil, nil, true),  // curl, a script
            ("POST", nil, nil, "application/json", true),
            ("POST", "http://127.0.0.1:9901", "same-origin", nil, true),  // the listener's own origin
            ("POST", "https://evil.example", nil, nil, false),
            ("POST", "null", nil, nil, false),  // a sandboxed page, a file: URL
            ("POST", "http://127.0.0.1:9902", nil, nil, false),
            ("POST", nil, "cross-site", nil, false),
            ("POST", nil, "Cross-Site", nil, false),
            ("POST", nil, nil, "application/x-www-form-urlencoded", false),
            ("POST", nil, nil, "Multipart/Form-Data; boundary=x", false),
            ("POST", nil, nil, "text/plain;charset=UTF-8", false),
            ("DELETE", "https://evil.example", nil, nil, false),
            ("GET", "https://evil.example", "cross-site", "text/plain", true),  // reads are the Host check's business
            ("HEAD", "https://evil.example", nil, nil, true),
        ] as [(String, String?, String?, String?, Bool)])
    func refusesWhatAPageOnAnotherSiteCanSend(
        method: String, origin: String?, fetchSite: String?, contentType: String?, allowed: Bool
    ) {
        let verdict = policy.checkCrossSite(
            method: method, host: "127.0.0.1:9901", origin: origin, fetchSite: fetchSite, contentType: contentType)
        #expect((verdict == .allow) == allowed)
    }

    @Test func eachFieldTheRulesReadMayComeOnceAtMost() {
        #expect(AdminAccessPolicy.singleFields == ["Host", "Origin", "Sec-Fetch-Site", "Content-Type"])
        #expect(AdminAccessPolicy.checkSingleFields([1, 1, 1, 1]) == nil)
        #expect(AdminAccessPolicy.checkSingleFields([0, 0, 0, 0]) == nil)
        #expect(
            AdminAccessPolicy.checkSingleFields([1, 2, 0, 0])
                == "The request carries Origin 2 times; the admin listener reads it once, so send Origin once.")
        // The first repeated one is named.
        let first = AdminAccessPolicy.checkSingleFields([1, 1, 3, 2])
        #expect(first?.hasPrefix("The request carries Sec-Fetch-Site 3 times") == true)
        #expect(AdminAccessPolicy.checkSingleFields([1, 0, 0, 2])?.contains("send Content-Type once") == true)
    }
}
