import HappyPathCore

/// Problems the store itself writes: a delivery past its `max_age`.
enum DeliveryProblems {
    /// No round ever ended (its upstream stayed unreachable or its circuit open).
    static let expiredUnsent = Problem(
        .upstreamUnreachable, requestID: "",
        detail: "Not delivered within its delivery.max_age: no delivery round was started "
            + "(the upstream stayed unreachable or its circuit breaker open)."
    ).json()
    /// Put before the last round's own detail.
    static let expiredPrefix = "Not delivered within its delivery.max_age. The last round: "
    /// The same, as it is written inside a JSON string (it holds nothing to escape).
    static let expiredPrefixJSON = String(JSON.quote(expiredPrefix).dropFirst().dropLast())
    /// Set aside: a round of it was in flight at two deaths of the proxy in a row.
    static let crashedTheProxy = Problem(
        .badGateway, requestID: "",
        detail: "Set aside: it crashed the proxy. A round of this delivery was in flight when the proxy stopped "
            + "without warning (kill -9, a crash, a replica lost with its lease) at two starts in a row, so it is "
            + "not sent a third time by itself. Look for the cause in the proxy's log before those starts, then "
            + "replay it."
    ).json()
}
