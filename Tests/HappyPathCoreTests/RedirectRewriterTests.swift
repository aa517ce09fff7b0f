import HappyPathCore
import Testing

@Suite struct RedirectRewriterTests {
    @Test(arguments: [
        // endpoint http://10.0.0.5:9000/base, route strip_prefix /api
        ("http://10.0.0.5:9000/base/items/1", "/api/items/1"),
        ("HTTP://10.0.0.5:9000/base/items?x=1", "/api/items?x=1"),
        ("http://10.0.0.5:9000/base", "/api/"),
        ("http://10.0.0.5:9000/base?next=1", "/api/?next=1"),
    ])
    func anEndpointURLPointsBackAtTheProxy(location: String, expected: String) {
        let r = RedirectRewriter(endpointOrigin: "http://10.0.0.5:9000/", basePath: "/base", stripPrefix: "/api")
        #expect(r.rewrite(location, isRefresh: false) == expected)
    }

    @Test(arguments: [
        "http://elsewhere.example/base/x",  // another origin
        "http://10.0.0.5:9001/base/x",  // another port
        "https://10.0.0.5:9000/base/x",  // another scheme
        "http://10.0.0.5:9000/other/x",  // outside the base path
        "http://10.0.0.5:9000/basement",  // not at a segment boundary
        "/base/x",  // relative: it already resolves against the proxy
        "mailto:someone@example.com",
    ])
    func otherURLsAreLeftAlone(location: String) {
        let r = RedirectRewriter(endpointOrigin: "http://10.0.0.5:9000/", basePath: "/base", stripPrefix: "/api")
        #expect(r.rewrite(location, isRefresh: false) == nil)
    }

    @Test func withoutBasePathOrPrefixOnlyTheOriginChanges() {
        let r = RedirectRewriter(endpointOrigin: "http://127.0.0.1:80", basePath: "", stripPrefix: nil)
        #expect(r.rewrite("http://127.0.0.1/a/b#frag", isRefresh: false) == "/a/b#frag")
    }

    @Test func refreshKeepsItsDelay() {
        let r = RedirectRewriter(endpointOrigin: "http://u:9000", basePath: "", stripPrefix: "/api")
        #expect(r.rewrite("5; url=http://u:9000/next", isRefresh: true) == "5; url=/api/next")
        #expect(r.rewrite("0;URL='http://u:9000/x'", isRefresh: true) == "0;URL='/api/x'")
        #expect(r.rewrite("3; url = http://u:9000/spaced", isRefresh: true) == "3; url = /api/spaced")
        #expect(r.rewrite("5", isRefresh: true) == nil)
    }

    @Test(arguments: ["location", "Location", "content-location", "REFRESH"])
    func appliesToTheThreeFields(name: String) {
        var n = name
        #expect(n.withUTF8 { RedirectRewriter.applies(to: UnsafeRawBufferPointer($0)) })
    }
}
