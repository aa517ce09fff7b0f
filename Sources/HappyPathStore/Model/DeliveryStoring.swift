/// What the proxy asks of a delivery store (docs/deliver-later.md): the
/// interface `Deliveries` holds, so that a store is a choice of
/// configuration. `DeliveryStore` (one SQLite file) implements it today;
/// the shared PostgreSQL store is being built against the same interface
/// (`PostgresConnection`, `PostgresSchema`).
///
/// Every operation is asynchronous: the store runs it on threads of its
/// own and calls `reply` there (never on the caller's event loop, which
/// never waits for the store). Writes come back after they are durable.
public protocol DeliveryStoring: AnyObject, Sendable {
    /// Deliveries put back from `in_flight` to `queued` when the store opened.
    var recovered: Int { get }
    /// Why the store cannot write now (nil: the last write succeeded).
    var unavailable: StoreError? { get }
    /// Writes can go in now: nothing failed, and (a database) it is connected.
    var writable: Bool { get }
    /// Payload bytes of deliveries not yet delivered, as of the last commit.
    var heldBytes: Int { get }
    /// Rows by upstream and state, as of the last commit.
    var counts: DeliveryCounts { get }
    /// `storage.max_bytes`: payload bytes held at most.
    var maxBytes: Int { get }

    /// `handler` hears when writes start failing and when they work again. Before `start`.
    func observe(_ handler: @escaping @Sendable (StoreHealth) -> Void)
    func start()
    /// Commits what is waiting and stops the store's threads. Safe to call more than once.
    func close()

    func submit(_ delivery: NewDelivery, reply: @escaping @Sendable (SubmitResult) -> Void)
    /// Up to `limit` due deliveries, none of `skipping`'s upstreams; first
    /// marks dead the queued ones past their `max_age`. `setAside` has those
    /// and the deliveries the store set aside since the last claim (their
    /// rounds crashed the proxy twice in a row).
    func claim(
        limit: Int, skipping: [String],
        reply: @escaping @Sendable (_ claimed: [ClaimedDelivery], _ setAside: [SetAside]) -> Void)
    func finish(id: String, _ outcome: DeliveryOutcome, reply: (@Sendable () -> Void)?)
    func replay(id: String, expiresAt: Int64, reply: @escaping @Sendable (ReplayResult) -> Void)
    func purge(reply: @escaping @Sendable (Int) -> Void)
    /// Queued deliveries of `upstream` become due now (it recovered).
    func wake(upstream: String)

    func record(id: String, reply: @escaping @Sendable (Result<DeliveryRecord?, StoreError>) -> Void)
    func list(
        state: DeliveryState?, upstream: String?, after: Int64?, limit: Int,
        reply: @escaping @Sendable (Result<[DeliveryRecord], StoreError>) -> Void)
    func stats(reply: @escaping @Sendable (StoreStats) -> Void)
}

extension DeliveryStoring {
    public var writable: Bool { unavailable == nil }
}

extension DeliveryStore: DeliveryStoring {
    public var maxBytes: Int { settings.maxBytes }
}
