import HappyPathCore
import HappyPathPolicies
import Testing

/// What happens to a stored request after a delivery round.
@Suite("Delivery policy")
struct DeliveryPolicyTests {
    let limits = DeliveryPolicy.Limits(
        maxAttempts: 5, expiresAt: 1_000_000, backoffBase: .seconds(1), backoffMax: .seconds(60))

    func decide(_ status: Int, upstream: Bool = true, attempts: Int = 1, now: Int64 = 0, random: Double = 0.5)
        -> DeliveryPolicy.Decision
    {
        DeliveryPolicy.decide(
            status: status, answeredByUpstream: upstream, attempts: attempts, limits: limits, now: now, random: random)
    }

    @Test(arguments: [200, 201, 202, 204, 301, 304])
    func successAndRedirectsAreDelivered(status: Int) {
        #expect(decide(status) == .delivered)
    }

    @Test(arguments: [400, 404, 405, 410, 413, 415, 422])
    func aClientErrorFromTheUpstreamIsDeadAtOnce(status: Int) {
        #expect(decide(status) == .dead(.refused))
    }

    @Test(arguments: [401, 403, 408, 409, 425, 429])
    func clientErrorsThatMayChangeAreTriedAgain(status: Int) {
        guard case .retry = decide(status) else {
            Issue.record("\(status) should be tried again")
            return
        }
    }

    @Test func theProxysOwnProblemsAreTriedAgain() {
        // 503 UPSTREAM_UNREACHABLE, 504 UPSTREAM_TIMEOUT, even a 4xx the proxy wrote (AUTH_FAILED is 401).
        for status in [502, 503, 504, 400] {
            guard case .retry = decide(status, upstream: false) else {
                Issue.record("\(status) from the proxy should be tried again")
                continue
            }
        }
    }

    @Test func backoffDoublesUpToItsCapWithJitterInTheUpperHalf() {
        let base = Duration.seconds(1)
        let max = Duration.seconds(60)
        #expect(DeliveryPolicy.backoff(attempt: 1, base: base, max: max, random: 0) == 500)
        #expect(DeliveryPolicy.backoff(attempt: 1, base: base, max: max, random: 1) == 1000)
        #expect(DeliveryPolicy.backoff(attempt: 2, base: base, max: max, random: 1) == 2000)
        #expect(DeliveryPolicy.backoff(attempt: 4, base: base, max: max, random: 0.5) == 6000)
        #expect(DeliveryPolicy.backoff(attempt: 7, base: base, max: max, random: 1) == 60000)
        #expect(DeliveryPolicy.backoff(attempt: 500, base: base, max: max, random: 1) == 60000)
    }

    @Test func theNextRoundIsAfterTheBackoff() {
        #expect(decide(503, attempts: 2, now: 10_000, random: 1) == .retry(atMilliseconds: 12_000))
    }

    @Test func lastAttemptIsDead() {
        #expect(decide(503, attempts: 5) == .dead(.maxAttempts))
        // A success on the last round still counts.
        #expect(decide(200, attempts: 5) == .delivered)
    }

    @Test func aNextRoundPastMaxAgeIsDead() {
        #expect(decide(503, attempts: 1, now: 999_900, random: 1) == .dead(.maxAge))
    }
}
