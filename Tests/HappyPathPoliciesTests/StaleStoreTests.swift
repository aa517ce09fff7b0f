import HappyPathCore
import HappyPathPolicies
import Testing

/// What may be kept for `fallback.serve_stale`, as a table of answers and
/// the decision each must get.
@Suite struct StaleRulesTests {
    static func decide(
        _ fields: [String: String], status: Int = 200, method: String = "GET", credentials: Bool = false,
        serveStale: Duration = .seconds(600)
    ) -> StaleRules.Decision? {
        StaleRules.decide(
            method: method, status: status, fields: fields.map { HTTPField(name: $0.key, value: $0.value) },
            requestHasCredentials: credentials, serveStale: serveStale)
    }

    @Test(arguments: [200, 203, 204, 300, 301, 404, 410])
    func keptStatuses(status: Int) {
        #expect(Self.decide([:], status: status) == .init(keepFor: .seconds(600), varyNames: []))
    }

    @Test(arguments: [201, 202, 206, 302, 304, 307, 400, 401, 403, 429, 500, 503])
    func otherStatusesAreNotKept(status: Int) { #expect(Self.decide([:], status: status) == nil) }

    @Test(arguments: ["HEAD", "POST", "PUT", "DELETE", "OPTIONS"])
    func onlyGet(method: String) { #expect(Self.decide([:], method: method) == nil) }

    @Test(arguments: [
        ["Cache-Control": "no-store"], ["cache-control": "max-age=60, No-Store"], ["Cache-Control": "private"],
        ["Cache-Control": "private=\"Set-Cookie\", max-age=5"], ["Cache-Control": "no-cache"],
        ["Cache-Control": "no-cache=\"x\""], ["Set-Cookie": "a=b"], ["set-cookie": ""], ["Vary": "*"],
        ["Vary": "Accept, *"], ["Cache-Control": "stale-if-error=0"],
    ])
    func forbidden(fields: [String: String]) { #expect(Self.decide(fields) == nil, "\(fields)") }

    /// A quoted argument is read as one: a comma or `no-store` inside it is not a directive.
    @Test func quotedArgumentsAreNotDirectives() {
        #expect(Self.decide(["Cache-Control": "ext=\"no-store, private\", max-age=5"]) != nil)
        #expect(Self.decide(["Cache-Control": "ext=\"a\\\"no-store\", public"]) != nil)
    }

    @Test func staleIfErrorCapsTheTime() {
        #expect(Self.decide(["Cache-Control": "max-age=5, stale-if-error=30"])?.keepFor == .seconds(30))
        #expect(Self.decide(["Cache-Control": "stale-if-error=3600"])?.keepFor == .seconds(600))
        #expect(Self.decide(["Cache-Control": "stale-if-error=\"20\""])?.keepFor == .seconds(20))
        // Malformed: ignored, the route's time applies.
        #expect(Self.decide(["Cache-Control": "stale-if-error=soon"])?.keepFor == .seconds(600))
        #expect(Self.decide(["Cache-Control": "stale-if-error=-5"])?.keepFor == .seconds(600))
        #expect(Self.decide(["Cache-Control": "stale-if-error=99999999999999999999"])?.keepFor == .seconds(600))
    }

    @Test func varyNamesAreCollected() {
        #expect(Self.decide(["Vary": "Accept-Encoding, accept-language ,Accept-Encoding"])?.varyNames == ["accept-encoding", "accept-language"])
    }

    /// Linear in the field's size: a megabyte of commas and quotes is read once.
    @Test func largeValues() {
        let big = String(repeating: "a=\"x,y\", ", count: 100_000)
        #expect(Self.decide(["Cache-Control": big + "no-store"]) == nil)
        #expect(Self.decide(["Cache-Control": String(repeating: "\"", count: 100_001)]) != nil)
    }
}

/// The process's kept answers: variants, expiry, the byte bound and LRU
/// order, purge, on explicit instants.
@Suite struct StaleStoreTests {
    static let t0 = Instant(nanoseconds: 1_000_000_000)

    static func entry(
        _ body: String = "hello", path: String = "/catalog/a", vary: [String] = [], values: [String?] = [],
        expires: Duration = .seconds(60)
    ) -> StaleEntry {
        StaleEntry(
            status: 200, reason: nil, fields: [HTTPField(name: "Content-Type", value: "text/plain")], body: Array(body.utf8),
            receivedAt: t0, expiresAt: t0 + expires, varyNames: vary, varyValues: values, path: path)
    }

    static func none(_: String) -> String? { nil }

    @Test func keepThenLookup() {
        let store = StaleStore(maxBytes: 1 << 20, maxEntryBytes: 1 << 16)
        #expect(store.keep(Self.entry(), key: "u GET /a"))
        #expect(store.lookup(key: "u GET /a", at: Self.t0, requestValue: Self.none).map { String(decoding: $0.body, as: UTF8.self) } == "hello")
        #expect(store.lookup(key: "u GET /b", at: Self.t0, requestValue: Self.none) == nil)
        #expect(store.usage.entries == 1)
        // A newer answer replaces it.
        #expect(store.keep(Self.entry("newer"), key: "u GET /a"))
        #expect(store.usage.entries == 1)
        #expect(store.lookup(key: "u GET /a", at: Self.t0, requestValue: Self.none)?.body == Array("newer".utf8))
    }

    @Test func expiredAnswersAreNeverReturned() {
        let store = StaleStore(maxBytes: 1 << 20, maxEntryBytes: 1 << 16)
        store.keep(Self.entry(expires: .seconds(10)), key: "k")
        #expect(store.lookup(key: "k", at: Self.t0 + .seconds(9), requestValue: Self.none) != nil)
        #expect(store.lookup(key: "k", at: Self.t0 + .seconds(10), requestValue: Self.none) == nil)
        #expect(store.usage == (0, 0))
    }

    /// Variants under one key, told apart by the request's values of the
    /// `Vary` fields; an absent field matches only absent.
    @Test func varyVariants() {
        let store = StaleStore(maxBytes: 1 << 20, maxEntryBytes: 1 << 16)
        store.keep(Self.entry("gzip", vary: ["accept-encoding"], values: ["gzip"]), key: "k")
        store.keep(Self.entry("plain", vary: ["accept-encoding"], values: [nil]), key: "k")
        func body(_ value: String?) -> String? {
            store.lookup(key: "k", at: Self.t0, requestValue: { $0 == "accept-encoding" ? value : nil }).map {
                String(decoding: $0.body, as: UTF8.self)
            }
        }
        #expect(body("gzip") == "gzip")
        #expect(body(" gzip ") == "gzip")
        #expect(body(nil) == "plain")
        #expect(body("br") == nil)
        #expect(store.usage.entries == 2)
        // At most maxVariants under one key: the oldest goes.
        for i in 0..<StaleStore.maxVariants { store.keep(Self.entry("v\(i)", vary: ["x"], values: ["\(i)"]), key: "k") }
        #expect(store.usage.entries == StaleStore.maxVariants)
        #expect(body("gzip") == nil)
    }

    /// Replacing any one of a key's variants (the oldest, one between, the
    /// newest) leaves the others where a lookup finds them, and the key's
    /// list still drops its oldest at `maxVariants`.
    @Test(arguments: [0, 1, 2])
    func replacingAVariantKeepsTheOthers(replaced: Int) {
        let store = StaleStore(maxBytes: 1 << 20, maxEntryBytes: 1 << 16)
        for i in 0..<3 { store.keep(Self.entry("v\(i)", vary: ["x"], values: ["\(i)"]), key: "k") }
        store.keep(Self.entry("new", vary: ["x"], values: ["\(replaced)"]), key: "k")
        func body(_ value: String) -> String? {
            store.lookup(key: "k", at: Self.t0, requestValue: { $0 == "x" ? value : nil }).map {
                String(decoding: $0.body, as: UTF8.self)
            }
        }
        for i in 0..<3 { #expect(body("\(i)") == (i == replaced ? "new" : "v\(i)")) }
        #expect(store.usage.entries == 3)
        // The oldest now is the first of the others kept: it goes first.
        for i in 3..<(StaleStore.maxVariants + 1) { store.keep(Self.entry("v\(i)", vary: ["x"], values: ["\(i)"]), key: "k") }
        #expect(store.usage.entries == StaleStore.maxVariants)
        let oldest = replaced == 0 ? 1 : 0
        #expect(body("\(oldest)") == nil)
        #expect(body("\(replaced)") == "new")
    }

    @Test func tooLargeIsNotKeptAndDropsTheOutdatedVariant() {
        let store = StaleStore(maxBytes: 1 << 20, maxEntryBytes: 1024)
        #expect(store.keep(Self.entry("small"), key: "k"))
        #expect(!store.keep(Self.entry(String(repeating: "x", count: 2000)), key: "k"))
        #expect(store.lookup(key: "k", at: Self.t0, requestValue: Self.none) == nil)
        #expect(store.usage == (0, 0))
        #expect(!StaleStore(maxBytes: 0, maxEntryBytes: 1024).keep(Self.entry(), key: "k"))
    }

    /// 10,000 distinct answers through a small store: the bound holds after
    /// every one, and what survives is the most recently used.
    @Test func theByteBoundHoldsAndTheLeastRecentlyUsedGoFirst() {
        let store = StaleStore(maxBytes: 64 * 1024, maxEntryBytes: 4096)
        store.keep(Self.entry("keep me"), key: "hot")
        for i in 0..<10_000 {
            #expect(store.keep(Self.entry(String(repeating: "b", count: 200), path: "/p/\(i)"), key: "k\(i)"))
            if i % 10 == 0 { #expect(store.lookup(key: "hot", at: Self.t0, requestValue: Self.none) != nil) }
            let usage = store.usage
            if usage.bytes > 64 * 1024 { Issue.record("over the bound at \(i): \(usage.bytes)") }
        }
        #expect(store.lookup(key: "hot", at: Self.t0, requestValue: Self.none) != nil)  // used often: kept
        #expect(store.lookup(key: "k9999", at: Self.t0, requestValue: Self.none) != nil)  // newest: kept
        #expect(store.lookup(key: "k0", at: Self.t0, requestValue: Self.none) == nil)  // oldest: gone
        #expect(store.usage.bytes > 48 * 1024)
    }

    /// Everything an entry keeps counts against the bound: 10 times the
    /// bound in distinct 60 KiB `Vary` values (a `Vary: User-Agent` answer
    /// keeps the request's whole field) never holds more than the bound,
    /// counted or kept; nor do 60 KiB keys.
    @Test func varyValuesAndKeysCountAgainstTheBound() {
        let cap = 1 << 20
        let store = StaleStore(maxBytes: cap, maxEntryBytes: cap)
        let huge = 60 * 1024
        for i in 0..<(10 * cap / huge) {
            let agent = "\(i) " + String(repeating: "a", count: huge)
            store.keep(Self.entry("x", path: "/p/\(i)", vary: ["user-agent"], values: [agent]), key: "k\(i)")
            let usage = store.usage
            if usage.bytes > cap || usage.entries * huge > cap {
                Issue.record("after \(i + 1): \(usage.entries) entries of 60 KiB values counted as \(usage.bytes) bytes")
                break
            }
        }
        let keys = StaleStore(maxBytes: cap, maxEntryBytes: cap)
        for i in 0..<(10 * cap / huge) {
            keys.keep(Self.entry("x", path: "/p/\(i)"), key: "\(i) " + String(repeating: "k", count: huge))
            if keys.usage.bytes > cap || keys.usage.entries * huge > cap {
                Issue.record("after \(i + 1): \(keys.usage.entries) entries with 60 KiB keys")
                break
            }
        }
        // A Vary value larger than an entry may be: not kept.
        let small = StaleStore(maxBytes: cap, maxEntryBytes: 4096)
        let kept = small.keep(Self.entry("x", vary: ["user-agent"], values: [String(repeating: "a", count: 8192)]), key: "k")
        #expect(!kept)
        #expect(small.usage == (0, 0))
    }

    /// A body copied as it streamed may have room for twice its bytes:
    /// what is kept holds no more room than it counts.
    @Test func aKeptBodyHoldsWhatItCounts() throws {
        let store = StaleStore(maxBytes: 1 << 20, maxEntryBytes: 1 << 20)
        var body: [UInt8] = []
        body.reserveCapacity(256 * 1024)
        body.append(contentsOf: Array("hello".utf8))
        let entry = StaleEntry(
            status: 200, reason: nil, fields: [HTTPField(name: "Content-Type", value: "text/plain")], body: body,
            receivedAt: Self.t0, expiresAt: Self.t0 + .seconds(60), varyNames: [], varyValues: [], path: "/a")
        #expect(store.keep(entry, key: "k"))
        let kept = try #require(store.lookup(key: "k", at: Self.t0, requestValue: Self.none))
        #expect(kept.body == Array("hello".utf8))
        #expect(kept.body.capacity < 1024, "\(kept.body.capacity)")
        #expect(store.usage.bytes >= kept.body.capacity && store.usage.bytes < 2048, "\(store.usage.bytes)")
    }

    @Test func purgeByPathPrefix() {
        let store = StaleStore(maxBytes: 1 << 20, maxEntryBytes: 1 << 16)
        store.keep(Self.entry(path: "/catalog/a"), key: "1")
        store.keep(Self.entry(path: "/catalog/b"), key: "2")
        store.keep(Self.entry(path: "/other"), key: "3")
        let purged = store.purge(pathPrefix: "/catalog/")
        #expect(purged.entries == 2 && purged.bytes > 0)
        #expect(store.usage.entries == 1)
        #expect(store.lookup(key: "3", at: Self.t0, requestValue: Self.none) != nil)
        #expect(store.purge(pathPrefix: "/").entries == 1)
        #expect(store.usage == (0, 0))
        // Slots are reused after a purge.
        store.keep(Self.entry(), key: "4")
        #expect(store.lookup(key: "4", at: Self.t0, requestValue: Self.none) != nil)
    }
}

/// The route's try latencies for `hedge: { after: p95 }`.
@Suite struct LatencyWindowTests {
    static let t0 = Instant(nanoseconds: 100 * 1_000_000_000)

    @Test func tooFewSamples() {
        var w = LatencyWindow()
        for _ in 0..<19 { w.record(.milliseconds(5), at: Self.t0) }
        #expect(w.quantile(0.95, at: Self.t0) == nil)
        w.record(.milliseconds(5), at: Self.t0)
        #expect(w.quantile(0.95, at: Self.t0) != nil)
    }

    /// 95% at 10 ms, 5% at 1 s: p90 near 10 ms, p99 near 1 s, each within
    /// a bin's width (at most 25% above).
    @Test func bimodal() throws {
        var w = LatencyWindow()
        for i in 0..<1000 { w.record(i % 20 == 0 ? .seconds(1) : .milliseconds(10), at: Self.t0 + .milliseconds(i)) }
        let now = Self.t0 + .seconds(1)
        let p90 = try #require(w.quantile(0.90, at: now))
        #expect(p90 >= .milliseconds(10) && p90 <= .microseconds(12_500))
        let p99 = try #require(w.quantile(0.99, at: now))
        #expect(p99 >= .seconds(1) && p99 <= .milliseconds(1250))
    }

    @Test(arguments: [1, 999, 1024, 50_000, 3_000_000, 70_000_000_000] as [Int64])
    func theBinHoldsTheValue(nanoseconds: Int64) {
        var w = LatencyWindow()
        for _ in 0..<20 { w.record(.nanoseconds(nanoseconds), at: Self.t0) }
        let q = w.quantile(0.5, at: Self.t0)!
        if nanoseconds < 1024 {
            #expect(q <= .nanoseconds(1280))
        } else if nanoseconds < 1 << 36 {
            #expect(q >= .nanoseconds(nanoseconds))
            #expect(q.nanoseconds <= nanoseconds + nanoseconds / 4 + 1)
        } else {
            #expect(q >= .seconds(68))  // the last bin
        }
    }

    /// Samples older than the window are forgotten.
    @Test func oldSamplesAreForgotten() {
        var w = LatencyWindow(seconds: 10)
        for _ in 0..<100 { w.record(.seconds(2), at: Self.t0) }
        for _ in 0..<100 { w.record(.milliseconds(1), at: Self.t0 + .seconds(9)) }
        #expect(w.quantile(0.95, at: Self.t0 + .seconds(9))! >= .seconds(2))
        #expect(w.quantile(0.95, at: Self.t0 + .seconds(10))! <= .milliseconds(2))
        #expect(w.quantile(0.95, at: Self.t0 + .seconds(19)) == nil)
        // A bucket reused a window later starts from zero.
        w.record(.seconds(3), at: Self.t0 + .seconds(20))
        for _ in 0..<30 { w.record(.milliseconds(1), at: Self.t0 + .seconds(20)) }
        #expect(w.quantile(0.5, at: Self.t0 + .seconds(20))! <= .milliseconds(2))
    }
}
