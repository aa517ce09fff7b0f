import HappyPathCore
import HappyPathIO
import HappyPathPolicies

/// One exchange's hedge state (routes with `hedge:`): the tries in flight
/// beside the exchange's own, the ones that lost and wait to be reaped,
/// when the next hedge is due and the limit of the try in flight, which
/// share the exchange's one timer. A value held inside the `Exchange`: a
/// route without `hedge` pays for no allocation (the arrays stay empty).
///
/// It only keeps the books; the exchange (`Exchange+Hedging.swift`) starts,
/// detaches and cancels the transfers, and `ExchangeStateMachine` decides
/// whether a hedge goes (`hedgeDue`).
struct HedgeCoordinator {
    /// A try that lost, detached inside a libcurl callback (where libcurl
    /// refuses to remove a transfer): cancelled, its slot freed and its
    /// failure counted on the next loop pass (`Exchange.reap`).
    struct Loser {
        var transfer: any UpstreamTry
        var holdsSlot: Bool
        var endpointIndex: Int
        /// Its failure, for the breaker and metrics (nil: it was only cancelled).
        var outcome: Outcome?
    }

    /// Tries in flight beside the exchange's try, none of them heard from yet.
    private(set) var hedges: [HedgeTry] = []
    private(set) var losers: [Loser] = []
    /// When the next hedge is due (nil: none). The exchange's one timer is
    /// armed for it or the try's limit, whichever comes first: a hedge
    /// that is never due costs no timer of its own.
    var dueAt: Instant?
    /// The try in flight's limit (per_try_timeout or the deadline).
    private(set) var tryLimitAt = Instant(nanoseconds: 0)
    /// When the try in flight went out.
    private(set) var tryStartedAt = Instant(nanoseconds: 0)
    /// The endpoint of the latest try or hedge sent (a hedge prefers the next one).
    var lastEndpoint = -1
    /// The loop pass that reaps the losers (taken on the first loss).
    var reapEvent: LoopEvent?

    /// Nothing in flight beside the try and nothing left to reap.
    var isIdle: Bool { hedges.isEmpty && losers.isEmpty }

    /// When the exchange's one timer fires next while a try is in flight:
    /// at the next hedge if one is due before the try's limit, else at the limit.
    var timerAt: Instant { dueAt.map { min($0, tryLimitAt) } ?? tryLimitAt }

    /// The exchange's own try went out at `now` with `limit`; the first
    /// hedge beside it is due at `hedgeDueAt` (nil: none).
    mutating func trySent(at now: Instant, limit: Duration, hedgeDueAt: Instant?) {
        tryStartedAt = now
        tryLimitAt = now + limit
        dueAt = hedgeDueAt
    }

    /// What the one timer firing at `now` while trying means.
    struct Fired: Equatable {
        /// A hedge was due (it is no longer: the next is set when one is sent).
        var hedgeDue: Bool
        /// The try's limit passed: the machine hears of the timer; else it
        /// is armed again (`timerAt`) and the machine hears nothing.
        var limitReached: Bool
    }

    mutating func timerFired(at now: Instant) -> Fired {
        var hedgeDue = false
        if let due = dueAt, now >= due {
            dueAt = nil
            hedgeDue = true
        }
        return Fired(hedgeDue: hedgeDue, limitReached: now >= tryLimitAt)
    }

    mutating func add(_ hedge: HedgeTry) { hedges.append(hedge) }

    /// Takes `hedge` out of those in flight; false: it is not one of them
    /// (it already won or lost).
    mutating func remove(_ hedge: HedgeTry) -> Bool {
        guard let i = hedges.firstIndex(where: { $0 === hedge }) else { return false }
        hedges.remove(at: i)
        return true
    }

    /// Every hedge in flight, taken out (to lose them).
    mutating func removeAll() -> [HedgeTry] {
        let all = hedges
        hedges.removeAll()
        return all
    }

    /// The oldest hedge in flight, taken out to be adopted (the try it hedged failed).
    mutating func removeFirst() -> HedgeTry? { hedges.isEmpty ? nil : hedges.removeFirst() }

    /// `hedge` goes on as the exchange's try, under its own limit.
    mutating func adopt(_ hedge: HedgeTry) {
        hedge.adopted = true
        tryStartedAt = hedge.startedAt
        tryLimitAt = hedge.limitAt
    }

    mutating func lost(_ loser: Loser) { losers.append(loser) }

    /// The losers, taken out to be reaped.
    mutating func removeLosers() -> [Loser] {
        let gone = losers
        losers.removeAll()
        return gone
    }
}

/// A hedge: a try sent beside the exchange's try in flight. It reports its
/// status or its failure to the exchange, which decides; once adopted (it
/// won, or the try beside it failed) it is the exchange's try like any
/// other and passes everything through.
final class HedgeTry: UpstreamResponseHandler {
    /// Alive: the exchange holds its hedges (`hedging`) and, before it ends (`releaseAll`, `abandon`),
    /// detaches or cancels every hedge's transfer, which then never calls this handler again.
    unowned let exchange: Exchange
    var transfer: (any UpstreamTry)!
    let endpointIndex: Int
    let token: Token?
    let startedAt: Instant
    /// Its own limit (per_try_timeout or the deadline), kept if it is adopted.
    let limitAt: Instant
    var adopted = false

    init(exchange: Exchange, endpointIndex: Int, token: Token?, startedAt: Instant, limitAt: Instant) {
        self.exchange = exchange
        self.endpointIndex = endpointIndex
        self.token = token
        self.startedAt = startedAt
        self.limitAt = limitAt
    }

    func upstreamStatus(_ status: Int, reason: UnsafeRawBufferPointer) {
        if adopted { return exchange.upstreamStatus(status, reason: reason) }
        exchange.hedgeHead(self, status: status, reason: reason)
    }

    func upstreamHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        if adopted { exchange.upstreamHeader(name: name, value: value) }
    }

    func upstreamInformational(_ status: Int, fields: UnsafeRawBufferPointer) {
        if adopted { exchange.upstreamInformational(status, fields: fields) }
    }

    func upstreamHeadersComplete() -> String? { adopted ? exchange.upstreamHeadersComplete() : nil }

    func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool { adopted ? exchange.upstreamBody(bytes) : true }

    func upstreamTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        if adopted { exchange.upstreamTrailer(name: name, value: value) }
    }

    func upstreamFinished(_ failure: UpstreamFailure?) {
        if adopted { return exchange.upstreamFinished(failure) }
        exchange.hedgeFinished(self, failure)
    }
}
