import CTLS
import HappyPathConfig
import HappyPathCore
import HappyPathIO
import HappyPathPolicies

/// A worker's link to Redis (`cluster.redis`, docs/shaping.md "Shared
/// limits"): its command connection, on the worker's loop, that takes
/// `scope: cluster` tokens and publishes the pauses this worker learns;
/// and on the first worker, the heartbeat that counts replicas and the
/// subscriber that hears other replicas' pauses. When the link is down, a
/// request is decided at once by the limit's local share; when a command
/// outlives `timeout`, its request is decided then the same way. No
/// request waits longer than `timeout` for Redis, and none fails for it.
final class ClusterLink: RedisConnectionDelegate {
    /// Alive: the worker owns its link (`ProxyWorker.cluster`) and outlives it.
    unowned let worker: ProxyWorker
    let state: ClusterState
    private let connection: RedisConnection
    private var subscriber: RedisConnection?
    private var heartbeat: LoopTimer?
    private var wasUp = false
    /// Requests waiting for Redis's answer, owned here until it comes.
    private var asking: [ObjectIdentifier: ClusterAsk] = [:]
    private let gcraSHA: [UInt8]
    private static let evalsha = Array("EVALSHA".utf8)
    private static let one = Array("1".utf8)

    init(worker: ProxyWorker, state: ClusterState, first: Bool) throws(TLSSetupError) {
        self.worker = worker
        self.state = state
        let s = state.settings
        let retry = min(s.heartbeat, .seconds(1))
        let clock = worker.clock
        let tls = s.tls.map { UpstreamTLS(ca: $0.ca, verify: $0.verify, clientCert: nil, clientKey: nil) }
        connection = try RedisConnection(
            loop: worker.loop, endpoint: s.redis, timeout: s.timeout, retry: retry, clock: { clock.now() },
            greeting: [["SCRIPT", "LOAD", ClusterScript.gcra]], tls: tls)
        gcraSHA = Self.sha1Hex(ClusterScript.gcra)
        if first {
            // Subscribing waits on nobody: a slow greeting there holds no request.
            subscriber = try RedisConnection(
                loop: worker.loop, endpoint: s.redis, timeout: max(s.timeout, .seconds(1)), retry: retry,
                clock: { clock.now() }, greeting: [["SUBSCRIBE", ClusterScript.pausesChannel]], subscriber: true, tls: tls)
        }
        connection.delegate = self
        subscriber?.delegate = self
    }

    func start() {
        connection.start()
        subscriber?.start()
        if subscriber != nil { beat() }
    }

    func close() {
        heartbeat?.cancel()
        heartbeat = nil
        abandonAll()
        connection.close()
        subscriber?.close()
        subscriber = nil
    }

    // MARK: - Rate limits

    enum Verdict {
        /// Decided now: by a leased token, or by the local share (`limit` is the one that decided).
        case decided(RouteRateLimit.Decision, by: RouteRateLimit)
        /// Redis was asked; the link owns the request until it answers (or `timeout`).
        case asked
    }

    /// A request on a `scope: cluster` route. `target` nil: a head whose body is read after its turn.
    func admit(
        _ request: HTTPRequest, route: RuntimeRoute, limit: RouteRateLimit, cluster: ClusterRouteLimit,
        key: RateLimitBucketKey, target: String?, at now: Instant
    ) -> Verdict {
        let want: Int
        switch cluster.take(key, at: now) {
        case let .token(left):
            return .decided(.pass(fields: limit.fields(remaining: left, untilFullNs: 0)), by: limit)
        case let .ask(n):
            want = n
        }
        guard connection.isReady else {
            cluster.answered(wanted: want, granted: 0, for: key, at: now)
            return local(limit, cluster, key, at: now)
        }
        let ask = ClusterAsk(
            link: self, request: request, route: route, limit: limit, key: key, target: target, want: want, at: now)
        // Booked before it is sent: its answer may come back no sooner than
        // the loop's next pass, but the books must hold whatever happens.
        asking[ObjectIdentifier(ask)] = ask
        worker.shared.inFlight.add(1)
        request.observer = ask
        let sent = connection.send(
            [
                Self.evalsha, gcraSHA, Self.one, cluster.bucketKey(key), cluster.interval, cluster.capacity,
                want == 1 ? ClusterRouteLimit.wantOne : cluster.wantLease, cluster.maxWait,
            ]
        ) { [weak ask] result in ask?.answered(result) }
        guard sent else {
            asking[ObjectIdentifier(ask)] = nil
            worker.shared.inFlight.add(-1)
            request.observer = nil
            cluster.answered(wanted: want, granted: 0, for: key, at: now)
            return local(limit, cluster, key, at: now)
        }
        return .asked
    }

    private func local(_ limit: RouteRateLimit, _ cluster: ClusterRouteLimit, _ key: RateLimitBucketKey, at now: Instant)
        -> Verdict
    {
        let share = cluster.localShare(replicas: state.replicas)
        return .decided(share.admit(key: key, at: now), by: share)
    }

    /// Redis answered `ask` (or did not in time): its decision goes to the gate.
    fileprivate func answered(_ ask: ClusterAsk, _ result: RedisResult) {
        guard asking.removeValue(forKey: ObjectIdentifier(ask)) != nil else { return }
        worker.shared.inFlight.add(-1)
        let now = worker.clock.now()
        state.rtt.recordNanoseconds((now - ask.askedAt).nanoseconds)
        guard let cluster = ask.limit.cluster else { return }
        if ask.gone {
            // Its client left: what Redis granted is not kept (the fleet admits less, never more).
            cluster.answered(wanted: ask.want, granted: 0, for: ask.key, at: now)
            return ask.request.abort()
        }
        ask.request.observer = nil
        switch result {
        case let .reply(reply):
            if let grant = ClusterGrant(reply, want: ask.want) {
                // A reserved token (a wait) is the request's own, never a lease's.
                cluster.answered(wanted: ask.want, granted: grant.wait == .zero ? grant.granted : 0, for: ask.key, at: now)
                return worker.gate.decided(
                    Self.decision(grant, ask.limit), limit: ask.limit, request: ask.request,
                    route: ask.route, key: ask.key, target: ask.target, at: now)
            }
            state.error(kind: reply.isError ? "reply_error" : "bad_reply")
            // A script cache emptied under this connection (SCRIPT FLUSH, a proxy
            // that kept the connection across a failover): connect again, and the greeting loads it.
            if case let .error(e) = reply, e.hasPrefix("NOSCRIPT") { connection.drop("Redis no longer has the rate-limit script") }
        case .timedOut:
            state.error(kind: "timeout")
        case .failed:
            break  // the connection's loss is counted once, in `redisDown`
        }
        cluster.answered(wanted: ask.want, granted: 0, for: ask.key, at: now)
        let share = cluster.localShare(replicas: state.replicas)
        worker.gate.decided(
            share.admit(key: ask.key, at: now), limit: share, request: ask.request, route: ask.route, key: ask.key,
            target: ask.target, at: now)
    }

    /// The script's grant as the gate's decision; extra tokens go to the lease.
    static func decision(_ grant: ClusterGrant, _ limit: RouteRateLimit) -> RouteRateLimit.Decision {
        let untilFull = grant.untilFull.nanoseconds
        // Reserved in Redis for then (`grant.wait`): it waits in this process's queue (no ticket: nobody
        // moves up here), never longer than its own `max_wait` whatever the answer said, and only if
        // `max_queue` has room.
        let waits = grant.wait > .zero
        guard grant.granted > 0, !waits || (grant.wait <= limit.maxWait && limit.takeQueuePlace()) else {
            return .refuse(
                retryAfterSeconds: RouteRateLimit.seconds(grant.wait.nanoseconds),
                fields: limit.fields(remaining: 0, untilFullNs: untilFull))
        }
        if waits { return .wait(grant.wait, ticket: 0) }
        return .pass(fields: limit.fields(remaining: grant.remaining + grant.granted - 1, untilFullNs: untilFull))
    }

    /// The worker shuts down: asking requests are dropped, unanswered.
    func abandonAll() {
        for ask in asking.values { ask.abandon() }
        worker.shared.inFlight.add(-asking.count)
        asking.removeAll()
    }

    // MARK: - Pauses

    /// This worker learned a pause (an upstream's answer): every replica hears it.
    func publishPause(upstream: String, status: Int, until: Instant, client: String?) {
        guard connection.isReady else { return }
        let now = worker.clock.now()
        let untilMs = worker.clock.wallMilliseconds() + max(0, (until - now).nanoseconds / 1_000_000)
        // The client's key as its digest: every replica computes the same, and Redis never holds an API key.
        let heard = client.map { ClusterScript.heardKey($0) } ?? ""
        let payload = Array("\(state.replicaID)\n\(upstream)\n\(status)\n\(untilMs)\n\(heard)".utf8)
        let report: (RedisResult) -> Void = { [state] result in
            if case .reply(let r) = result, r.isError { state.error(kind: "reply_error") }
        }
        // Kept until its end, for a replica that reconnects meanwhile (`catchUp`); then told to those listening.
        let key = Array("\(ClusterScript.prefix)pause:{\(upstream)}:\(heard)".utf8)
        connection.send([Array("SET".utf8), key, payload, Array("PXAT".utf8), Array(String(untilMs).utf8)], report)
        connection.send([Array("PUBLISH".utf8), Array(ClusterScript.pausesChannel.utf8), payload], report)
    }

    /// The subscriber and the command link are up (again): pauses published while it was away are
    /// read from their keys, a bounded batch at a time (at most
    /// `catchUpRounds` × 1,000 keys), and applied as if heard.
    private func catchUp(cursor: String = "0", round: Int = 0) {
        guard round < Self.catchUpRounds, connection.isReady else { return }
        connection.send(
            [Array("SCAN".utf8), Array(cursor.utf8), Array("MATCH".utf8), Array("\(ClusterScript.prefix)pause:*".utf8),
             Array("COUNT".utf8), Array("1000".utf8)]
        ) { [weak self] result in
            guard let self, case let .reply(reply) = result, let parts = reply.elements, parts.count == 2,
                let next = parts[0].text, next.utf8.count <= 20, let keys = parts[1].elements
            else { return }
            let names = keys.compactMap { k -> [UInt8]? in
                if case let .string(b) = k { return b }
                return nil
            }
            if !names.isEmpty {
                self.connection.send([Array("MGET".utf8)] + names) { [weak self] result in
                    guard let self, case let .reply(values) = result, let items = values.elements else { return }
                    for case let .string(payload) in items { self.heard(payload) }
                }
            }
            if next != "0" { self.catchUp(cursor: next, round: round + 1) }
        }
    }

    /// SCAN rounds at most after a reconnect (1,000 keys each asked for).
    static let catchUpRounds = 100

    /// Another replica's pause: applied to this process's guard of that upstream.
    private func heard(_ payload: [UInt8]) {
        let parts = payload.split(separator: UInt8(ascii: "\n"), maxSplits: 4, omittingEmptySubsequences: false)
        guard parts.count == 5 else { return }
        let from = String(decoding: parts[0], as: UTF8.self)
        guard from != state.replicaID else { return }
        let upstream = String(decoding: parts[1], as: UTF8.self)
        guard parts[2].count <= 3, let status = Int(String(decoding: parts[2], as: UTF8.self)),
            parts[3].count <= 15, let untilMs = Int64(String(decoding: parts[3], as: UTF8.self)),
            let guardian = worker.shared.guards.first(where: { $0.name == upstream })
        else { return }
        let client = parts[4].isEmpty ? "" : String(decoding: parts[4], as: UTF8.self)
        let waitMs = untilMs - worker.clock.wallMilliseconds()
        guard waitMs > 0, waitMs <= 86_400_000 else { return }
        let now = worker.clock.now()
        if case let .paused(until, nil) = guardian.heardPause(
            status: status, wait: .milliseconds(waitMs), client: client, at: now)
        {
            worker.shared.paused(guardian, until: until)
        }
    }

    // MARK: - Heartbeat

    private func beat() {
        let s = state.settings
        if connection.isReady {
            connection.send(
                [
                    Array("EVAL".utf8), Array(ClusterScript.heartbeat.utf8), Self.one, Array(ClusterScript.replicasKey.utf8),
                    Array(state.replicaID.utf8), Array(String(s.heartbeat.nanoseconds / 1_000_000).utf8),
                ]
            ) { [state] result in
                if case let .reply(r) = result, let n = r.integer { state.counted(replicas: Int(n)) }
            }
        }
        heartbeat = worker.loop.schedule(after: s.heartbeat) { [weak self] in self?.beat() }
    }

    // MARK: - RedisConnectionDelegate

    func redisUp(_ c: RedisConnection, restored: Bool) {
        if c === connection {
            wasUp = true
            state.linkUp()
        }
        // Both up (in either order): what was published while this replica could not hear.
        if let subscriber, subscriber.health == .up, connection.isReady { catchUp() }
    }

    func redisDown(_ c: RedisConnection, reason: String) {
        guard c === connection else { return }
        state.error(kind: "connection")
        state.linkDown(wasUp: wasUp, reason: reason)
        wasUp = false
    }

    func redisMessage(_ c: RedisConnection, channel: String, payload: [UInt8]) {
        guard channel == ClusterScript.pausesChannel else { return }
        heard(payload)
    }

    /// `SHA1(script)` in hex, the name `EVALSHA` takes (Redis names a loaded script so).
    static func sha1Hex(_ text: String) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 20)
        let bytes = Array(text.utf8)
        bytes.withUnsafeBytes { b in digest.withUnsafeMutableBufferPointer { hp_sha1(b.baseAddress, b.count, $0.baseAddress) } }
        let hex = Array("0123456789abcdef".utf8)
        return digest.flatMap { [hex[Int($0 >> 4)], hex[Int($0 & 15)]] }
    }
}

/// A request on a `scope: cluster` route waiting for Redis's answer (at
/// most `cluster.redis.timeout`). A client that goes away is noticed; the
/// request is dropped when the answer comes.
final class ClusterAsk: HTTPRequestObserver {
    /// Alive: the link owns its asks (`asking`) until they are answered or abandoned.
    unowned let link: ClusterLink
    let request: HTTPRequest
    let route: RuntimeRoute
    let limit: RouteRateLimit
    let key: RateLimitBucketKey
    let target: String?
    /// Tokens asked for (a lease, or one).
    let want: Int
    let askedAt: Instant
    private(set) var gone = false
    private var abandoned = false

    init(
        link: ClusterLink, request: HTTPRequest, route: RuntimeRoute, limit: RouteRateLimit, key: RateLimitBucketKey,
        target: String?, want: Int, at now: Instant
    ) {
        self.link = link
        self.want = want
        self.request = request
        self.route = route
        self.limit = limit
        self.key = key
        self.target = target
        askedAt = now
    }

    func answered(_ result: RedisResult) {
        guard !abandoned else { return }
        link.answered(self, result)
    }

    func requestClientClosed(_ request: HTTPRequest) { gone = true }
    func requestOutputDrained(_ request: HTTPRequest) {}

    func abandon() {
        guard !abandoned else { return }
        abandoned = true
        request.observer = nil
        request.abort()
    }
}
