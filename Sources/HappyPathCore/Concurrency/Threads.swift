#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A thread of its own running `body` (a store's writer or readers, the
/// trace exporter): what `body` captures stays alive until it returns.
/// Join it with `pthread_join`.
public func startThread(_ what: String, _ body: @escaping () -> Void) -> pthread_t {
    let box = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
    var t = pthread_t()
    let rc = pthread_create(
        &t, nil,
        { raw in
            Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue().body()
            return nil
        }, box)
    precondition(rc == 0, "cannot start \(what): pthread_create failed (\(rc))")
    return t
}

private final class ThreadBody {
    let body: () -> Void
    init(_ body: @escaping () -> Void) { self.body = body }
}

/// Initializes `condition` to time its waits on the monotonic clock (a
/// wall-clock step must not end or stretch a wait), for `monotonicDeadline`.
public func initMonotonicCondition(_ condition: UnsafeMutablePointer<pthread_cond_t>) {
    var attributes = pthread_condattr_t()
    pthread_condattr_init(&attributes)
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
    pthread_cond_init(condition, &attributes)
    pthread_condattr_destroy(&attributes)
}

/// The monotonic time `nanoseconds` from now, for `pthread_cond_timedwait`
/// on a condition made by `initMonotonicCondition`.
public func monotonicDeadline(after nanoseconds: Int64) -> timespec {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    let end = Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec) + nanoseconds
    return timespec(tv_sec: Int(end / 1_000_000_000), tv_nsec: Int(end % 1_000_000_000))
}
