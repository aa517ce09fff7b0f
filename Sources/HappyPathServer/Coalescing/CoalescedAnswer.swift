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
    /// The leader's exchange, kept until every member has its answer.
    private(set) var leader: Exchange?
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
    /// The followers have their head: the verdict was taken.
    private var headShared = false
    /// `endReply` came: members end as they reach the end.
    private var ended = false
    /// The relay waits for room (the upstream transfer is paused).
    private var relayWaits = false

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
        _ = fields.append(name: name, value: value)
    }

    static func isMembersOwn(_ name: String) -> Bool {
        let lower = name.lowercased()
        return lower == "x-request-id" || lower == "x-happypath-attempts" || lower == "ratelimit"
            || lower == "ratelimit-policy"
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

    /// The head is final (the first body bytes, or the end): the verdict,
    /// and each follower it serves gets its head.
    private func shareHead() {
        guard !headShared else { return }
        headShared = true
        guard let leader else { return }
        let now = leader.env.clock.now()
        let table = group.table
        let verdict = CoalesceRules.head(fields: fields, contentLength: contentLength, largeAbove: table.largeAbove)
        var vary: [String] = []
        var released: CoalesceRules.AloneReason?
        switch verdict {
        case let .share(varyNames): vary = varyNames
        case let .release(reason): released = reason
        }
        if released == .noStore, let key = group.key { table.rememberNoStore(key, now: now) }
        let leaderValues = vary.map { leader.request.header($0) }
        let (shared, let_go) = group.machine.share { member in
            guard released == nil, let follower = self.group.members[member] else { return false }
            return vary.isEmpty || vary.map({ follower.request.header($0) }) == leaderValues
        }
        table.close(group)
        for member in shared {
            guard let follower = group.members[member] else { continue }
            readers[member] = follower
            buffer.add(member)
            follower.followerShares(self, member: member, attempts: leader.command.attempt)
        }
        // Those it does not serve: each set with the same Vary values leads and follows anew.
        var sets: [[String?]: [Exchange]] = [:]
        var order: [[String?]] = []
        for member in let_go {
            guard let follower = group.members.removeValue(forKey: member) else { continue }
            if let released {
                table.metrics.coalesceAlone(route: group.route.label, released)
                CoalesceGroup.regroup([follower], table: table, route: group.route, now: now)
                continue
            }
            let values = vary.map { follower.request.header($0) }
            if sets[values] == nil { order.append(values) }
            sets[values, default: []].append(follower)
        }
        for values in order { CoalesceGroup.regroup(sets[values] ?? [], table: table, route: group.route, now: now) }
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
        shareHead()
        if !bytes.isEmpty { buffer.append(bytes) }
        for member in Array(readers.keys) { pump(member) }
        cutLaggards()
        if notifyWhenDrained, outputRoom <= 0 { relayWaits = true }
    }

    func endReply() {
        shareHead()
        ended = true
        for member in Array(readers.keys) { pump(member) }
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
            buffer.advance(member, by: piece.count)
            if let reader { reader.sharedBytes(piece.count) }
        }
        guard ended, buffer.behind(member) == 0 else { return }
        // It has it all: the end, with the trailers.
        readers[member] = nil
        buffer.remove(member)
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
            buffer.remove(member)
            group.table.metrics.coalesceCut(route: group.route.label)
            if let reader { reader.sharedAnswerEnded(complete: false) } else if !leaderClientGone { leaderClient.abort() }
        }
    }

    /// A member's client drained: it reads on, and the upstream goes on if it waited.
    func drained(_ member: Int) {
        pump(member)
        finishGroupIfDone()
        guard relayWaits, outputRoom > 0 else { return }
        relayWaits = false
        leader?.sharedAnswerResumes()
    }

    /// A member left mid-answer (its client hung up, drain): what only it needed is let go.
    func remove(_ member: Int) {
        guard readers.removeValue(forKey: member) != nil else { return }
        buffer.remove(member)
        finishGroupIfDone()
        if relayWaits, outputRoom > 0 {
            relayWaits = false
            leader?.sharedAnswerResumes()
        }
    }

    /// The leader's client hung up mid-answer. True: others still read,
    /// and the try goes on for them.
    func leaderLeft() -> Bool {
        leaderClientGone = true
        remove(0)
        return !readers.isEmpty
    }

    /// The leader's exchange ended (its try is over).
    func leaderFinished() {
        if !ended { abort() }
        finishGroupIfDone()
    }

    private func finishGroupIfDone() {
        guard ended, readers.isEmpty, group.machine.state != .ended else { return }
        group.machine.finished()
        group.table.metrics.coalesceGroupEnded(route: group.route.label, size: group.machine.size)
        group.members = [:]
        leader = nil
    }
}
