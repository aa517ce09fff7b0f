import Foundation
import Testing

/// Upstream errors become problems: built-in codes, `errors:` mappings, `upstream_body`.
@Suite("error normalization") struct ErrorNormalizationTests {
    @Test(arguments: [
        (400, "CLIENT_ERROR", 400), (401, "CLIENT_ERROR", 401), (403, "FORBIDDEN", 403), (404, "NOT_FOUND", 404),
        (409, "CLIENT_ERROR", 409), (422, "CLIENT_ERROR", 422), (429, "RATE_LIMITED", 429), (500, "UPSTREAM_UNAVAILABLE", 503),
        (501, "UPSTREAM_UNAVAILABLE", 503),
    ])
    func upstreamErrorsBecomeProblems(upstreamStatus: Int, code: String, status: Int) throws {
        let h = try ProxyHarness()
        let r = try HTTP.request(port: h.port, "/status/\(upstreamStatus)")
        #expect(r.status == status)
        #expect(r.header("Content-Type") == "application/problem+json")
        #expect(r.json["code"] as? String == code)
        #expect(r.json["status"] as? Int == status)
        #expect((r.json["upstream_body"] as? [String: Any])?["status"] as? Int == upstreamStatus)
        #expect(r.json["upstream"] as? String == "demo")
        #expect(r.json["attempts"] as? Int == 1)
    }

    @Test func routeMappingGivesItsOwnCodeAndTitle() throws {
        let up = ScriptedUpstream(responses: [http(404, #"{"error":"no such item","id":42}"#)]).started()
        defer { up.stop() }
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams:
              items:
                endpoints: [http://127.0.0.1:\(up.port)]
                errors:
                  - when: { status: 404 }
                    code: UPSTREAM_LEVEL_NOT_FOUND
            routes:
              - match: { path_prefix: /items/ }
                upstream: items
                errors:
                  - when: { status: 404 }
                    code: ITEM_NOT_FOUND
                    title: The item does not exist
                    recovery_suggestion: Check the identifier and try again.
              - match: { path_prefix: / }
                upstream: items
            """)
        let r = try HTTP.request(port: h.port, "/items/42")
        #expect(r.status == 404)
        #expect(r.json["code"] as? String == "ITEM_NOT_FOUND")
        #expect(r.json["type"] as? String == "urn:happypath:error:item-not-found")
        #expect(r.json["title"] as? String == "The item does not exist")
        #expect(r.json["recovery_suggestion"] as? String == "Check the identifier and try again.")
        #expect((r.json["upstream_body"] as? [String: Any])?["id"] as? Int == 42)
        // The other route has no mapping of its own: the upstream's applies.
        let other = try HTTP.request(port: h.port, "/other")
        #expect(other.json["code"] as? String == "UPSTREAM_LEVEL_NOT_FOUND")
    }

    @Test func jsonPointerAndStatusClassMappings() throws {
        let up = ScriptedUpstream(responses: [http(409, #"{"error":{"code":"card_declined"}}"#), http(418, "not json")]).started()
        defer { up.stop() }
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams: { pay: { endpoints: [http://127.0.0.1:\(up.port)] } }
            routes:
              - match: { path_prefix: / }
                upstream: pay
                errors:
                  - when: { json_pointer: /error/code, equals: card_declined }
                    code: CARD_DECLINED
                    retryable: false
                  - when: { status: 4xx }
                    code: PAYMENT_REJECTED
                    retryable: true
            """)
        let declined = try HTTP.request(port: h.port, "POST", "/pay", body: Array("{}".utf8))
        #expect(declined.status == 409)
        #expect(declined.json["code"] as? String == "CARD_DECLINED")
        #expect(declined.json["retryable"] as? Bool == false)
        let other = try HTTP.request(port: h.port, "POST", "/pay", body: Array("{}".utf8))
        #expect(other.status == 418)
        #expect(other.json["code"] as? String == "PAYMENT_REJECTED")
        #expect(other.json["retryable"] as? Bool == true)
        #expect(other.json["recovery_options"] as? [String] == ["retry", "cancel"])
        #expect(other.json["upstream_body"] == nil)  // not JSON: not embedded
    }
}
