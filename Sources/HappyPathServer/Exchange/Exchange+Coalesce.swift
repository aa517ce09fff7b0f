import HappyPathCore
import HappyPathIO
import HappyPathPolicies

// MARK: - Coalescing (`coalesce:`, docs/coalescing.md)

/// A request on a coalescing route joins its key's group at its start:
/// the first leads (an exchange like any other), the others follow its try
/// (`ExchangeStateMachine+Following`) and get its answer through
/// `CoalescedAnswer`, or its failure answered as their own, or lead a new
/// try when the leader ended for reasons of its own.
extension Exchange {
    /// Joins the key's group (false: this request sends its own try, as
    /// leader or alone).
    func joinGroup() -> Bool {
        guard let table = env.coalescing else { return false }
        guard let key = coalesceKey() else {
            env.metrics.coalesceAlone(route: route.label, .ineligible)
            return false
        }
        let now = env.clock.now()
        switch table.join(self, key: key, deadline: machine.settings.deadline, now: now) {
        case let .lead(group):
            coalesce = CoalesceMembership(group: group, member: 0)
            return false
        case let .alone(reason):
            env.metrics.coalesceAlone(route: route.label, reason)
            return false
        case let .follow(group, member):
            coalesce = CoalesceMembership(group: group, member: member)
            _ = machine.start()
            perform(machine.follow(at: now))
            return true
        }
    }

    /// The request's key, or nil when it may not coalesce: not a plain
    /// read (a body, `Range`, `no-cache`, an upgrade, gRPC).
    func coalesceKey() -> String? {
        guard let staleKey = route.coalesceKey, upgrade == nil, delivery == nil, bodyStream == nil, command.body.count == 0,
            !isGRPC, let request = request as? HTTPRequest
        else { return nil }
        var reader = CoalesceRules.RequestReader(key: staleKey, salt: Coalescing.salt)
        request.forEachRawHeader { reader.field(name: $0, value: $1) }
        return reader.key(
            method: command.method, route: route.coalesceTag, upstream: upstream.name, target: command.target,
            scheme: request.arrivedOverTLS ? "https" : "http", pacingKey: guardian.pausesClients ? pacingKey : nil)
    }

    /// The leader's answer is about to stream (`relayStatus`): with
    /// followers, it streams to them too; alone, the group closes and the
    /// answer goes as any other.
    func coalesceStreams() {
        guard var membership = coalesce, membership.leads, membership.answer == nil else { return }
        let group = membership.group
        guard group.hasFollowers else {
            // Alone: nothing to observe (group sizes are of groups with followers).
            group.table.close(group)
            group.machine.finished()
            coalesce = nil
            return
        }
        let answer = CoalescedAnswer(group: group, leader: self)
        membership.answer = answer
        coalesce = membership
        sharesAnswer = true
    }

    /// The machine answered `failure` (`.answer`): a follower leaves its
    /// group; a leader's failure is shared or hands the group over.
    func coalesceAnswered(_ failure: ExchangeStateMachine.Failure) {
        guard let membership = coalesce else { return }
        coalesce = nil
        let group = membership.group
        guard membership.leads else {
            return group.leave(membership.member)
        }
        if let answer = membership.answer {
            // An answer began streaming to this leader's client, then its try
            // failed before the first byte and the next ended here.
            sharesAnswer = false
            if answer.headShared {
                answer.abort()
                return answer.detach()
            }
            answer.detach()
        }
        let now = env.clock.now()
        // The one timer was armed for the time left: it may fire a little early.
        let after = CoalesceRules.afterLeader(failure, deadlinePassed: machine.remaining(at: now) < .milliseconds(20))
        leaderEnded(group, after, failure: failure, now: now)
    }

    /// The machine finished (`.finish`): a follower leaves its group or
    /// the answer it reads; a leader whose client left before its answer
    /// hands the group over.
    func coalesceFinished(_ ending: ExchangeStateMachine.Ending) {
        guard let membership = coalesce else { return }
        if let answer = membership.answer {
            // A leader stays a member until its own client has read the
            // answer: its drains still reach the answer.
            guard membership.leads else {
                coalesce = nil
                return answer.remove(membership.member)
            }
            if answer.headShared { return answer.leaderFinished() }
            // Its client left (or drain) before any byte of the answer: the
            // followers have nothing yet, and are handed over below.
            sharesAnswer = false
            answer.detach()
        }
        coalesce = nil
        let group = membership.group
        guard membership.leads else { return group.leave(membership.member) }
        let now = env.clock.now()
        switch ending {
        case .drained:
            leaderEnded(group, .share, failure: .shuttingDown, now: now)
        case .clientClosed, .truncated, .completed:
            leaderEnded(group, .handOver, failure: .timeout, now: now)
        }
    }

    private func leaderEnded(
        _ group: CoalesceGroup, _ after: CoalesceRules.AfterLeader, failure: ExchangeStateMachine.Failure, now: Instant
    ) {
        group.leading = nil
        let verdict = group.machine.leaderEnded(after, at: now)
        func take(_ member: Int) -> Exchange? {
            guard let follower = group.members.removeValue(forKey: member) else { return nil }
            follower.coalesce = nil
            return follower
        }
        switch verdict {
        case let .answerAll(members):
            // The upstream's own answer, held: its fields say whether it is
            // everyone's (Set-Cookie, no-store, Vary), as a streamed head's do
            // (judged while the group still has its key, for the no-store memory).
            var sharing = CoalesceGroup.Sharing(keeps: { _ in true }, reason: nil, vary: [])
            if case .upstreamAnswer = failure {
                let fields = KeptFields(relay.heldEndToEndFields)
                sharing = group.sharing(
                    CoalesceRules.head(fields: fields, contentLength: nil, largeAbove: .max), leader: self, now: now)
            }
            group.table.close(group)
            let kept = members.filter(sharing.keeps)
            group.release(members.filter { !sharing.keeps($0) }, sharing, now: now)
            env.metrics.coalesced(route: route.label, kept.count)
            if !kept.isEmpty { env.metrics.coalesceGroupEnded(route: route.label, size: kept.count + 1) }
            for member in kept { take(member)?.answerLeadersFailure(failure, leader: self) }
        case let .expireAll(members):
            group.table.close(group)
            for member in members { take(member)?.followerFailed(.timeout) }
        case let .promote(leader, expired):
            for member in expired { take(member)?.followerFailed(.timeout) }
            env.metrics.coalesceHandover(route: route.label)
            if let next = group.members.removeValue(forKey: leader) {
                group.leading = next
                next.coalesce = CoalesceMembership(group: group, member: leader)
                next.leadAfterFollowing(now: now)
            }
        case .ended:
            group.table.close(group)
        }
    }

    // MARK: - A follower

    /// The leader ended before its answer: this follower leads a new try.
    /// On the loop's next pass: this may come from inside the leader's
    /// libcurl callback, where no transfer may start.
    func leadAfterFollowing(now: Instant) {
        env.loop.schedule(after: .zero) { [self] in
            guard machine.state == .following else { return }
            let now = env.clock.now()
            guardian.recordRequest(at: now)
            perform(machine.promoted(at: now))
        }
    }

    /// The leader's failure is this follower's too: answered as its own
    /// (its request id, its rate-limit fields, its fallback).
    func answerLeadersFailure(_ failure: ExchangeStateMachine.Failure, leader: Exchange) {
        guard case let .answer(failure, _) = machine.sharedFailure(failure) else { return }
        followed(leader)
        if case let .upstreamAnswer(status) = failure { result.upstreamAnswered = status }
        releaseAll()
        answer(failure, from: leader)
    }

    func followerFailed(_ failure: ExchangeStateMachine.Failure) { perform(machine.sharedFailure(failure)) }

    /// The leader's answer is this follower's: its head goes out now.
    func followerShares(_ answer: CoalescedAnswer, member: Int, leader: Exchange) {
        guard machine.state == .following else { return }
        let attempts = leader.command.attempt
        followed(leader)
        coalesce?.answer = answer
        env.metrics.coalesced(route: route.label, 1)
        perform(machine.shared(status: answer.status))
        request.clearResponseHeaders()
        answer.fields.forEachField { request.addResponseHeader(name: $0, value: $1) }
        request.addResponseHeader("X-Request-Id", command.requestID)
        request.addResponseHeader("X-Happypath-Attempts", String(attempts))
        rateLimitFields?.stage(on: request)
        request.startReply(status: answer.status, contentLength: answer.contentLength, reason: answer.reason)
        request.permitReadAhead()
    }

    /// This follower's answer came from `leader`'s try: its log line and
    /// span say so (the span linked to the leader's, when that is traced).
    private func followed(_ leader: Exchange) {
        result.coalescedWith = leader.command.requestID
        leader.result.followers += 1
        if trace != nil {
            trace?.coalesced = true
            if let context = leader.trace?.context { trace?.links.append(context) }
        }
        if leader.trace != nil { leader.trace?.followers += 1 }
    }

    /// Body bytes this follower's client got (for the access log).
    func sharedBytes(_ count: Int) { relay.answered(bytes: relay.bytesOut + count) }

    /// The shared answer is over for this follower.
    func sharedAnswerEnded(complete: Bool) {
        perform(machine.sharedEnded(complete: complete))
    }

    /// A member drained and the shared answer has room again: the leader's try goes on.
    func sharedAnswerResumes() {
        relay.drained()
        transfer?.resume()
    }

    /// Every member of the shared answer left, the leader's client first:
    /// nobody reads it, and the try ends as a client's that hung up.
    func sharedAnswerUnread() {
        env.loop.schedule(after: .zero) { [self] in perform(machine.clientGone()) }
    }

    /// A request field's values, every line of it joined as one list (a
    /// `Vary` comparison: the same values in the same order).
    func requestValues(_ lowercasedName: String) -> String? {
        var out: [UInt8]?
        let name = Array(lowercasedName.utf8)
        request.forEachRawHeader { n, v in
            guard n.count == name.count, zip(n, name).allSatisfy({ HTTPBytes.lower($0) == $1 }) else { return }
            if out == nil { out = [] } else { out!.append(contentsOf: ", ".utf8) }
            out!.append(contentsOf: v)
        }
        return out.map { String(decoding: $0, as: UTF8.self) }
    }
}
