import HappyPathCore
import HappyPathIO
import HappyPathPolicies

/// A leader's answer given to every member of its group (`coalesce:`,
/// docs/coalescing.md): the third `ExchangeClient`. The leader's relay
/// writes to it as to its own client; it passes everything to that client
/// (member 0), records the head for the followers, and fans the body out
/// from one `FanOutBuffer`: the bytes are kept once, each member reads from
/// its own cursor, at its own pace.
///
/// - **The head** goes to the followers with the first body bytes (or the
///   end of an empty answer): until then the leader may still go back to
///   trying (a streamed head is staged). The verdict (`CoalesceRules.head`)
///   is taken then: `Vary`, `no-store`, `Set-Cookie`, an event stream, a
///   large answer; the followers it does not serve go on their own tries.
/// - **The pace** is the fastest member's: the upstream pauses only when no
///   member has room for more (each has its own connection buffer and
///   read-ahead first), and goes on when one drains.
/// - **The bound.** A member more than `limits.connection_buffer` behind
///   the fastest is cut (a truncated answer), so the group holds at most
///   that much, plus one piece.
final class CoalescedAnswer: ExchangeClient {
    let group: CoalesceGroup
    /// The leader's exchange, while it lives (the worker keeps it until its
    /// try ends, its client's request until it has read the answer): weak,
    /// so that no cycle outlives a group that never ended (a shutdown).
    private(set) weak var leader: Exchange?
    /// The leader's own client (member 0).
    private let leaderClient: any ExchangeClient
    private var buffer: FanOutBuffer
    /// Members reading, by number: their exchanges (nil for member 0, the leader's client).
    private var readers: [Int: Exchange?] = [0: nil]
    /// The leader's client left mid-answer: the try went on for the others.
    private(set) var leaderClientGone = false

    // The head, as the leader's client got it (without the proxy's own fields).
    private(set) var status = 0
    private(set) var contentLength: Int?
    private(set) var reason: [UInt8]?
    private(set) var fields = KeptFields()
    private var trailers = KeptFields()
    private var readsAhead = false
    /// `endReply` came: members end as they reach the end.
    private var ended = false
    /// The relay waits for room (the upstream transfer is paused).
    private var relayWaits = false
    /// What `buffer` keeps, as last counted in the `coalesced` pool.
    private var counted = 0

    init(group: CoalesceGroup, leader: Exchange) {
        self.group = group
        self.leader = leader
        leaderClient = leader.request
        buffer = FanOutBuffer(bound: group.table.bound)
        buffer.add(0)
    }

    // MARK: - What the relay reads of the request: the leader's.

    var observer: HTTPRequestObserver? {
        get { leaderClient.observer }
        set {}
    }
    func header(_ name: String) -> String? { leaderClient.header(name) }
    func forEachRawHeader(_ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) -> Void) {
        leaderClient.forEachRawHeader(body)
    }
    var protocolName: StaticString { leaderClient.protocolName }
    var isRefusedGRPCCall: Bool { false }
    var grpcWeb: GRPCWeb.Mode? { nil }
    var pendingOutput: Int { leaderClient.pendingOutput }

    // MARK: - The head

    func clearResponseHeaders() {
        if !leaderClientGone { leaderClient.clearResponseHeaders() }
        fields.removeAll(keepingCapacity: true)
        status = 0
    }

    func addResponseHeader(_ name: String, _ value: String) {
        if !leaderClientGone { leaderClient.addResponseHeader(name, value) }
        // The proxy's own fields are each member's own.
        if Self.isMembersOwn(name) { return }
        var name = name
        var value = value
        name.withUTF8 { n in value.withUTF8 { v in _ = fields.append(name: UnsafeRawBufferPointer(n), value: UnsafeRawBufferPointer(v)) } }
    }

    func addResponseHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        if !leaderClientGone { leaderClient.addResponseHeader(name: name, value: value) }
        // The leader's RateLimit fields come this way (`RateLimitFields.stage`).
        if Self.isMembersOwn(name) { return }
        _ = fields.append(name: name, value: value)
    }

    /// The proxy's own fields, each member's own: never copied to another.
    static func isMembersOwn(_ name: String) -> Bool {
        var name = name
        return name.withUTF8 { isMembersOwn(UnsafeRawBufferPointer($0)) }
    }

    static func isMembersOwn(_ name: UnsafeRawBufferPointer) -> Bool {
        switch name.count {
        case 9: HTTPBytes.equals(name, "ratelimit")
        case 12: HTTPBytes.equals(name, "x-request-id")
        case 16: HTTPBytes.equals(name, "ratelimit-policy")
        case 20: HTTPBytes.equals(name, "x-happypath-attempts")
        default: false
        }
    }

    func removeResponseHeaders(nominatedBy connectionValue: UnsafeRawBufferPointer) {
        if !leaderClientGone { leaderClient.removeResponseHeaders(nominatedBy: connectionValue) }
        var named = Set<[UInt8]>()
        forEachListElement(connectionValue) { named.insert($0.map(HTTPBytes.lower)) }
        fields = fields.filtered { name, _ in !named.contains(name.map(HTTPBytes.lower)) }
    }

    func addResponseTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        if !leaderClientGone { leaderClient.addResponseTrailer(name: name, value: value) }
        _ = trailers.append(name: name, value: value)
    }

    func startReply(status: Int, contentLength: Int?, reason: [UInt8]?) {
        if !leaderClientGone { leaderClient.startReply(status: status, contentLength: contentLength, reason: reason) }
        self.status = status
        self.contentLength = contentLength
        self.reason = reason
    }

    func sendInformational(status: Int, fields: UnsafeRawBufferPointer) {
        if !leaderClientGone { leaderClient.sendInformational(status: status, fields: fields) }
    }

    func permitReadAhead() {
        readsAhead = true
        if !leaderClientGone { leaderClient.permitReadAhead() }
    }

    /// A whole answer of the proxy's: the leader's client's only (never used on a shared answer).
    func reply(status: Int, headers: [HTTPField], body: String?) {
        if !leaderClientGone { leaderClient.reply(status: status, headers: headers, body: body) }
    }

    /// The head is final (the first body bytes, or the end): the verdict
    /// was taken, and each follower it serves has its head.
    private(set) var headShared = false

    private func shareHead() {
        guard !headShared, let leader else { return }
        headShared = true
        let now = leader.env.clock.now()
        // A HEAD's length is its GET's: no body follows it.
        let length = leader.command.method == "HEAD" ? nil : contentLength
        let verdict = CoalesceRules.head(fields: fields, contentLength: length, largeAbove: group.table.largeAbove)
        let sharing = group.sharing(verdict, leader: leader, now: now)
        let (shared, released) = group.machine.share(keeping: sharing.keeps)
        group.table.close(group)
        for member in shared {
            guard let follower = group.members[member] else { continue }
            readers[member] = follower
            buffer.add(member)
            follower.followerShares(self, member: member, leader: leader)
        }
        group.release(released, sharing, now: now)
    }

    // MARK: - The body

    /// The fastest member's room: past it, the upstream pauses.
    var outputRoom: Int {
        var best = Int.min
        for (member, reader) in readers {
            let client: any ExchangeClient = reader?.request ?? leaderClient
            let room = client.outputRoom - (buffer.behind(member) ?? 0)
            if room > best { best = room }
        }
        // Nobody reads any more: the answer runs out unread.
        return best == Int.min ? Int.max : best
    }

    func send(_ bytes: UnsafeRawBufferPointer, notifyWhenDrained: Bool) {
        if !headShared {
            // The relay asking to be told when the leader's client drains:
            // no byte went out yet, and the leader may still try again.
            guard !bytes.isEmpty else {
                if notifyWhenDrained { relayWaits = true }
                return leaderClient.send(bytes, notifyWhenDrained: notifyWhenDrained)
            }
            shareHead()
        }
        if !bytes.isEmpty { buffer.append(bytes) }
        for member in Array(readers.keys) { pump(member) }
        cutLaggards()
        account()
        // The relay waits for a drain. A member with room left will not
        // send one (it asked for none): the upstream goes on next pass.
        if notifyWhenDrained {
            relayWaits = true
            if outputRoom > 0 { resumeNextPass() }
        }
    }

    private func resumeNextPass() {
        guard let leader else { return }
        leader.env.loop.schedule(after: .zero) { [weak self] in
            guard let self, self.relayWaits, self.outputRoom > 0 else { return }
            self.relayWaits = false
            self.leader?.sharedAnswerResumes()
        }
    }

    func endReply() {
        shareHead()
        ended = true
        for member in Array(readers.keys) { pump(member) }
        account()
        finishGroupIfDone()
    }

    /// The leader's try broke off mid-answer (or drain ran out): every member is cut.
    func abort() {
        ended = true
        for (member, reader) in readers {
            buffer.remove(member)
            if let reader { reader.sharedAnswerEnded(complete: false) } else if !leaderClientGone { leaderClient.abort() }
        }
        readers = [:]
        account()
        finishGroupIfDone()
    }

    /// Sends `member` what it has room for; ends it when it has it all.
    private func pump(_ member: Int) {
        guard let reader = readers[member] else { return }
        let client: any ExchangeClient = reader?.request ?? leaderClient
        while true {
            let room = client.outputRoom
            let piece = buffer.next(for: member, max: max(room, 0))
            if piece.isEmpty {
                if room <= 0, buffer.behind(member) ?? 0 > 0 {
                    // Full: told when it drains (`drained`).
                    client.send(UnsafeRawBufferPointer(start: nil, count: 0), notifyWhenDrained: true)
                }
                break
            }
            piece.withUnsafeBytes { client.send($0, notifyWhenDrained: piece.count >= room) }
            buffer.advance(member, by: piece.count, trimming: false)
            if let reader { reader.sharedBytes(piece.count) }
        }
        guard ended, buffer.behind(member) == 0 else { return }
        // It has it all: the end, with the trailers.
        readers[member] = nil
        buffer.remove(member, trimming: false)
        if let reader {
            trailers.forEachField { reader.request.addResponseTrailer(name: $0, value: $1) }
            reader.sharedAnswerEnded(complete: true)
        } else if !leaderClientGone {
            leaderClient.endReply()
        }
    }

    /// Members more than the bound behind the fastest are cut.
    private func cutLaggards() {
        for member in buffer.lagging {
            guard let reader = readers.removeValue(forKey: member) else { continue }
            buffer.remove(member, trimming: false)
            group.table.metrics.coalesceCut(route: group.route.label)
            if let reader {
                reader.sharedAnswerEnded(complete: false)
            } else if !leaderClientGone {
                // The leader's own client, cut as a laggard: gone, as if it had left.
                leaderClientGone = true
                leaderClient.abort()
            }
        }
    }

    /// A member's client drained: it reads on, and the upstream goes on if it waited.
    func drained(_ member: Int) {
        pump(member)
        account()
        finishGroupIfDone()
        guard relayWaits, outputRoom > 0 else { return }
        relayWaits = false
        leader?.sharedAnswerResumes()
    }

    /// A member left mid-answer (its client hung up, drain): what only it needed is let go.
    func remove(_ member: Int) {
        guard readers.removeValue(forKey: member) != nil else { return }
        buffer.remove(member, trimming: false)
        account()
        finishGroupIfDone()
        if readers.isEmpty, leaderClientGone, !ended, let leader {
            // Nobody reads any more: the try is the leader's client's alone, and it left.
            return leader.sharedAnswerUnread()
        }
        if relayWaits, outputRoom > 0 {
            relayWaits = false
            leader?.sharedAnswerResumes()
        }
    }

    /// The leader goes on without sharing (its head was not shared yet: it
    /// tries again, or fails): its own client only, as before.
    func detach() {
        leader = nil
        ended = true
        readers = [:]
    }

    /// The leader's client hung up mid-answer. True: others still read,
    /// and the try goes on for them.
    func leaderLeft() -> Bool {
        guard !leaderClientGone else { return !readers.isEmpty }
        leaderClientGone = true
        // Its request is let go (and with it the request's hold on the leader's exchange).
        leaderClient.abort()
        remove(0)
        return !readers.isEmpty
    }

    /// The leader's exchange ended (its try is over).
    func leaderFinished() {
        if !ended { abort() }
        finishGroupIfDone()
    }

    /// The `coalesced` pool follows what the buffer keeps (counted once,
    /// whatever the number of members behind).
    private func account() {
        buffer.trim()
        let kept = buffer.kept
        group.table.memory.add(kept - counted)
        counted = kept
    }

    private func finishGroupIfDone() {
        // Before its head was shared, the group's end is its leader's to decide (Exchange+Coalesce).
        guard headShared, ended, readers.isEmpty, group.machine.state != .ended else { return }
        group.machine.finished()
        if group.machine.size > 1 { group.table.metrics.coalesceGroupEnded(route: group.route.label, size: group.machine.size) }
        group.members = [:]
        group.leading = nil
        leader = nil
    }
}
