import HappyPathCore

/// The machine's vocabulary: why a request waits, its states, what it
/// needs from the route, how a try ends, why a request fails, how it ends,
/// and the actions the driver performs.
extension ExchangeStateMachine {
    public enum ParkReason: String, CaseIterable, Sendable {
        /// The upstream cannot be reached (connect failures, health checks).
        case unreachable
        /// The breaker is open and the upstream's `while_open` is `park`.
        case circuitOpen = "circuit_open"
        /// No usable token: waiting for the refresh.
        case auth
        /// The upstream paused itself (`pacing`: a 429 or 503 with
        /// `Retry-After`): waiting for the pause to end, within the deadline.
        case paused
    }

    public enum State: Sendable, Equatable {
        /// Deciding whether the next try may go (see `Admission`).
        case admitting
        /// Waiting in the upstream's queue for a connection slot, up to the deadline.
        case queued
        /// A try is in flight; nothing went to the client yet.
        case trying
        /// A retry is due: waiting for the retry budget's answer
        /// (`retryBudget(granted:)`: `backingOff`, or the problem).
        case awaitingRetryBudget
        /// Waiting out the backoff before the next try.
        case backingOff
        /// Waiting for the upstream to recover, until `until` (park_for or the deadline).
        case parked(ParkReason, until: Instant)
        /// The response head went to the client; the body follows as it comes.
        case streaming
        /// Waiting for another request's try to answer both (`coalesce:`,
        /// ExchangeStateMachine+Following): holds nothing, up to its own deadline.
        case following
        /// Answered (or given up on); every later event is ignored.
        case finished
    }

    /// What the machine needs from the route, its upstream and the request.
    public struct Settings: Sendable {
        /// The request's deadline (the route's `timeout` from arrival).
        public var deadline: Instant
        public var retry: RetryPolicy
        /// `reachability.park_for`.
        public var parkFor: Duration
        /// `while_open: park` (and `park_for` above zero).
        public var parkWhileOpen: Bool
        /// Endpoints of the upstream: an unreachable one is followed by another at once.
        public var endpoints: Int
        public var method: String
        /// The request carries an `Idempotency-Key` with a value (an empty
        /// one is not a key: `IdempotencyKey.isKey`).
        public var hasIdempotencyKey: Bool
        /// The statuses that mean the upstream refused the injected token
        /// (`auth.refresh_on`); empty when the proxy injects none.
        public var refreshOn: Set<Int>
        /// `hedge.max_extra`: tries that may be in flight beside the first
        /// (0: no hedging). Only for a request the retry rules may repeat.
        public var hedgeMaxExtra: Int

        public init(
            deadline: Instant, retry: RetryPolicy, parkFor: Duration, parkWhileOpen: Bool, endpoints: Int, method: String,
            hasIdempotencyKey: Bool, refreshOn: Set<Int>, hedgeMaxExtra: Int = 0
        ) {
            self.deadline = deadline
            self.retry = retry
            self.parkFor = parkFor
            self.parkWhileOpen = parkWhileOpen && parkFor > .zero
            self.endpoints = endpoints
            self.method = method
            self.hasIdempotencyKey = hasIdempotencyKey
            self.refreshOn = refreshOn
            // Only asked of hedging routes; a scan (the list is short) instead of a hash.
            self.hedgeMaxExtra =
                hedgeMaxExtra > 0 && (hasIdempotencyKey || retry.configuration.methods.contains { $0 == method })
                ? hedgeMaxExtra : 0
        }

        /// The same, from the request's `Idempotency-Key` value as sent (nil:
        /// none): only a value with something in it makes the request a keyed one.
        public init(
            deadline: Instant, retry: RetryPolicy, parkFor: Duration, parkWhileOpen: Bool, endpoints: Int, method: String,
            idempotencyKey: String?, refreshOn: Set<Int>, hedgeMaxExtra: Int = 0
        ) {
            self.init(
                deadline: deadline, retry: retry, parkFor: parkFor, parkWhileOpen: parkWhileOpen, endpoints: endpoints,
                method: method, hasIdempotencyKey: IdempotencyKey.isKey(idempotencyKey), refreshOn: refreshOn,
                hedgeMaxExtra: hedgeMaxExtra)
        }
    }

    /// Why a try produced no response.
    public struct TryFailure: Sendable, Equatable {
        public enum Kind: Sendable, Equatable {
            /// No connection (refused, unresolvable, connect timeout): the request never left.
            case unreachable
            /// No response head within the try's limit.
            case timeout
            /// The connection dropped before a whole response.
            case reset
            /// The answer was not valid HTTP (the proxy refuses to relay it).
            case invalidResponse
            /// The TLS connection to the upstream failed (its certificate not
            /// verified, no common protocol): not transient, never retried.
            case tls
        }

        public var kind: Kind
        /// For `detail`: what libcurl or the response checks said.
        public var message: String

        public init(_ kind: Kind, _ message: String) {
            self.kind = kind
            self.message = message
        }
    }

    /// How a try ended, as the driver saw it.
    public enum TryEnd: Sendable, Equatable {
        /// A whole response. If it was held back (an error status), the
        /// machine decides what follows; if it streamed, the request is done.
        /// `withToken`: the try carried an injected token.
        case answered(status: Int, retryAfter: Duration?, withToken: Bool)
        /// A gRPC call's Trailers-Only answer (HTTP `status`, nothing relayed)
        /// with a `grpc-status` that `retry.on` names: held, and retried like
        /// a failure; if the retry rules give up, it is the answer.
        case grpcAnswered(status: Int, grpcStatus: GRPCStatus, retryAfter: Duration?)
        case failed(TryFailure)
    }

    /// Why the client gets a problem instead of the upstream's answer.
    public enum Failure: Sendable, Equatable {
        /// The deadline passed (before a try, in the queue, or with the try in flight).
        case timeout
        /// `max_connections` busy and the queue full (`byParking`: `max_parked` reached).
        case overloaded(byParking: Bool)
        /// The breaker is open and `while_open` is `fail`.
        case circuitOpen(retryAfter: Duration)
        /// Parked for `reason` until `park_for` or the deadline (`byDeadline`) ran out, after `waited`.
        case parkExpired(ParkReason, waited: Duration, byDeadline: Bool)
        /// Every endpoint unreachable and no parking.
        case unreachable
        /// The upstream's own error answer (a 4xx, or the last 5xx): mapped, not replaced.
        case upstreamAnswer(status: Int)
        /// The upstream's answer was not valid HTTP.
        case badGateway(message: String)
        /// The TLS connection to the upstream failed; not retried.
        case upstreamTLS(message: String)
        /// Tries failed (resets) and the retry rules gave up.
        case unavailable
        /// The upstream refused a token that had just been refreshed.
        case tokenRefusedAfterRefresh(status: Int)
        /// The token refresh this request waited for failed.
        case tokenRefreshFailed(reason: String)
        /// Drain ran out of time before this request was answered.
        case shuttingDown
        /// The upstream is paused and `while_paused` is `fail`.
        case paused
        /// The client's streamed body passed `limits.max_request_body` while a try sent it.
        case requestBodyTooLarge
        /// Shed from the upstream's queue (adaptive concurrency): it waited
        /// past the queue's target while the queue stood, or a request that
        /// matters more took its place in a full queue.
        case shed(RequestPriority)
    }

    public enum Ending: Sendable, Equatable {
        /// The upstream's response was relayed whole.
        case completed
        /// The upstream failed mid-response: the client's connection is cut.
        case truncated
        /// The client hung up first.
        case clientClosed
        /// Drain ran out of time mid-response: the client's connection is cut.
        case drained
    }

    public enum Action: Sendable, Equatable {
        /// Run `Admission.decide` and hand the verdict to `admitted(_:at:)`.
        case admit
        /// Send try number `attempt`; arm the timer for `limit` (per_try_timeout, or the deadline if sooner).
        case send(attempt: Int, limit: Duration)
        /// The timer for `limit`: how long to wait in the queue for a slot.
        case waitForSlot(limit: Duration)
        /// The retry rules would try again: withdraw one retry from the
        /// upstream's budget and report `retryBudget(granted:)`.
        case withdrawRetry
        /// The timer for the backoff before the next try.
        case backOff(Duration)
        /// Park the request, then report `parkAccepted()` (later `replay`)
        /// or `parkRefused()`; arm the timer for `limit`;
        /// `probeAfter`: let the breaker's probe go after this long.
        case park(ParkReason, limit: Duration, probeAfter: Duration?)
        /// The try's limit passed: cancel it, then report `tryEnded(.failed(timeout))`.
        case cancelTry
        /// The upstream refused the token: ask the token source, then either
        /// `.admit` (a fresher token exists) or `admitted(.park(.auth))`.
        case tokenRefused
        /// The response head went to the client: disarm the timer (a
        /// streaming body is bounded by stalls, not the deadline).
        case stream
        /// Follow the try of the group's leader (`coalesce:`); arm the timer
        /// for `limit`, the request's own deadline.
        case follow(limit: Duration)
        /// Answer with this problem, release everything held, finish.
        /// `abandonProbe`: the breaker's probe place was taken and no try ran.
        case answer(Failure, abandonProbe: Bool)
        /// Release everything held and finish as `Ending` says.
        case finish(Ending, abandonProbe: Bool)
        /// A slot came that nobody here waits for (`slotGranted` after the
        /// request left the queue): give it back at once.
        case returnSlot
        case none
    }

    /// The upstream's slot on this worker, as the exchange holds it.
    public enum Slot: Sendable, Equatable {
        case none
        /// A place in the upstream's queue (state `queued`).
        case queued
        /// A slot for the try in flight.
        case held
        /// The slot, moved among the upstream's streams (an answer that
        /// streams on an adaptive upstream: `max_streams`).
        case streams
    }

    /// What giving the slot back takes (`releaseSlot`).
    public enum SlotRelease: Sendable, Equatable {
        case none
        /// Leave the upstream's queue.
        case leaveQueue
        /// Give the slot to the next waiter.
        case release
        /// End the stream the slot was moved among.
        case endStream
    }

    /// The adaptive limit's sample of a try: from when it was sent (and
    /// how many tries were in flight then) to when its head came.
    public enum Sample: Sendable, Equatable {
        case none
        /// Sent at `at` with `inFlight` tries in flight; no head yet.
        case sent(at: Instant, inFlight: Int)
        /// Its head came at `to` (read inside libcurl's callback); given to
        /// the limit when the transfer has ended.
        case measured(from: Instant, to: Instant, inFlight: Int)
    }
}
