import HappyPathCore

/// One group of identical requests sharing a try (`coalesce:`,
/// docs/coalescing.md), as a pure state machine: who leads, who follows in
/// what order and until when, and what each gets when the leader's try
/// ends. Members are small integers the driver (`CoalesceGroup`) hands out;
/// time is passed in.
///
/// ```
///  leader's start ▶ waiting ─ join / leave / deadline ─▶ waiting
///                     │  ╲─ leaderEnded(.handOver) ▶ promote the first follower with time left ▶ waiting
///                     │  ╲─ leaderEnded(.share) ▶ every follower answers the same failure ▶ ended
///                     ╰─ share(keeping:) ▶ sharing (the answer streams to those kept) ─ finished ▶ ended
/// ```
///
/// A follower never waits on a timer of the group's: only its own deadline
/// (`leave`), and a leader that ends for reasons of its own hands over at
/// once.
public struct CoalesceGroupStateMachine: Sendable {
    public typealias Member = Int

    public enum State: Sendable, Equatable {
        /// No answer yet; identical requests may join.
        case waiting
        /// The leader's answer streams to the members kept; nobody joins any more.
        case sharing
        /// Over.
        case ended
    }

    public struct Follower: Sendable, Equatable {
        public var id: Member
        public var deadline: Instant
        public init(_ id: Member, deadline: Instant) {
            self.id = id
            self.deadline = deadline
        }
    }

    public let maxFollowers: Int
    /// A follower leads a new try only with at least this long left of its
    /// own time: one with less would send a try bound to fail, and the next
    /// after it another. Those with less follow the new leader, and their
    /// own deadlines answer them.
    public static let minimumTimeToLead: Duration = .milliseconds(50)
    public private(set) var state = State.waiting
    public private(set) var leader: Member
    /// In arrival order, with the places of those who left empty (a leave
    /// costs no search and no shift; compacted once mostly empty).
    private var queue: [Follower?] = []
    /// Where each follower stands in `queue`.
    private var place: [Member: Int] = [:]
    /// The followers, in arrival order.
    public var followers: [Follower] { queue.compactMap { $0 } }
    public var followerCount: Int { place.count }
    /// Followers that took the leader's answer or failure so far (the group
    /// size is this plus its leader).
    public private(set) var served = 0

    public init(leader: Member, maxFollowers: Int) {
        self.leader = leader
        self.maxFollowers = maxFollowers
    }

    public enum Join: Sendable, Equatable {
        case follow
        /// The group is full (or no longer waiting): the request goes on its own.
        case alone
    }

    /// An identical request arrived.
    public mutating func join(_ id: Member, deadline: Instant) -> Join {
        guard state == .waiting, place.count < maxFollowers, place[id] == nil else { return .alone }
        place[id] = queue.count
        queue.append(Follower(id, deadline: deadline))
        return .follow
    }

    /// A follower left before any answer: its client hung up, its own
    /// deadline passed, or drain answered it. False: it was no follower.
    @discardableResult
    public mutating func leave(_ id: Member) -> Bool {
        guard let i = place.removeValue(forKey: id) else { return false }
        queue[i] = nil
        if queue.count > 16, queue.count > 2 * place.count { compact() }
        return true
    }

    private mutating func compact() {
        queue = queue.filter { $0 != nil }
        place = [:]
        for (i, follower) in queue.enumerated() { place[follower!.id] = i }
    }

    private mutating func removeAllFollowers() {
        queue = []
        place = [:]
    }

    public enum Verdict: Sendable, Equatable {
        /// Each of these followers answers the leader's failure as its own; the group ended.
        case answerAll([Member])
        /// `leader` leads a new try, the others follow it; `expired` (their
        /// deadlines passed in the same moment) answer `.timeout`.
        case promote(leader: Member, expired: [Member])
        /// Every follower's deadline passed too: each answers `.timeout`; the group ended.
        case expireAll([Member])
        /// Nobody followed: the group ended.
        case ended
    }

    /// The leader ended without an answer to stream (`CoalesceRules.afterLeader`).
    public mutating func leaderEnded(_ after: CoalesceRules.AfterLeader, at now: Instant) -> Verdict {
        guard state == .waiting else { return .ended }
        switch after {
        case .share:
            state = .ended
            let all = followers.map(\.id)
            served += all.count
            removeAllFollowers()
            return all.isEmpty ? .ended : .answerAll(all)
        case .handOver:
            let waiting = followers
            let expired = waiting.filter { $0.deadline <= now }.map(\.id)
            let living = waiting.filter { $0.deadline > now }
            // The first with time enough to lead; else the one with the most.
            guard
                let next = living.firstIndex(where: { $0.deadline - now >= Self.minimumTimeToLead })
                    ?? living.indices.max(by: { living[$0].deadline < living[$1].deadline })
            else {
                state = .ended
                removeAllFollowers()
                return waiting.isEmpty ? .ended : .expireAll(expired)
            }
            leader = living[next].id
            queue = living.enumerated().filter { $0.offset != next }.map { $0.element }
            place = [:]
            for (i, follower) in queue.enumerated() { place[follower!.id] = i }
            return .promote(leader: leader, expired: expired)
        }
    }

    /// The leader's answer head is final: the followers `keep` says take
    /// it (in arrival order), the others are released to their own tries.
    /// The group leaves the table: later arrivals start another.
    public mutating func share(keeping keep: (Member) -> Bool) -> (shared: [Member], released: [Member]) {
        guard state == .waiting else { return ([], []) }
        state = .sharing
        var shared: [Member] = []
        var released: [Member] = []
        for follower in followers {
            if keep(follower.id) { shared.append(follower.id) } else { released.append(follower.id) }
        }
        removeAllFollowers()
        served += shared.count
        return (shared, released)
    }

    /// The shared answer is over for every member.
    public mutating func finished() { state = .ended }

    /// Requests this group's answer or failure served, its leader included.
    public var size: Int { served + 1 }
}
