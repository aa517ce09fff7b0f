import HappyPathCore
import HappyPathPolicies

/// This worker's coalescing groups (`coalesce:`, docs/coalescing.md): one
/// per key while its leader's try has no answer yet. Everything here runs
/// on the worker's loop, so the table is a plain dictionary: at most one
/// try per key per worker is out at a time.
final class Coalescing {
    /// Groups that identical requests may still join, by key.
    private var open: [GroupKey: CoalesceGroup] = [:]
    /// Keys whose last answer said `Cache-Control: no-store`, until when:
    /// requests under them go alone at once instead of waiting for a head
    /// that will not be shared. At most `noStoreKeys`, the oldest dropped.
    private var noStore: [GroupKey: Instant] = [:]
    private var noStoreOrder: [GroupKey] = []
    static let noStoreKeys = 4096
    static let noStoreFor: Duration = .seconds(10)
    /// Mixed into every credential hash of a key: made once per process,
    /// never leaves it.
    static let salt: [UInt8] = {
        var random = SystemRandomNumberGenerator()
        return (0..<32).map { _ in UInt8.random(in: 0...255, using: &random) }
    }()

    /// `limits.connection_buffer`: how far a member may fall behind the fastest before it is cut.
    let bound: Int
    /// `limits.read_ahead`: an answer announced longer is not shared.
    let largeAbove: Int
    let metrics: WorkerMetrics
    /// The process's `coalesced` pool: what the groups' buffers keep.
    let memory: MemoryPool

    init(bound: Int, largeAbove: Int, metrics: WorkerMetrics, memory: MemoryPool) {
        self.bound = bound
        self.largeAbove = largeAbove
        self.metrics = metrics
        self.memory = memory
    }

    enum Role {
        /// The first with this key: it sends the try, and leads `group`.
        case lead(CoalesceGroup)
        /// It follows `group`'s leader as `member`.
        case follow(CoalesceGroup, member: Int)
        /// It goes on its own try.
        case alone(CoalesceRules.AloneReason)
    }

    func join(_ exchange: Exchange, key text: String, deadline: Instant, now: Instant) -> Role {
        let key = GroupKey(text)
        if let group = open[key] {
            let member = group.nextMember()
            switch group.machine.join(member, deadline: deadline) {
            case .follow:
                group.members[member] = exchange
                return .follow(group, member: member)
            case .alone:
                // Full: this request leads the next group for the key (the
                // full one goes on, off the table), so a herd of any size
                // reaches the upstream as one try per max_followers + 1.
                metrics.coalesceAlone(route: exchange.route.label, .full)
                let next = CoalesceGroup(key: key, table: self, leader: exchange, route: exchange.route)
                group.key = nil
                open[key] = next
                return .lead(next)
            }
        }
        if !noStore.isEmpty, let until = noStore[key] {
            if until > now { return .alone(.noStore) }
            noStore[key] = nil
        }
        let group = CoalesceGroup(key: key, table: self, leader: exchange, route: exchange.route)
        open[key] = group
        return .lead(group)
    }

    /// A group stopped taking new members (its answer is shared, or it ended).
    func close(_ group: CoalesceGroup) {
        guard let key = group.key else { return }
        group.key = nil
        // One look-up: the table holds this group under its key (a full
        // group's key was taken by the next, and set to nil then).
        open[key] = nil
    }

    /// The key's answer said `no-store`: its requests go alone for a while.
    func rememberNoStore(_ key: GroupKey, now: Instant) {
        if noStore[key] == nil {
            if noStoreOrder.count >= Self.noStoreKeys {
                // Forget the oldest half (expired or not: a forgotten key only
                // waits for one more head before it is remembered again).
                let drop = noStoreOrder.count / 2
                for old in noStoreOrder[..<drop] { noStore[old] = nil }
                noStoreOrder.removeFirst(drop)
            }
            noStoreOrder.append(key)
        }
        noStore[key] = now + Self.noStoreFor
    }
}

/// One group: its leader's exchange, its followers' (by member number), and
/// the pure machine that decides what each gets (`CoalesceGroupStateMachine`).
final class CoalesceGroup {
    /// Its key while it is in the table (nil: closed, or a regroup made off the table).
    var key: GroupKey?
    unowned let table: Coalescing
    let route: RuntimeRoute
    var machine: CoalesceGroupStateMachine
    /// The leader's exchange (weak: the worker keeps it while it leads).
    weak var leading: Exchange?
    /// Its followers' exchanges, by member number (none made for a leader alone).
    var members: [Int: Exchange] = [:]
    private var lastMember = 0

    init(key: GroupKey?, table: Coalescing, leader: Exchange, route: RuntimeRoute) {
        self.key = key
        self.table = table
        self.route = route
        machine = CoalesceGroupStateMachine(leader: 0, maxFollowers: route.coalesce?.maxFollowers ?? 1)
        leading = leader
    }

    func nextMember() -> Int {
        lastMember += 1
        return lastMember
    }

    var hasFollowers: Bool { machine.followerCount > 0 }

    /// The worker is shutting down: every link to an exchange goes.
    func forget() {
        members = [:]
        leading = nil
    }

    /// A follower left before any answer (its client, its deadline, drain).
    func leave(_ member: Int) {
        guard machine.leave(member) else { return }
        members[member] = nil
    }

    /// What an answer (its head, or a held one) means for the followers:
    /// which take it, and why the others go on their own.
    struct Sharing {
        /// Whether a follower takes it.
        let keeps: (Int) -> Bool
        /// Why nobody else takes it (nil: those `keeps` refuses differ in `vary`).
        let reason: CoalesceRules.AloneReason?
        /// The request fields the answer varies on.
        let vary: [String]
    }

    func sharing(_ verdict: CoalesceRules.HeadVerdict, leader: Exchange, now: Instant) -> Sharing {
        switch verdict {
        case let .release(reason):
            if reason == .noStore, let key { table.rememberNoStore(key, now: now) }
            return Sharing(keeps: { _ in false }, reason: reason, vary: [])
        case let .share(vary):
            guard !vary.isEmpty else { return Sharing(keeps: { _ in true }, reason: nil, vary: []) }
            let values = vary.map { leader.requestValues($0) }
            return Sharing(
                keeps: { [members] in members[$0].map { f in vary.map { f.requestValues($0) } == values } ?? false },
                reason: nil, vary: vary)
        }
    }

    /// The followers an answer does not serve: each set with the same
    /// `Vary` values leads and follows anew; with a reason, each alone.
    func release(_ released: [Int], _ sharing: Sharing, now: Instant) {
        var sets: [[String?]: [Exchange]] = [:]
        var order: [[String?]] = []
        for member in released {
            guard let follower = members.removeValue(forKey: member) else { continue }
            follower.coalesce = nil
            if let reason = sharing.reason {
                table.metrics.coalesceAlone(route: route.label, reason)
                CoalesceGroup.regroup([follower], table: table, route: route, now: now)
                continue
            }
            let values = sharing.vary.map { follower.requestValues($0) }
            if sets[values] == nil { order.append(values) }
            sets[values, default: []].append(follower)
        }
        for values in order { CoalesceGroup.regroup(sets[values] ?? [], table: table, route: route, now: now) }
    }

    /// A group made of followers released together (the same `Vary`
    /// values): its first leads a new try, the others follow it.
    static func regroup(_ exchanges: [Exchange], table: Coalescing, route: RuntimeRoute, now: Instant) {
        guard let first = exchanges.first else { return }
        let group = CoalesceGroup(key: nil, table: table, leader: first, route: route)
        for follower in exchanges.dropFirst() {
            let member = group.nextMember()
            _ = group.machine.join(member, deadline: follower.machine.settings.deadline)
            group.members[member] = follower
            follower.coalesce = CoalesceMembership(group: group, member: member)
        }
        first.coalesce = CoalesceMembership(group: group, member: 0)
        first.leadAfterFollowing(now: now)
    }
}

/// A group's key with its hash worked out once (`HashedKey`): a request's
/// key is looked up, filed and let go (three hashes of a string of some 50
/// to 200 bytes otherwise), and a `no-store` key is remembered.
typealias GroupKey = HashedKey

/// An exchange's place in a group (`Exchange.coalesce`).
struct CoalesceMembership {
    let group: CoalesceGroup
    let member: Int
    /// The leader's answer this member reads (nil: none is shared yet).
    var answer: CoalescedAnswer?

    var leads: Bool { group.machine.leader == member }
}
