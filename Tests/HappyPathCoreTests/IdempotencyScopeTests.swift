import HappyPathCore
import Testing

@Suite struct IdempotencyScopeTests {
    static func body(_ text: String, _ work: (UnsafeRawBufferPointer) -> String) -> String {
        Array(text.utf8).withUnsafeBytes(work)
    }

    @Test func theClientIsItsAuthorizationThenTheConfiguredHeaderThenNobody() {
        #expect(
            IdempotencyScope.client(authorization: "Bearer a", headerName: "X-Api-Key", headerValue: "k")
                == .authorization("Bearer a"))
        #expect(
            IdempotencyScope.client(authorization: nil, headerName: "X-Api-Key", headerValue: "k")
                == .header(name: "x-api-key", value: "k"))
        #expect(IdempotencyScope.client(authorization: nil, headerName: "X-Api-Key", headerValue: nil) == .anonymous)
        #expect(IdempotencyScope.client(authorization: nil, headerName: nil, headerValue: nil) == .anonymous)
    }

    @Test func scopesDifferByClientRouteAndUpstreamAndHideTheCredential() {
        let alice = IdempotencyScope.scope(route: "/hooks/", upstream: "h", client: .authorization("Bearer alice-token"))
        #expect(alice == IdempotencyScope.scope(route: "/hooks/", upstream: "h", client: .authorization("Bearer alice-token")))
        #expect(alice.count == 64 && !alice.contains("alice"))
        let others = [
            IdempotencyScope.scope(route: "/hooks/", upstream: "h", client: .authorization("Bearer bob-token")),
            IdempotencyScope.scope(route: "/other/", upstream: "h", client: .authorization("Bearer alice-token")),
            IdempotencyScope.scope(route: "/hooks/", upstream: "g", client: .authorization("Bearer alice-token")),
            IdempotencyScope.scope(
                route: "/hooks/", upstream: "h", client: .header(name: "authorization", value: "Bearer alice-token")),
            IdempotencyScope.scope(route: "/hooks/", upstream: "h", client: .anonymous),
        ]
        #expect(Set(others + [alice]).count == 6)
    }

    @Test func fieldBoundariesCannotBeShiftedToCollide() {
        // "ab" + "c" and "a" + "bc" must not hash alike.
        #expect(
            IdempotencyScope.scope(route: "ab", upstream: "c", client: .anonymous)
                != IdempotencyScope.scope(route: "a", upstream: "bc", client: .anonymous))
    }

    @Test func theFingerprintCoversMethodTargetAndBody() {
        let base = Self.body("{\"a\":1}") { IdempotencyScope.fingerprint(method: "POST", target: "/o?x=1", body: $0) }
        #expect(base == Self.body("{\"a\":1}") { IdempotencyScope.fingerprint(method: "POST", target: "/o?x=1", body: $0) })
        #expect(base != Self.body("{\"a\":2}") { IdempotencyScope.fingerprint(method: "POST", target: "/o?x=1", body: $0) })
        #expect(base != Self.body("{\"a\":1}") { IdempotencyScope.fingerprint(method: "PUT", target: "/o?x=1", body: $0) })
        #expect(base != Self.body("{\"a\":1}") { IdempotencyScope.fingerprint(method: "POST", target: "/o?x=2", body: $0) })
        #expect(
            IdempotencyScope.fingerprint(method: "POST", target: "/o", body: UnsafeRawBufferPointer(start: nil, count: 0))
                .count == 64)
    }
}
